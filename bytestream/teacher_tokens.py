"""The teacher's tokenization of document bytes, exactly as the dump reads it: the rules read from
a ``tokenizer.json`` (its family, SentencePiece's dummy prefix) and :class:`TeacherTokens`, each
token's id, bytes and word, and a prompt split at its last word
(docs/DESIGN.md, "`<eot>` at inference").

Two teacher families: byte-level BPE (GPT-2 byte alphabet: Llama-3, SmolLM2, Qwen, GPT-2) and
SentencePiece with byte fallback (Llama-2, Mistral, Phi-3: ``▁`` is a space, ``<0xNN>`` the byte
NN); another tokenizer family is refused when the tokenizer is loaded. Literal special-token text
is text, bytes that are not valid UTF-8 become one single-byte token each, and SentencePiece's
dummy prefix space is context, not text (the teacher reads ``b" " + text``; the stream holds the
text), so the stream's bytes always equal the document.

The student's tokenizer (``bytestream/stream_tokenizer.py``, shipped with every fused and ``<eot>``
export) keeps marked copies of what it uses from here; tests/test_shipped_copies.py holds each copy
to this module's source.
"""

from __future__ import annotations

import functools
import json
import os
import re

from tokenizers import Tokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

BYTE_LEVEL, BYTE_FALLBACK = "byte-level", "sentencepiece-byte-fallback"
BYTE_CHARS = bytes_to_unicode()  # byte value -> GPT-2's printable character for it
CHAR_BYTES = {char: value for value, char in BYTE_CHARS.items()}
WORD_BOUNDARY = "\u2581"  # SentencePiece's ▁, a space in the token bytes
_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
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


# ------------------------------------------------------------------ tokenizer.json rules


def spec_steps(item: dict | None, key: str) -> list[dict]:
    """The steps of a ``tokenizer.json`` normalizer (``key`` "normalizers") or pre-tokenizer
    ("pretokenizers"), with Sequences flattened."""
    if item is None:
        return []
    if item.get("type") == "Sequence":
        return [step for sub in item[key] for step in spec_steps(sub, key)]
    return [item]


def tokenizer_family(spec: dict) -> str | None:
    """``BYTE_LEVEL`` (a ByteLevel pre-tokenizer or decoder), ``BYTE_FALLBACK`` (a model with
    ``byte_fallback``), or None: a family whose tokens cannot be mapped to bytes exactly."""
    if '"ByteLevel"' in json.dumps({k: spec.get(k) for k in ("pre_tokenizer", "decoder")}):
        return BYTE_LEVEL
    if spec.get("model", {}).get("byte_fallback"):
        return BYTE_FALLBACK
    return None


def sentencepiece_piece_bytes(piece: str) -> bytes:
    """A SentencePiece piece's bytes: ``<0xNN>`` is the byte NN, ``▁`` a space."""
    match = _BYTE_PIECE.match(piece)
    if match:
        return bytes([int(match.group(1), 16)])
    return piece.replace(WORD_BOUNDARY, " ").encode("utf-8")


def adds_dummy_prefix(spec: dict) -> bool:
    """SentencePiece's dummy prefix: a ``Prepend("▁")`` normalizer or a Metaspace pre-tokenizer
    that prepends (``prepend_scheme`` "first"/"always", or the older ``add_prefix_space``)."""
    if tokenizer_family(spec) != BYTE_FALLBACK:
        return False
    prepends = any(n.get("type") == "Prepend" for n in spec_steps(spec.get("normalizer"), "normalizers"))
    return prepends or any(
        p.get("type") == "Metaspace" and (p.get("prepend_scheme") in ("first", "always") or p.get("add_prefix_space"))
        for p in spec_steps(spec.get("pre_tokenizer"), "pretokenizers")
    )


