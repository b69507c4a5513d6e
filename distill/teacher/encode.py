"""Documents are bytes: encode them with the teacher's tokenizer, exactly.

Literal special-token strings in a document are text (``encode_special_tokens``, with every token
the vocabulary treats as special marked special, so SentencePiece's ``</s>`` is text too), and
bytes that are not valid UTF-8 become the teacher's single-byte tokens. The concatenated token
bytes equal the document, after SentencePiece's dummy prefix space where the teacher adds one:
the encoder's own tokenizer copy has the prefix rule switched off and the space is put before the
document explicitly, so a document split into several runs gets it once. A normalizer that changes
the text in a way the token bytes cannot undo is refused, naming the byte and the rule.

The rules themselves live in :mod:`bytestream.teacher_tokens` (``TeacherTokens``), of which the
student's tokenizer that exported folders ship keeps a checked copy, so that it encodes text
exactly as the dump did.
"""

from __future__ import annotations

import json

import numpy as np

from bytestream.teacher_tokens import WORD_BOUNDARY, TeacherTokens
from bytestream.vocab import BYTE_FALLBACK, TeacherVocab
from common.errors import UserError


class UnencodableDocument(UserError):
    """A document the teacher cannot represent exactly (a byte with no token, a lossy normalizer)."""


class DocumentEncoder:
    """Turns document bytes into teacher token ids (no BOS/EOS: the conversion adds those)."""

    def __init__(self, tokenizer, vocab: TeacherVocab):
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        self.tokens = TeacherTokens(json.dumps(with_specials_marked(json.loads(backend.to_str()), vocab)))
        self.vocab = vocab
        self._check_prefix_rule(backend)

    def _check_prefix_rule(self, backend) -> None:
        """The copy with the space put in front must tokenise plain text as the teacher does."""
        probe = "a probe, of the prefix\nrule"
        want = backend.encode(probe, add_special_tokens=False).ids
        if self.tokens.dummy_prefix != self.vocab.adds_prefix_space or self.tokens.ids(probe.encode()) != want:
            raise UserError(
                "the tokenizer's dummy-prefix handling is not understood (its normalizer or pre-tokenizer "
                "adds text in an unknown way), so documents cannot be encoded exactly"
            )

    def encode(self, data: bytes) -> np.ndarray:
        try:
            tokens = self.tokens.encode_unchecked(data)
        except ValueError as exc:  # a byte without a single-byte token
            raise UnencodableDocument(str(exc)) from None
        ids = np.asarray([token_id for token_id, _, _ in tokens], dtype=np.int64)
        self._check_round_trip(ids, data)
        return ids

    def encode_part(self, data: bytes, first: bool) -> np.ndarray:
        """The ids of a piece of a document between special tokens (a chat rendering's text): the
        document's first piece as :meth:`encode` reads it (after the dummy prefix space, if the
        teacher adds one), a later one as text alone, as a tokenizer reads text after a special."""
        if first:
            return self.encode(data)
        try:
            tokens = self.tokens.encode_text(data)
        except ValueError as exc:
            raise UnencodableDocument(str(exc)) from None
        ids = np.asarray([token_id for token_id, _, _ in tokens], dtype=np.int64)
        self._check_round_trip(ids, data, prefix=False)
        return ids

    def stream_bytes(self, data: bytes) -> bytes:
        """What the teacher reads: the document, after the dummy prefix space if it adds one."""
        return self.tokens.stream_bytes(data)

    def _check_round_trip(self, tokens: np.ndarray, data: bytes, prefix: bool = True) -> None:
        got, expected = self.vocab.bytes_of(tokens), self.stream_bytes(data) if prefix else data
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
        for step in normalizer_steps(self.tokens.normalizer):  # space → ▁ is undone exactly
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


def with_specials_marked(spec: dict, vocab: TeacherVocab) -> dict:
    """A copy of a ``tokenizer.json`` spec with every added token the vocabulary treats as special
    marked special, so that its literal text is encoded as text (Phi-3's ``</s>``)."""
    # a copy of what changes only: a deep copy of a 128k-token spec costs seconds
    spec = {**spec, "added_tokens": [dict(token) for token in spec.get("added_tokens", [])]}
    special = set(vocab.special_ids)
    for token in spec.get("added_tokens", []):
        token["special"] = token["special"] or token["id"] in special
    return spec
