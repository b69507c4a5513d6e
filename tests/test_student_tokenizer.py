"""The byte tokenizer: ids are bytes, specials at 256-259, AutoTokenizer loads it, exact round trips."""

import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer as _Tokenizer
from tokenizers import models as _models
from transformers import AutoTokenizer

from bytestream.alphabet import BOS, EOS, EOT, PAD
from bytestream.stream_kind import StreamKind
from bytestream.stream_symbols import stream_symbols
from bytestream.stream_tokenizer import ByteStreamTokenizer
from bytestream.teacher_tokens import TeacherTokens
from students.release.tokenizer import build_tokenizer, decode_bytes
from tests.conftest import SAMPLE_DOCUMENTS

TEXTS = [
    "",
    "hello, world",
    "emoji 👋🏽 👨‍👩‍👧 🇺🇦",
    "CJK 世界 日本語 한국어",
    "combining e\u0301 a\u0308\u0323 Z\u0351\u0310",
    "whitespace \t\n\r  x  ",
    "literal specials <eot><bos><eos><pad>",
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    build_tokenizer().save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_through_auto_tokenizer(tokenizer, text):
    ids = tokenizer(text).input_ids
    assert ids == [BOS] + list(text.encode("utf-8"))
    assert tokenizer(text, add_special_tokens=False).input_ids == list(text.encode("utf-8"))
    with_marks = ids[:3] + [EOT] + ids[3:] + [EOT, EOS]
    assert tokenizer.decode(with_marks, skip_special_tokens=True) == text
    assert decode_bytes(with_marks) == text.encode("utf-8")


def test_random_unicode_round_trips(tokenizer):
    rng = random.Random(0)
    for _ in range(50):
        text = "".join(
            chr(rng.choice([rng.randrange(32, 0x2FF), rng.randrange(0x4E00, 0x9FFF), rng.randrange(0x1F300, 0x1FAFF)]))
            for _ in range(20)
        )
        ids = tokenizer(text, add_special_tokens=False).input_ids
        assert ids == list(text.encode("utf-8"))
        assert tokenizer.decode(ids) == text


def test_ids_and_invalid_utf8(tokenizer):
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (BOS, EOS, PAD)
    assert tokenizer.convert_tokens_to_ids("<eot>") == EOT and len(tokenizer) == 260
    half_character = list("世".encode())[:2]
    assert tokenizer.decode(half_character) == "\ufffd"  # str decoding replaces invalid UTF-8
    assert decode_bytes(half_character) == "世".encode()[:2]  # decode_bytes is exact
    assert all(tokenizer.decode([b]) for b in range(256))


# ------------------------------------------------------------ the stream tokenizer (<eot> marks)


@pytest.fixture(scope="module")
def stream_tokenizer(llama3_tokenizer_path):
    return ByteStreamTokenizer(teacher_tokenizer_file=llama3_tokenizer_path)


@pytest.mark.parametrize("name", sorted(SAMPLE_DOCUMENTS))
def test_stream_tokens_are_the_dump_encoders_tokens(name, stream_tokenizer, llama3_encoder, llama3_vocab):
    data = SAMPLE_DOCUMENTS[name]
    expected = [llama3_vocab.bytes_of([t]) for t in llama3_encoder.encode(data)]
    assert stream_tokenizer.teacher.streamed_tokens(data) == expected
    assert stream_tokenizer.encode_bytes(data, eos=True) == stream_symbols(expected, StreamKind.EOT, eos=True)


def test_call_places_eot_after_every_teacher_token(stream_tokenizer):
    ids = stream_tokenizer("héllo <|begin_of_text|>").input_ids
    assert ids[0] == BOS and ids[-1] == EOT and EOS not in ids
    assert decode_bytes(ids) == "héllo <|begin_of_text|>".encode()
    assert ids.count(EOT) == len(stream_tokenizer.teacher.streamed_tokens("héllo <|begin_of_text|>".encode()))
    assert stream_tokenizer("ab", add_special_tokens=False).input_ids[0] != BOS
    assert stream_tokenizer.decode(ids, skip_special_tokens=True) == "héllo <|begin_of_text|>"


def test_a_tokenizer_of_another_family_is_refused():
    word_level = _Tokenizer(_models.WordLevel(vocab={"hello": 0, "[UNK]": 1}, unk_token="[UNK]"))
    with pytest.raises(ValueError, match="neither a byte-level BPE .* nor a SentencePiece model with byte fallback"):
        TeacherTokens(word_level.to_str())


def test_an_invalid_byte_without_a_token_is_refused_like_the_dump(llama3_tokenizer_path):
    import json

    spec = json.loads(Path(llama3_tokenizer_path).read_text(encoding="utf-8"))
    del spec["model"]["vocab"]["ÿ"]  # byte 0xFF: never valid UTF-8; some vocabularies (SmolLM2) lack it
    spec["model"]["merges"] = [
        m for m in spec["model"]["merges"] if "ÿ" not in (m if isinstance(m, str) else " ".join(m))
    ]
    teacher = TeacherTokens(json.dumps(spec))
    assert teacher.streamed_tokens(b"ok \xfe") == [b"ok", b" ", b"\xfe"]
    with pytest.raises(ValueError, match="no token for the byte 0xFF"):
        teacher.streamed_tokens(b"ok \xff")
