"""The files an export ships keep their own copy of the alphabet, since an exported folder runs
without this package: ``bytestream/stream_tokenizer.py`` (the student's tokenizer) and
``students/models/patched_model.py`` (the patched student's modeling file). Each copy must say
what ``bytestream/alphabet.py`` says."""

from __future__ import annotations

import pytest

from bytestream import alphabet, stream_tokenizer
from bytestream.stream_kind import StreamKind
from students.models import patched_model

COPIES = [
    (
        stream_tokenizer,
        {
            **{name: name for name in ("NUM_BYTES", "EOT", "BOS", "EOS", "PAD")},
            **{name: name for name in ("FUSED_ENDS", "FUSED_BOS", "FUSED_EOS", "FUSED_PAD", "FUSED_ALPHABET_SIZE")},
        },
    ),
    (
        patched_model,
        {
            "NUM_SYMBOLS": "ALPHABET_SIZE",
            "EOT": "EOT",
            "BOS": "BOS",
            "EOS": "EOS",
            "PAD": "PAD",
            "FUSED_NUM_SYMBOLS": "FUSED_ALPHABET_SIZE",
            "FUSED_ENDS": "FUSED_ENDS",
            "FUSED_BOS": "FUSED_BOS",
            "FUSED_EOS": "FUSED_EOS",
            "FUSED_PAD": "FUSED_PAD",
        },
    ),
]


@pytest.mark.parametrize(("module", "names"), COPIES, ids=lambda c: getattr(c, "__name__", ""))
def test_each_shipped_copy_equals_the_alphabet(module, names):
    for copy_name, alphabet_name in names.items():
        assert getattr(module, copy_name) == getattr(alphabet, alphabet_name), f"{module.__name__}.{copy_name}"


def test_the_tokenizer_copy_names_the_specials_as_the_alphabet_does():
    assert stream_tokenizer.SPECIAL_NAMES == alphabet.SPECIAL_NAMES
    assert stream_tokenizer.FUSED_SPECIAL_NAMES == alphabet.FUSED_SPECIAL_NAMES


@pytest.mark.parametrize("kind", list(StreamKind), ids=lambda k: k.value)
def test_the_tokenizers_streams_are_the_stream_kinds(kind):
    stream = stream_tokenizer.STREAMS[kind.value]
    assert (stream.bos, stream.eos, stream.pad, stream.eot) == (kind.bos, kind.eos, kind.pad, kind.eot)
    assert stream.text_symbols == kind.text_symbols
    assert [stream.closes_token(s) for s in range(kind.alphabet_size)] == [
        kind.closes_token(s) for s in range(kind.alphabet_size)
    ]


def test_the_patched_models_streams_are_the_stream_kinds():
    """Each stream's alphabet and specials as the patched model's config takes them."""
    for kind in StreamKind:
        assert patched_model.STREAM_SYMBOLS[kind.value] == (kind.alphabet_size, kind.bos, kind.eos, kind.pad, kind.eot)
