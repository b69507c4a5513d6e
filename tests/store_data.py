"""A tiny vocabulary and documents with exact distributions, shared by the store tests and the
script that wrote the format-1 fixture in tests/data/store-v1 (with the format-1 writer)."""

from __future__ import annotations

import numpy as np

from bytestream.vocab import TeacherVocab
from distill.conversion.converter import Converter

MERGES = (b"th", b"the", b" the", b"in", b"ing", b" and", b"nd", b"e ", b"\xe2\x82\xac")
TEXTS = (b"in the beginning", b"and the earth \xe2\x82\xac", b"x", b"thing and thing")


def tiny_vocab() -> TeacherVocab:
    """256 single bytes, a few merges, one end-of-text special."""
    tokens = tuple(bytes([b]) for b in range(256)) + MERGES + (b"",)
    eot = len(tokens) - 1
    return TeacherVocab(
        token_bytes=tokens, special_ids=(eot,), end_of_text_ids=(eot,), family="byte_level", name="tiny"
    )


def greedy_ids(vocab: TeacherVocab, text: bytes) -> np.ndarray:
    """Longest-match tokenisation (any tokenisation is valid for the store)."""
    index = {b: i for i, b in enumerate(vocab.token_bytes) if b}
    ids, at = [], 0
    while at < len(text):
        end = max(e for e in range(at + 1, len(text) + 1) if text[at:e] in index)
        ids.append(index[text[at:end]])
        at = end
    return np.array(ids, dtype=np.int64)


def tiny_documents(vocab: TeacherVocab, seed: int = 7):
    """(token ids, DocumentDistributions, text bytes) for TEXTS under seeded random logits."""
    converter = Converter(vocab)
    rng = np.random.default_rng(seed)
    out = []
    for text in TEXTS:
        ids = greedy_ids(vocab, text)
        logits = rng.standard_normal((len(ids) + 1, vocab.size)) * 3.0
        out.append((ids, converter.convert_numba(ids, logits), len(text)))
    return out
