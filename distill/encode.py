"""Documents are bytes: encode them with the teacher's tokenizer, exactly.

Literal special-token strings in a document are text (``encode_special_tokens``), and bytes that
are not valid UTF-8 become the teacher's single-byte tokens, so the concatenated token bytes
always equal the document (after SentencePiece's dummy prefix space, where the teacher adds one).
"""

from __future__ import annotations

import re

import numpy as np

from distill.errors import UserError
from distill.vocab import TeacherVocab

_ESCAPED = re.compile("[\udc80-\udcff]+")  # invalid bytes, as ``surrogateescape`` decodes them


def utf8_runs(data: bytes) -> list[tuple[bool, bytes]]:
    """Split ``data`` into maximal runs of valid UTF-8 ``(True, run)`` and of invalid bytes
    ``(False, run)``, in linear time: one decode that escapes each invalid byte as a lone
    surrogate (which valid UTF-8 cannot hold), split at the escapes."""
    text = data.decode("utf-8", errors="surrogateescape")
    runs: list[tuple[bool, bytes]] = []
    pos = 0
    for bad in _ESCAPED.finditer(text):
        if bad.start() > pos:
            runs.append((True, text[pos : bad.start()].encode("utf-8")))
        runs.append((False, bad.group().encode("utf-8", errors="surrogateescape")))
        pos = bad.end()
    if pos < len(text):
        runs.append((True, text[pos:].encode("utf-8")))
    return runs


class DocumentEncoder:
    """Turns document bytes into teacher token ids (no BOS/EOS: the conversion adds those)."""

    def __init__(self, tokenizer, vocab: TeacherVocab):
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        self._tokenizer = backend.__class__.from_str(backend.to_str())  # own copy: settings below
        self._tokenizer.encode_special_tokens = True
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self.vocab = vocab

    def encode(self, data: bytes) -> np.ndarray:
        ids: list[int] = []
        for valid, run in utf8_runs(data):
            if valid:
                ids.extend(self._tokenizer.encode(run.decode("utf-8"), add_special_tokens=False).ids)
            else:
                ids.extend(self._byte_ids(run))
        tokens = np.asarray(ids, dtype=np.int64)
        self._check_round_trip(tokens, data)
        return tokens

    def _byte_ids(self, run: bytes) -> list[int]:
        table = self.vocab.single_byte_ids
        ids = [int(table[b]) for b in run]
        if min(ids) < 0:
            bad = run[ids.index(-1)]
            raise UserError(f"the teacher vocabulary has no token for the byte 0x{bad:02X}")
        return ids

    def _check_round_trip(self, tokens: np.ndarray, data: bytes) -> None:
        got = self.vocab.bytes_of(tokens)
        expected = (b" " + data) if self.vocab.adds_prefix_space and data else data
        if got != expected:
            at = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
            raise UserError(
                f"the teacher tokenizer does not reproduce the document's bytes (first difference at "
                f"byte {at}); a normalizing tokenizer cannot be distilled exactly"
            )
