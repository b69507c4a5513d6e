"""The files an export ships run without this package, so they keep their own copies of what they
need: ``bytestream/stream_tokenizer.py`` (the student's tokenizer), ``students/models/patched_model.py``
(the patched student's modeling file) and ``students/release/custom_generate.py``. As transformers
does, each copy says where it comes from, on the line above it::

    # Copied from bytestream.alphabet: ALPHABET_SIZE as NUM_SYMBOLS, EOT, BOS

and this test holds every marked copy to its source: a value must equal it, a function or class
must be its source's text (decorators and docstring included, each ``as`` rename of the file's
markers applied: the tokenizer's ``stream_symbols`` reads ``stream: Stream`` where its source reads
``StreamKind``), a copy of a stream kind must name the same symbols and close tokens at the same
ones. A name of the alphabet that a shipped file defines without a marker is caught too.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

from bytestream import alphabet
from bytestream.stream_kind import StreamKind

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("bytestream/stream_tokenizer.py", "students/models/patched_model.py", "students/release/custom_generate.py")
MARKER = re.compile(r"^#\s*Copied from ([\w.]+): (.+)$")


def copies(path: str) -> list[tuple[str, str, str]]:
    """(source module, source name, the copy's name) for every marked copy in ``path``."""
    found = []
    for line in (ROOT / path).read_text().splitlines():
        if match := MARKER.match(line.strip()):
            for item in match.group(2).split(","):
                source, _, copy = item.strip().partition(" as ")
                found.append((match.group(1), source, copy or source))
    return found


def same_streams_as_kinds(copy) -> None:
    """A copy of :class:`StreamKind`: the tokenizer's ``Stream`` (through its ``STREAMS``) or the
    patched model's ``STREAM_SYMBOLS`` table, held to every kind a store holds (a bytes student's
    folder ships neither: it runs the stock byte tokenizer and a stock Llama)."""
    for kind in StreamKind.stored_kinds():
        if isinstance(copy, dict):
            assert copy[kind.value] == (kind.alphabet_size, kind.bos, kind.eos, kind.pad, kind.eot), kind
            continue
        stream = importlib.import_module(copy.__module__).STREAMS[kind.value]
        assert (stream.bos, stream.eos, stream.pad, stream.eot) == (kind.bos, kind.eos, kind.pad, kind.eot)
        assert (stream.text_symbols, stream.alphabet_size) == (kind.text_symbols, kind.alphabet_size)
        closes = [stream.closes_token(s) for s in range(kind.alphabet_size)]
        assert closes == [kind.closes_token(s) for s in range(kind.alphabet_size)], kind
        assert [stream.choices(b) for b in range(256)] == [kind.choices(b) for b in range(256)], kind


# sources that are not values: how a copy of them is checked
BEHAVIOURS = {("bytestream.stream_kind", "StreamKind"): same_streams_as_kinds}


def renamed_source(source, path: str) -> str:
    """The source text of a function or class as ``path`` copies it: each ``as`` rename of its markers applied."""
    text = inspect.getsource(source)
    for _, name, copy_name in copies(path):
        if copy_name != name:
            text = re.sub(rf"\b{re.escape(name)}\b", copy_name, text)
    return text


def module_of(path: str):
    return importlib.import_module(path.removesuffix(".py").replace("/", "."))


@pytest.mark.parametrize("path", SHIPPED)
def test_every_marked_copy_matches_its_source(path):
    module = module_of(path)
    for source_module, source_name, copy_name in copies(path):
        copy = getattr(module, copy_name)
        if (source_module, source_name) in BEHAVIOURS:
            BEHAVIOURS[source_module, source_name](copy)
        else:
            source = getattr(importlib.import_module(source_module), source_name)
            if callable(source):  # a function or class: the same text
                same = inspect.getsource(copy) == renamed_source(source, path)
                assert same, f"{path}: {copy_name} is not the text of {source_module}.{source_name}"
            else:
                assert copy == source, f"{path}: {copy_name} is not {source_module}.{source_name}"


@pytest.mark.parametrize("path", SHIPPED)
def test_no_shipped_file_copies_the_alphabet_unmarked(path):
    marked = {copy for _, _, copy in copies(path)}
    module = module_of(path)
    unmarked = [name for name in vars(alphabet) if name.isupper() and name in vars(module) and name not in marked]
    assert not unmarked, f"{path} defines {unmarked} without a '# Copied from' line"


def test_the_stream_copies_are_marked():
    """The two copies of the stream kinds (the tokenizer's and the patched model's) are among the checked."""
    marked = {(path, copy) for path in SHIPPED for m, s, copy in copies(path) if (m, s) in BEHAVIOURS}
    assert marked == {
        ("bytestream/stream_tokenizer.py", "Stream"),
        ("students/models/patched_model.py", "STREAM_SYMBOLS"),
    }


def test_the_checker_sees_a_wrong_copy(tmp_path, monkeypatch):
    """A marked copy that differs from its source is caught (the check can fail)."""
    (tmp_path / "shipped.py").write_text(
        "# Copied from bytestream.alphabet: ALPHABET_SIZE as SIZE, EOT\nSIZE, EOT = 261, 256\n"
    )
    monkeypatch.setattr("tests.test_shipped_copies.ROOT", tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert copies("shipped.py") == [
        ("bytestream.alphabet", "ALPHABET_SIZE", "SIZE"),
        ("bytestream.alphabet", "EOT", "EOT"),
    ]
    with pytest.raises(AssertionError, match="SIZE is not bytestream.alphabet.ALPHABET_SIZE"):
        test_every_marked_copy_matches_its_source("shipped.py")


def test_the_checker_sees_a_function_copy_that_differs(tmp_path, monkeypatch):
    """A marked copy of a function whose text differs from its source's (here: one word of its
    docstring) is caught; the same text passes."""
    source = inspect.getsource(importlib.import_module("bytestream.teacher_tokens").spec_steps)
    head = "# Copied from bytestream.teacher_tokens: spec_steps\n"
    monkeypatch.setattr("tests.test_shipped_copies.ROOT", tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "shipped_same.py").write_text(head + source)
    (tmp_path / "shipped_other.py").write_text(head + source.replace("flattened", "flat"))
    test_every_marked_copy_matches_its_source("shipped_same.py")
    with pytest.raises(AssertionError, match="spec_steps is not the text of bytestream.teacher_tokens.spec_steps"):
        test_every_marked_copy_matches_its_source("shipped_other.py")
