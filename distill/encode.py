"""Documents are bytes: encode them with the teacher's tokenizer, exactly.

Literal special-token strings in a document are text (``encode_special_tokens``, with every token
the vocabulary treats as special marked special, so SentencePiece's ``</s>`` is text too), and
bytes that are not valid UTF-8 become the teacher's single-byte tokens. The concatenated token
bytes equal the document, after SentencePiece's dummy prefix space where the teacher adds one:
the encoder's own tokenizer copy has the prefix rule switched off and the space is put before the
document explicitly, so a document split into several runs gets it once. A normalizer that changes
the text in a way the token bytes cannot undo is refused, naming the byte and the rule.
"""

from __future__ import annotations

import json

import numpy as np
from tokenizers import Tokenizer

from distill.errors import UserError
from distill.vocab import BYTE_FALLBACK, TeacherVocab, spec_steps
from students.stream_tokenizer import utf8_runs  # self-contained (shipped with exports): the one copy

WORD_BOUNDARY = "\u2581"  # SentencePiece's ▁, read as a space in the token bytes


class UnencodableDocument(UserError):
    """A document the teacher cannot represent exactly (a byte with no token, a lossy normalizer)."""


class DocumentEncoder:
    """Turns document bytes into teacher token ids (no BOS/EOS: the conversion adds those)."""

    def __init__(self, tokenizer, vocab: TeacherVocab):
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        self._tokenizer = Tokenizer.from_str(json.dumps(exact_spec(json.loads(backend.to_str()), vocab)))
        self._tokenizer.encode_special_tokens = True
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self.vocab = vocab
        self._check_prefix_rule(backend)

    def _check_prefix_rule(self, backend) -> None:
        """The copy with the space put in front must tokenise plain text as the teacher does."""
        probe = "a probe, of the prefix\nrule"
        want = backend.encode(probe, add_special_tokens=False).ids
        got = self._tokenizer.encode(self.stream_bytes(probe.encode()).decode(), add_special_tokens=False).ids
        if got != want:
            raise UserError(
                "the tokenizer's dummy-prefix handling is not understood (its normalizer or pre-tokenizer "
                "adds text in an unknown way), so documents cannot be encoded exactly"
            )

    def encode(self, data: bytes) -> np.ndarray:
        text = self.stream_bytes(data)
        ids: list[int] = []
        for valid, run in utf8_runs(text):
            if valid:
                ids.extend(self._tokenizer.encode(run.decode("utf-8"), add_special_tokens=False).ids)
            else:
                ids.extend(self._byte_ids(run))
        tokens = np.asarray(ids, dtype=np.int64)
        self._check_round_trip(tokens, data)
        return tokens

    def stream_bytes(self, data: bytes) -> bytes:
        """What the teacher reads: the document, after the dummy prefix space if it adds one."""
        return b" " + data if self.vocab.adds_prefix_space and data else data

    def _byte_ids(self, run: bytes) -> list[int]:
        table = self.vocab.single_byte_ids
        ids = [int(table[b]) for b in run]
        if min(ids) < 0:
            bad = run[ids.index(-1)]
            raise UnencodableDocument(f"the teacher vocabulary has no token for the byte 0x{bad:02X}")
        return ids

    def _check_round_trip(self, tokens: np.ndarray, data: bytes) -> None:
        got, expected = self.vocab.bytes_of(tokens), self.stream_bytes(data)
        if got == expected:
            return
        at = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
        at = max(0, at - (len(expected) - len(data)))  # in document coordinates
        raise UnencodableDocument(
            f"the teacher tokenizer does not reproduce the document's bytes: byte {at} "
            f"(0x{data[at]:02X}) is changed by {self._lossy_rule(data)}, which cannot be undone exactly"
            if at < len(data)
            else f"the teacher tokenizer does not reproduce the document's bytes (it adds bytes after byte {at})"
        )

    def _lossy_rule(self, data: bytes) -> str:
        """Name the rule that changes this document's text."""
        text = data.decode("utf-8", errors="replace")
        if self.vocab.family == BYTE_FALLBACK and WORD_BOUNDARY in text:
            return "SentencePiece's reading of '\u2581' (U+2581) as a space"
        for step in normalizer_steps(self._tokenizer.normalizer):  # space → ▁ is undone exactly
            if step.normalize_str(text).replace(WORD_BOUNDARY, " ") != text:
                return f"the tokenizer's {type(step).__name__} normalizer"
        return "the tokenizer's normalizer or pre-tokenizer"


def normalizer_steps(normalizer) -> list:
    """The steps of a normalizer: a Sequence's members, else the normalizer itself."""
    if normalizer is None:
        return []
    if type(normalizer).__name__ != "Sequence":
        return [normalizer]
    steps = []
    while True:
        try:
            steps.append(normalizer[len(steps)])
        except IndexError:
            return steps


def exact_spec(spec: dict, vocab: TeacherVocab) -> dict:
    """A copy of a ``tokenizer.json`` spec that encodes documents as the stream needs: no dummy
    prefix (the encoder puts the space in front itself), and every id the vocabulary treats as
    special marked special, so that its literal text is encoded as text."""
    spec = json.loads(json.dumps(spec))
    special = set(vocab.special_ids)
    for token in spec.get("added_tokens", []):
        token["special"] = token["special"] or token["id"] in special
    spec["normalizer"] = _without_prepend(spec.get("normalizer"))
    for pre in spec_steps(spec.get("pre_tokenizer"), "pretokenizers"):
        if pre.get("type") == "Metaspace":
            pre["prepend_scheme"] = "never"
            pre.pop("add_prefix_space", None)
    return spec


def _without_prepend(normalizer: dict | None) -> dict | None:
    """The normalizer less its dummy-prefix rules: ``Prepend``, and replacements anchored at the
    start of the text (``\\A▁`` → ``▁▁``, with which ``transformers`` makes the prefix unconditional)."""
    steps = [n for n in spec_steps(normalizer, "normalizers") if not _is_prefix_rule(n)]
    if not steps:
        return None
    return steps[0] if len(steps) == 1 else {"type": "Sequence", "normalizers": steps}


def _is_prefix_rule(step: dict) -> bool:
    pattern = step.get("pattern", {}).get("Regex", "") if step.get("type") == "Replace" else ""
    return step.get("type") == "Prepend" or pattern.startswith(("\\A", "^"))
