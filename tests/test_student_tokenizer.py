"""The byte tokenizer: ids are bytes, specials at 256-259, AutoTokenizer loads it, exact round trips."""

import random

import pytest
from transformers import AutoTokenizer

from distill.alphabet import BOS, EOS, EOT, PAD
from students.tokenizer import build_tokenizer, decode_bytes

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
        text = "".join(chr(rng.choice([rng.randrange(32, 0x2FF), rng.randrange(0x4E00, 0x9FFF), rng.randrange(0x1F300, 0x1FAFF)])) for _ in range(20))
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