def without_dummy_prefix(spec: dict) -> dict:
    """A copy of a ``tokenizer.json`` spec whose normalizer and pre-tokenizer add no dummy prefix
    (the encoder puts the space in front itself, once per document): ``Prepend`` and replacements
    anchored at the start of the text (``\\A▁`` → ``▁▁``, with which ``transformers`` makes the
    prefix unconditional) are dropped, and Metaspace never prepends."""
    # a copy of what changes only: a deep copy of a 128k-token spec costs seconds
    spec = {**spec, "pre_tokenizer": json.loads(json.dumps(spec.get("pre_tokenizer")))}
    steps = [n for n in spec_steps(spec.get("normalizer"), "normalizers") if not _is_prefix_rule(n)]
    spec["normalizer"] = (
        (steps[0] if len(steps) == 1 else {"type": "Sequence", "normalizers": steps}) if steps else None
    )
    for pre in spec_steps(spec.get("pre_tokenizer"), "pretokenizers"):
        if pre.get("type") == "Metaspace":
            pre["prepend_scheme"] = "never"
            pre.pop("add_prefix_space", None)
    return spec


def _is_prefix_rule(step: dict) -> bool:
    pattern = step.get("pattern", {}).get("Regex", "") if step.get("type") == "Replace" else ""
    return step.get("type") == "Prepend" or pattern.startswith(("\\A", "^"))


# ------------------------------------------------------------------ the teacher's tokens


@functools.lru_cache(maxsize=4)
def _parsed_teacher(tokenizer_json: str) -> tuple[str, bool, Tokenizer, dict[int, bytes]]:
    """The family, dummy prefix, encoder and non-special added tokens of a ``tokenizer.json``,
    built once per process and text (about a second for a 128k-token vocabulary; a folder's
    tokenizer is loaded more than once when it is scored, evaluated and prompted). Read only."""
    spec = json.loads(tokenizer_json)
    family = tokenizer_family(spec)
    if family is None:
        raise ValueError(
            "the teacher tokenizer is neither a byte-level BPE (no ByteLevel pre-tokenizer or decoder) nor a "
            "SentencePiece model with byte fallback; its <eot> marks cannot be placed exactly"
        )
    tokenizer = Tokenizer.from_str(json.dumps(without_dummy_prefix(spec)))
    tokenizer.encode_special_tokens = True  # literal "<|begin_of_text|>" is text
    tokenizer.no_padding()
    tokenizer.no_truncation()
    added = {t["id"]: t["content"].encode("utf-8") for t in spec.get("added_tokens", []) if not t["special"]}
    return family, adds_dummy_prefix(spec), tokenizer, added


class TeacherTokens:
    """The teacher's tokenization of document bytes: each token's id, its bytes in the stream and
    the pre-token ("word") it belongs to.

    ``tokenizer_json`` is the teacher's ``tokenizer.json``; literal special text is always text
    (``encode_special_tokens``), so the ids a document may hold are the non-special ones (``export``
    ships the spec with every id the dump treats as special marked special) — except the
    ``reserved`` specials (texts, in order: a chat template's, such as ``<|im_end|>``), which are
    the stream's reserved symbols: the data is cut at each of their occurrences (the longest at a
    place first), each occurrence is that one special token (a word of its own) and each piece
    between is encoded alone, as the teacher's tokenizer splits its specials out before anything
    else; only a first piece at the start of the data is read after the dummy prefix.
    """

    def __init__(self, tokenizer_json: str, reserved: tuple[str, ...] | list[str] = ()):
        self.tokenizer_json = tokenizer_json  # as given, for saving
        self.family, self.dummy_prefix, self._tokenizer, self._added = _parsed_teacher(tokenizer_json)
        self.reserved = tuple(reserved)
        self.reserved_ids = [self._tokenizer.token_to_id(text) for text in self.reserved]
        missing = [text for text, token_id in zip(self.reserved, self.reserved_ids) if token_id is None]
        if missing:
            raise ValueError(f"the teacher tokenizer has no token {missing[0]!r} (a reserved symbol)")
        self._reserved_index = {token_id: i for i, token_id in enumerate(self.reserved_ids)}
        longest_first = sorted({text.encode("utf-8") for text in self.reserved}, key=len, reverse=True)
        self._reserved_pattern = re.compile(b"|".join(map(re.escape, longest_first))) if longest_first else None

    @classmethod
    def from_file(cls, path: str | os.PathLike, reserved: tuple[str, ...] | list[str] = ()) -> TeacherTokens:
        with open(path, encoding="utf-8") as f:
            return cls(f.read(), reserved)

    def reads_prefix(self, data: bytes) -> bool:
        """Whether the teacher reads the dummy prefix space before ``data``: it adds one, and ``data``
        starts with text (not with a reserved special)."""
        if not (self.dummy_prefix and data):
            return False
        return self._reserved_pattern is None or self._reserved_pattern.match(data) is None

    def stream_bytes(self, data: bytes) -> bytes:
        """What the teacher reads: the document, after the dummy prefix space if it adds one."""
        return b" " + data if self.reads_prefix(data) else data

    def token_bytes(self, token_id: int, token: str) -> bytes:
        """The bytes of one token (its id and its string in the tokenizer)."""
        if token_id in self._added:  # a non-special added token is matched on the raw text
            return self._added[token_id]
        if self.family == BYTE_FALLBACK:
            return sentencepiece_piece_bytes(token)
        if any(char not in CHAR_BYTES for char in token):
            raise ValueError(f"the teacher tokenizer produced {token!r}, which is not byte-level text")
        return bytes(CHAR_BYTES[char] for char in token)

    def single_byte_id(self, value: int) -> int:
        """The token of a byte outside valid UTF-8, as in the dump; refused if the vocabulary has none."""
        name = f"<0x{value:02X}>" if self.family == BYTE_FALLBACK else BYTE_CHARS[value]
        token_id = self._tokenizer.token_to_id(name)
        if token_id is None:
            raise ValueError(f"the teacher vocabulary has no token for the byte 0x{value:02X}")
        return token_id

    @property
    def normalizer(self):
        """The normalizer documents go through (the dummy prefix rules left out)."""
        return self._tokenizer.normalizer

    def encode(self, data: bytes) -> list[tuple[int, bytes, int]]:
        """``(id, bytes, word)`` of each token the teacher reads for ``data``; their bytes
        concatenate to :meth:`stream_bytes` (checked)."""
        out = self.encode_unchecked(data)
        joined, expected = b"".join(spelling for _, spelling, _ in out), self.stream_bytes(data)
        if joined != expected:
            at = next((i for i, (a, b) in enumerate(zip(joined, expected)) if a != b), min(len(joined), len(expected)))
            raise ValueError(
                f"the teacher tokenizer does not reproduce the text's bytes (first difference at byte {at})"
            )
        return out

    def encode_unchecked(self, data: bytes) -> list[tuple[int, bytes, int]]:
        """``(id, bytes, word)`` of each token the teacher reads for ``data``: valid UTF-8 runs
        through the tokenizer, each invalid byte its single-byte token; ``word`` numbers the
        pre-tokens (each invalid byte, and each reserved special, is a word of its own)."""
        if self._reserved_pattern is None:
            return self._encode_piece(self.stream_bytes(data), 0)[0]
        out: list[tuple[int, bytes, int]] = []
        word = at = 0
        for match in self._reserved_pattern.finditer(data):
            if match.start() > at:
                piece = data[at : match.start()]
                tokens, word = self._encode_piece(self.stream_bytes(piece) if at == 0 else piece, word)
                out += tokens
            text = match.group()
            out.append((self.reserved_ids[self.reserved.index(text.decode("utf-8"))], text, word))
            word, at = word + 1, match.end()
        if at < len(data):
            tokens, word = self._encode_piece(self.stream_bytes(data[at:]) if at == 0 else data[at:], word)
            out += tokens
        return out

    def encode_text(self, data: bytes) -> list[tuple[int, bytes, int]]:
        """``(id, bytes, word)`` of each token of text read alone, with no dummy prefix and no
        reserved special cut out: a piece of a chat rendering between two of the template's specials."""
        return self._encode_piece(data, 0)[0]

    def reserved_of(self, token_id: int) -> int | None:
        """The index of the reserved special a token id is, or None."""
        return self._reserved_index.get(int(token_id))

    def _encode_piece(self, data: bytes, word: int) -> tuple[list[tuple[int, bytes, int]], int]:
        """The tokens of text with no reserved special in it (as the teacher reads it), their words
        numbered from ``word``; and the next word's number."""
        out: list[tuple[int, bytes, int]] = []
        for valid, run in utf8_runs(data):
            if not valid:
                for value in run:
                    out.append((self.single_byte_id(value), bytes([value]), word))
                    word += 1
                continue
            encoding = self._tokenizer.encode(run.decode("utf-8"), add_special_tokens=False)
            for token_id, token, in_run in zip(encoding.ids, encoding.tokens, encoding.word_ids):
                out.append((token_id, self.token_bytes(token_id, token), word + (in_run or 0)))
            word += max((w or 0 for w in encoding.word_ids), default=-1) + 1
        return out, word

    def ids(self, data: bytes) -> list[int]:
        """The teacher's token ids of ``data`` (the dummy prefix space included)."""
        return [token_id for token_id, _, _ in self.encode(data)]

    def streamed_tokens(self, data: bytes) -> list[bytes | int]:
        """The bytes of each teacher token of ``data`` as the stream holds them (the dummy prefix
        space, which is context, not text, left out), a reserved special as its index (an int):
        joined with the reserved texts, they are ``data``."""
        return self._pieces(self.encode(data), self.reads_prefix(data))

    def _pieces(self, tokens: list[tuple[int, bytes, int]], after_prefix: bool) -> list[bytes | int]:
        spelled = [spelling if self.reserved_of(token_id) is None else None for token_id, spelling, _ in tokens]
        streamed = _as_streamed(spelled, after_prefix)
        return [self.reserved_of(t[0]) if piece is None else piece for t, piece in zip(tokens, streamed)]

    def split_prompt(self, data: bytes, max_open: int | None = None) -> tuple[list[bytes | int], bytes]:
        """A prompt as ``(committed token bytes, open bytes)``: the teacher's tokens before the prompt's
        last word, and that word's bytes, which the student segments itself.

        The last word starts at the first token of the last pre-token, or later at its last token
        that begins with a space (SentencePiece without a pre-tokenizer reads the whole text as one
        pre-token; a space starts its words); it always holds the last token. A word longer than
        ``max_open`` bytes is committed up to its last tokens within them (at least its last token
        stays open): healing a byte takes a step, and a student reads no more than its context.
        """
        tokens = self.encode(data)
        if not tokens:
            return [], b""
        start = len(tokens) - 1
        while start > 0 and tokens[start - 1][2] == tokens[-1][2]:
            start -= 1
        spaced = [j for j in range(start, len(tokens)) if tokens[j][1][:1] == b" "]
        start = max(spaced, default=start)
        if self.reserved_of(tokens[-1][0]) is not None:  # a special is never healed: all is committed
            start = len(tokens)
        spelled = self._pieces(tokens, self.reads_prefix(data))
        if max_open is not None:
            open_length = sum(len(piece) for piece in spelled[start:] if isinstance(piece, bytes))
            while start < len(tokens) - 1 and open_length > max_open:
                open_length -= len(spelled[start]) if isinstance(spelled[start], bytes) else 0
                start += 1
        return spelled[:start], b"".join(spelled[start:])


def _as_streamed(spelled: list[bytes], after_prefix: bool) -> list[bytes]:
    """Token bytes as the stream holds them: the first token's less the dummy prefix space."""
    if after_prefix and spelled:
        return [spelled[0][1:], *spelled[1:]]
    return spelled


# the specials that end a turn in the chat templates of the common families (besides the template's
# end-of-text token): ChatML (SmolLM2, Qwen), Llama-3, Gemma, Phi-3
END_OF_TURN_TEXTS = ("<|im_end|>", "<|eot_id|>", "<|end_of_turn|>", "<end_of_turn>", "<|end|>", "<|eom_id|>")


def turn_ending_texts(recorded: list[str] | None, eos_token: str | None) -> set[str | None]:
    """The texts of the reserved symbols that end a turn: as the training store recorded them, else
    (a store of an older version) the teacher's end-of-text text and the usual end-of-turn names."""
    return set(recorded) if recorded is not None else {eos_token, *END_OF_TURN_TEXTS}
