"""Text → the student's training stream, exactly: ``<bos> bytes(t_1) <eot> bytes(t_2) <eot> …``
(the ``<eot>`` stream) or ``<bos> f(t_1) f(t_2) …`` with f(t) the bytes of t, its last one flagged
"ends" (the fused stream, ``byte_stream="fused"``), and prompts → that stream with their last word
left open for the student to segment.

The student was trained on streams whose ``<eot>`` marks sit where the teacher's tokenizer ended
its tokens (docs/DESIGN.md, "`<eot>` at inference"). This module places them: it
runs the teacher's own tokenizer (its ``tokenizer.json``, shipped in the exported folder as
``teacher_tokenizer.json``) only to find the token boundaries; the student still reads every byte.
Encoding follows the dump's rules (the dump encodes documents with this module too): literal
special-token text is text, bytes that are not valid UTF-8 become one single-byte token each, and
SentencePiece's dummy prefix space is context, not text (the teacher reads ``b" " + text``; the
stream holds the text), so the stream's bytes always equal the document.

A prompt is not a complete text: its last word may go on. :meth:`TeacherTokens.split_prompt`
commits the teacher's tokens up to the start of the prompt's last word (its last pre-token, at
least its last token) and returns that word's bytes; :class:`HealingProcessor` feeds them to the
model during ``generate`` one by one, letting the model's own scores choose between the next
forced byte and ``<eot>`` at each step (in the fused stream: between that byte's two flags, one
step per byte), so the word is segmented by the student, as it would be had the text gone on,
and nothing after the prompt is invented.

Self-contained on purpose: ``export`` copies this file into the folder as
``tokenization_bytedistill.py`` (loaded with ``trust_remote_code=True``), where bytedistill is not
installed, so it imports only ``tokenizers``, ``transformers`` and ``torch``. What it shares with
the library are marked copies of library modules (``# Copied from …``: the teacher's tokens from
``bytestream/teacher_tokens.py``, the stream's symbols from ``bytestream/stream_symbols.py``, the
healing processor from ``bytestream/healing.py``, ``Stream`` from ``bytestream/stream_kind.py``),
which tests/test_shipped_copies.py holds to their sources. The library imports only the tokenizer
class and its file's names from here (tests/test_layout.py).

Two teacher families: byte-level BPE (GPT-2 byte alphabet: Llama-3, SmolLM2, Qwen, GPT-2) and
SentencePiece with byte fallback (Llama-2, Mistral, Phi-3: ``▁`` is a space, ``<0xNN>`` the byte
NN); another tokenizer family is refused when the tokenizer is loaded.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer
from transformers import (
    BatchEncoding,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedTokenizer,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

# This file runs without the package (an export ships it), so it copies what it needs; each copy
# names its source, and tests/test_shipped_copies.py holds it to that source.
# Copied from bytestream.alphabet: NUM_BYTES, EOT, BOS, EOS, PAD
NUM_BYTES, EOT, BOS, EOS, PAD = 256, 256, 257, 258, 259
# Copied from bytestream.alphabet: SPECIAL_NAMES
SPECIAL_NAMES = {EOT: "<eot>", BOS: "<bos>", EOS: "<eos>", PAD: "<pad>"}
# Copied from bytestream.alphabet: FUSED_ENDS, FUSED_BOS, FUSED_EOS, FUSED_PAD, FUSED_ALPHABET_SIZE
FUSED_ENDS, FUSED_BOS, FUSED_EOS, FUSED_PAD, FUSED_ALPHABET_SIZE = 256, 512, 513, 514, 515
# Copied from bytestream.alphabet: FUSED_SPECIAL_NAMES
FUSED_SPECIAL_NAMES = {FUSED_BOS: "<bos>", FUSED_EOS: "<eos>", FUSED_PAD: "<pad>"}
TEACHER_TOKENIZER_FILE = "teacher_tokenizer.json"
# Copied from bytestream.teacher_tokens: BYTE_LEVEL, BYTE_FALLBACK, BYTE_CHARS, CHAR_BYTES, WORD_BOUNDARY
BYTE_LEVEL, BYTE_FALLBACK = "byte-level", "sentencepiece-byte-fallback"
BYTE_CHARS = bytes_to_unicode()  # byte value -> GPT-2's printable character for it
CHAR_BYTES = {char: value for value, char in BYTE_CHARS.items()}
WORD_BOUNDARY = "\u2581"  # SentencePiece's ▁, a space in the token bytes
# Copied from bytestream.teacher_tokens: _BYTE_PIECE, _ESCAPED
_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_ESCAPED = re.compile("[\udc80-\udcff]+")  # invalid bytes, as ``surrogateescape`` decodes them


# Copied from bytestream.teacher_tokens: utf8_runs
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


# Copied from bytestream.teacher_tokens: spec_steps
def spec_steps(item: dict | None, key: str) -> list[dict]:
    """The steps of a ``tokenizer.json`` normalizer (``key`` "normalizers") or pre-tokenizer
    ("pretokenizers"), with Sequences flattened."""
    if item is None:
        return []
    if item.get("type") == "Sequence":
        return [step for sub in item[key] for step in spec_steps(sub, key)]
    return [item]


# Copied from bytestream.teacher_tokens: tokenizer_family
def tokenizer_family(spec: dict) -> str | None:
    """``BYTE_LEVEL`` (a ByteLevel pre-tokenizer or decoder), ``BYTE_FALLBACK`` (a model with
    ``byte_fallback``), or None: a family whose tokens cannot be mapped to bytes exactly."""
    if '"ByteLevel"' in json.dumps({k: spec.get(k) for k in ("pre_tokenizer", "decoder")}):
        return BYTE_LEVEL
    if spec.get("model", {}).get("byte_fallback"):
        return BYTE_FALLBACK
    return None


# Copied from bytestream.teacher_tokens: sentencepiece_piece_bytes
def sentencepiece_piece_bytes(piece: str) -> bytes:
    """A SentencePiece piece's bytes: ``<0xNN>`` is the byte NN, ``▁`` a space."""
    match = _BYTE_PIECE.match(piece)
    if match:
        return bytes([int(match.group(1), 16)])
    return piece.replace(WORD_BOUNDARY, " ").encode("utf-8")


# Copied from bytestream.teacher_tokens: adds_dummy_prefix
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


# Copied from bytestream.teacher_tokens: without_dummy_prefix
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


# Copied from bytestream.teacher_tokens: _is_prefix_rule
def _is_prefix_rule(step: dict) -> bool:
    pattern = step.get("pattern", {}).get("Regex", "") if step.get("type") == "Replace" else ""
    return step.get("type") == "Prepend" or pattern.startswith(("\\A", "^"))


# ------------------------------------------------------------------ the teacher's tokens


# Copied from bytestream.teacher_tokens: _parsed_teacher
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


# Copied from bytestream.teacher_tokens: TeacherTokens
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


# Copied from bytestream.teacher_tokens: _as_streamed
def _as_streamed(spelled: list[bytes], after_prefix: bool) -> list[bytes]:
    """Token bytes as the stream holds them: the first token's less the dummy prefix space."""
    if after_prefix and spelled:
        return [spelled[0][1:], *spelled[1:]]
    return spelled


# Copied from bytestream.stream_kind: StreamKind as Stream
@dataclass(frozen=True)
class Stream:
    """One stream's symbols, as ``bytestream/stream_kind.py``'s ``StreamKind`` names them. ``eot``: bytes, ``<eot>`` after each teacher token; ``fused``: one
    symbol per text byte, its token's last byte flagged (``FUSED_ENDS + b``), no ``<eot>``."""

    name: str
    bos: int
    eos: int
    pad: int
    eot: int | None
    text_symbols: int  # symbols below this are text bytes (flagged ones included)
    alphabet_size: int  # reserved symbols (a teacher's chat specials) follow: alphabet_size + i

    @property
    def special_names(self) -> dict[int, str]:
        return FUSED_SPECIAL_NAMES if self.eot is None else SPECIAL_NAMES

    def byte_value(self, symbol: int) -> int | None:
        """The text byte a symbol stands for, or None for a special."""
        return int(symbol) % NUM_BYTES if 0 <= int(symbol) < self.text_symbols else None

    def text_bytes(self, symbols) -> bytes:
        """The exact bytes of a symbol sequence: flags and specials dropped."""
        return bytes(b for b in map(self.byte_value, symbols) if b is not None)

    def closes_token(self, symbol: int) -> bool:
        """Whether the teacher's token ends at this symbol: ``<eot>``, a byte flagged "ends", or a
        reserved symbol (one teacher token)."""
        if symbol >= self.alphabet_size:
            return True
        return symbol == self.eot if self.eot is not None else FUSED_ENDS <= symbol < self.text_symbols

    def choices(self, byte: int) -> list[int]:
        """The two symbols a healed prompt byte may take: the byte and ``<eot>``, or its two flags."""
        return [byte, self.eot] if self.eot is not None else [byte, FUSED_ENDS + byte]


STREAMS = {
    "eot": Stream("eot", BOS, EOS, PAD, EOT, NUM_BYTES, PAD + 1),
    "fused": Stream("fused", FUSED_BOS, FUSED_EOS, FUSED_PAD, None, 2 * NUM_BYTES, FUSED_ALPHABET_SIZE),
}


# Copied from bytestream.stream_symbols: stream_symbols
def stream_symbols(spelled: list[bytes | int], stream: Stream, *, bos: bool = True, eos: bool = False) -> list[int]:
    """The ``stream`` of the tokens' bytes: ``[<bos>] bytes(t_1) <eot> … bytes(t_m) <eot> [<eos>]``,
    or in the fused stream each token's bytes with its last one flagged (a token with no bytes, the
    dummy prefix space alone, is context and holds no symbol), or in the bytes stream the bytes alone; a reserved special (an int ``i``,
    as :meth:`TeacherTokens.streamed_tokens` gives it) is the one symbol ``alphabet_size + i``."""
    symbols = [stream.bos] if bos else []
    for spelling in spelled:
        if isinstance(spelling, int):
            symbols.append(stream.alphabet_size + spelling)
        elif stream.eot is not None:
            symbols.extend(spelling)
            symbols.append(stream.eot)
        elif stream.text_symbols > NUM_BYTES:  # the fused stream: the last byte flagged
            symbols.extend(spelling[:-1])
            symbols.extend([FUSED_ENDS + spelling[-1]] if spelling else [])
        else:  # the bytes stream: the bytes alone
            symbols.extend(spelling)
    if eos:
        symbols.append(stream.eos)
    return symbols


# Copied from bytestream.healing: _per_row
def _per_row(items: list, rows: int) -> list:
    """``items`` (one per prompt) for each of ``rows`` rows, as ``generate`` expands prompts: each
    prompt's ``rows // len(items)`` copies next to each other."""
    if not items or rows % len(items):
        raise ValueError(f"a batch of {rows} rows does not expand {len(items)} prompts")
    copies = rows // len(items)
    return [items[row // copies] for row in range(rows)]


# Copied from bytestream.healing: HealingProcessor
class HealingProcessor(LogitsProcessor):
    """Feeds each row's open bytes (its prompt's last word) to ``generate``, for any model.

    Row ``r`` of the batch has ``forced[r]`` still to come after the ``prompt_length`` symbols it
    was given: while some are left, only the next byte's two choices keep their scores (in the
    ``<eot>`` stream the byte and ``<eot>``; in the fused stream the byte flagged "goes on" and
    "ends", one step per byte), so the model's own choice places the token ends inside the word;
    then generation goes on freely. In the ``<eot>`` stream ``<eot>`` never follows ``<bos>`` or
    ``<eot>`` (a token has a byte). ``generate`` expands each prompt's row into consecutive rows
    (``num_return_sequences``, ``num_beams``): row ``r`` of a batch of ``k`` times the prompts is
    prompt ``r // k``'s (:func:`_per_row`).
    """

    def __init__(self, forced: list[bytes], prompt_length: int, stream: Stream):
        self.forced, self.prompt_length, self.stream = list(forced), prompt_length, stream

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        stream = self.stream
        if stream.eot is not None:
            last = input_ids[:, -1]
            empty = (last == stream.eot) | (last == stream.bos) | (last >= stream.alphabet_size)
            scores[empty, stream.eot] = float("-inf")
        produced = (input_ids[:, self.prompt_length :] < stream.text_symbols).sum(-1).tolist()
        for row, (tail, done) in enumerate(zip(_per_row(self.forced, len(produced)), produced)):
            if done < len(tail):
                choices = stream.choices(tail[done])
                kept = scores[row, choices].clone()
                scores[row] = float("-inf")
                scores[row, choices] = kept
        return scores


# the specials that end a turn in the chat templates of the common families (besides the template's
# end-of-text token): ChatML (SmolLM2, Qwen), Llama-3, Gemma, Phi-3
# Copied from bytestream.teacher_tokens: END_OF_TURN_TEXTS
END_OF_TURN_TEXTS = ("<|im_end|>", "<|eot_id|>", "<|end_of_turn|>", "<end_of_turn>", "<|end|>", "<|eom_id|>")


# Copied from bytestream.teacher_tokens: turn_ending_texts
def turn_ending_texts(recorded: list[str] | None, eos_token: str | None) -> set[str | None]:
    """The texts of the reserved symbols that end a turn: as the training store recorded them, else
    (a store of an older version) the teacher's end-of-text text and the usual end-of-turn names."""
    return set(recorded) if recorded is not None else {eos_token, *END_OF_TURN_TEXTS}


FLAG_MARK = "\u23d0"  # the fused stream's "ends" byte: its GPT-2 character followed by this mark


class ByteStreamTokenizer(PreTrainedTokenizer):
    """A ``transformers`` tokenizer whose ids are the student's training stream for the text.

    ``byte_stream`` (saved in ``tokenizer_config.json``) picks the stream the student reads:
    ``"eot"``: ``tokenizer(text).input_ids`` = ``<bos>`` + each teacher token's bytes followed by
    ``<eot>``; ``"fused"``: ``<bos>`` + each teacher token's bytes, its last byte flagged "ends"
    (``FUSED_ENDS + b``). ``add_special_tokens=False`` leaves out ``<bos>``. Tokens are GPT-2's
    character per byte (a flagged byte: that character and ``FLAG_MARK``) and the specials;
    ``decode`` gives each byte once whatever its flag, drops ``<eot>`` with
    ``skip_special_tokens=True`` and shows invalid UTF-8 as U+FFFD (:meth:`text_bytes`: the exact
    bytes).
    """

    # transformers reads these class attributes; ClassVar would need one more import in the shipped file
    vocab_files_names = {"teacher_tokenizer_file": TEACHER_TOKENIZER_FILE}  # noqa: RUF012
    model_input_names = ["input_ids", "attention_mask"]  # noqa: RUF012

    def __init__(
        self,
        teacher_tokenizer_file: str | None = None,
        byte_stream: str = "eot",
        reserved_symbols: list[str] | None = None,
        chat_template_tokens: dict[str, str] | None = None,
        chat_prefix: str | None = None,
        end_of_turn: list[str] | None = None,
        **kwargs,
    ):
        if teacher_tokenizer_file is None:
            raise ValueError(f"ByteStreamTokenizer needs the teacher's tokenizer ({TEACHER_TOKENIZER_FILE})")
        if byte_stream not in STREAMS:
            raise ValueError(f"byte_stream must be one of {', '.join(STREAMS)}, got {byte_stream!r}")
        self.reserved_symbols = list(reserved_symbols or [])
        self.chat_template_tokens = dict(chat_template_tokens or {})
        self.chat_prefix = chat_prefix or ""
        self.end_of_turn = None if end_of_turn is None else list(end_of_turn)
        self.teacher = TeacherTokens.from_file(teacher_tokenizer_file, self.reserved_symbols)
        self.byte_stream, self.stream = byte_stream, STREAMS[byte_stream]
        self._vocab = {char: value for value, char in BYTE_CHARS.items()}
        if self.stream.eot is None:
            self._vocab.update({char + FLAG_MARK: FUSED_ENDS + value for value, char in BYTE_CHARS.items()})
        self._vocab.update({name: symbol for symbol, name in self.stream.special_names.items()})
        reserved_ids = {text: self.stream.alphabet_size + i for i, text in enumerate(self.reserved_symbols)}
        clashes = sorted(set(reserved_ids) & set(self._vocab))
        if clashes:
            raise ValueError(f"the reserved symbol {clashes[0]!r} is already one of the stream's tokens")
        self._vocab.update(reserved_ids)
        self._tokens = {symbol: token for token, symbol in self._vocab.items()}
        self._token_bytes = {
            token: symbol % NUM_BYTES for token, symbol in self._vocab.items() if symbol < self.stream.text_symbols
        }
        names = self.stream.special_names
        kwargs.setdefault("bos_token", names[self.stream.bos])
        kwargs.setdefault("eos_token", names[self.stream.eos])
        kwargs.setdefault("pad_token", names[self.stream.pad])
        kwargs.setdefault("padding_side", "left")  # batches of prompts for generate: padded on the left
        kwargs.pop("additional_special_tokens", None)
        kwargs.pop("extra_special_tokens", None)
        kwargs["clean_up_tokenization_spaces"] = False
        extra = ([] if self.stream.eot is None else [names[self.stream.eot]]) + self.reserved_symbols
        if self.reserved_symbols:  # saved in tokenizer_config.json only for a chat student
            kwargs["reserved_symbols"] = self.reserved_symbols
            kwargs["chat_template_tokens"] = self.chat_template_tokens
            kwargs["chat_prefix"] = self.chat_prefix
            if self.end_of_turn is not None:
                kwargs["end_of_turn"] = self.end_of_turn
        super().__init__(additional_special_tokens=extra, byte_stream=byte_stream, **kwargs)

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    def get_vocab(self) -> dict[str, int]:
        return dict(self._vocab)

    def encode_bytes(self, data: bytes, *, bos: bool = True, eos: bool = False) -> list[int]:
        """The stream of raw document bytes (any bytes, not only valid UTF-8)."""
        return stream_symbols(self.teacher.streamed_tokens(data), self.stream, bos=bos, eos=eos)

    def encode_prompt(self, data: bytes, max_open: int | None = None) -> tuple[list[int], bytes]:
        """A prompt's stream up to its last word (``<bos>`` first), and that word's bytes (at most
        ``max_open`` of them, where the word is longer), to be fed with :class:`HealingProcessor`
        (see :meth:`TeacherTokens.split_prompt`)."""
        committed, open_bytes = self.teacher.split_prompt(data, max_open)
        return stream_symbols(committed, self.stream), open_bytes

    def text_bytes(self, ids) -> bytes:
        """The exact bytes of a symbol sequence (flags and specials dropped; any bytes, not only UTF-8)."""
        return self.stream.text_bytes(int(i) for i in ids)

    def stream_text(self, ids) -> bytes:
        """The bytes a symbol sequence encodes: its text bytes and each reserved symbol's text
        (flags, ``<eot>``, ``<bos>``, ``<eos>`` and ``<pad>`` dropped)."""
        out = bytearray()
        for symbol in map(int, ids):
            reserved = symbol - self.stream.alphabet_size
            if 0 <= reserved < len(self.reserved_symbols):
                out += self.reserved_symbols[reserved].encode("utf-8")
            elif (value := self.stream.byte_value(symbol)) is not None:
                out.append(value)
        return bytes(out)

    @property
    def end_of_turn_ids(self) -> list[int]:
        """The reserved symbols that end a turn (where ``generate`` stops): the ones the training store
        recorded (``end_of_turn``); for a folder exported before it did, those of the teacher's
        end-of-text or usual end-of-turn specials the chat template emits."""
        ends = turn_ending_texts(self.end_of_turn, self.chat_template_tokens.get("eos_token"))
        return [self.stream.alphabet_size + i for i, text in enumerate(self.reserved_symbols) if text in ends]

    def encode_chat(self, text: str) -> list[int]:
        """A conversation rendered by the teacher's chat template as the student's stream: ``<bos>``
        (in place of the text of the token the teacher reads before every document, ``chat_prefix``,
        where the template writes it first), then the text with each reserved special as its symbol
        and the teacher's token ends placed throughout (a rendered conversation ends where the
        teacher's template ends a token). A final end-of-text text that is no reserved symbol (a
        template that closes a whole conversation with the teacher's end of text) is the stream's
        ``<eos>``."""
        data = text.encode("utf-8")
        begin = self.chat_prefix.encode("utf-8")
        if begin and data.startswith(begin):
            data = data[len(begin) :]
        end = self.chat_template_tokens.get("eos_token") or ""
        if end and end not in self.reserved_symbols and data.endswith(end.encode("utf-8")):
            return self.encode_bytes(data[: -len(end.encode("utf-8"))], eos=True)  # the template's end of text
        return self.encode_bytes(data)

    def chat_template_variables(self) -> dict[str, str]:
        """The special-token texts the chat template is rendered with: the teacher's own
        (``chat_template_tokens``) over this tokenizer's."""
        return {**self.special_tokens_map, **self.chat_template_tokens}

    def apply_chat_template(
        self,
        conversation,
        tools=None,
        documents=None,
        chat_template=None,
        add_generation_prompt: bool = False,
        continue_final_message: bool = False,
        tokenize: bool = True,
        padding: bool | str = False,
        truncation: bool = False,
        max_length: int | None = None,
        return_tensors=None,
        return_dict: bool = True,
        return_assistant_tokens_mask: bool = False,
        tokenizer_kwargs=None,
        **kwargs,
    ):
        """The teacher's chat template rendered as the teacher renders it (its own special-token texts,
        ``chat_template_tokens``), then :meth:`encode_chat`: the stream the student was trained on.
        Takes ``transformers``' arguments; a batch of conversations is padded on the left."""
        if return_assistant_tokens_mask:
            raise ValueError("return_assistant_tokens_mask is not supported by the byte stream tokenizer")
        rendered = super().apply_chat_template(
            conversation,
            tools=tools,
            documents=documents,
            chat_template=chat_template,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tokenize=False,
            **{**self.chat_template_variables(), **kwargs},
        )
        if not tokenize:
            return rendered
        batched = not isinstance(rendered, str)
        streams = [self.encode_chat(text) for text in (rendered if batched else [rendered])]
        if truncation and max_length is not None:
            streams = [stream[-max_length:] for stream in streams]
        if not (return_dict or return_tensors):
            return streams if batched else streams[0]
        if return_tensors is not None or padding not in (False, "do_not_pad"):
            input_ids, attention_mask = _left_padded(streams, None, self.stream.pad)
            if return_tensors is None:
                input_ids, attention_mask = input_ids.tolist(), attention_mask.tolist()
        else:
            input_ids, attention_mask = streams, [[1] * len(stream) for stream in streams]
        if not batched and return_tensors is None:
            input_ids, attention_mask = input_ids[0], attention_mask[0]
        encoding = BatchEncoding({"input_ids": input_ids, "attention_mask": attention_mask})
        return encoding if return_dict else encoding["input_ids"]

    def healing(self, forced: list[bytes], prompt_length: int) -> HealingProcessor:
        """The processor that feeds ``forced`` after ``prompt_length`` symbols, in this tokenizer's stream."""
        return HealingProcessor(forced, prompt_length, self.stream)

    def prompt(self, text: str | list[str], padding: bool | str = True) -> BatchEncoding:
        """Prompts ready for ``model.generate(**tokenizer.prompt(text), …)``: ``input_ids`` and
        ``attention_mask`` (tensors, padded on the left) of each prompt's stream up to its last
        word, and a ``logits_processor`` that feeds that word's bytes with the model placing the
        token ends; the output then holds the whole prompt and its continuation (``input_ids``
        alone, without the processor, stop before that word). Prompts of different lengths are
        always padded (``padding=False`` refuses them instead)."""
        texts = [text] if isinstance(text, str) else list(text)
        streams, forced = zip(*(self.encode_prompt(t.encode("utf-8")) for t in texts)) if texts else ((), ())
        if padding in (False, "do_not_pad") and len(set(map(len, streams))) > 1:
            raise ValueError("the prompts' streams differ in length: give padding=True (left padding)")
        input_ids, attention_mask = _left_padded(list(streams), None, self.stream.pad)
        encoding = BatchEncoding({"input_ids": input_ids, "attention_mask": attention_mask})
        encoding["logits_processor"] = LogitsProcessorList([self.healing(list(forced), input_ids.shape[1])])
        return encoding

    def generate(self, model, input_ids: torch.LongTensor, attention_mask=None, **kwargs) -> torch.LongTensor:
        """``model.generate`` for complete streams (``tokenizer(text)``, as lm-evaluation-harness
        passes prompts), healed: each row that is exactly this tokenizer's stream of its bytes is cut
        back to its last word, which is fed as :meth:`prompt` feeds it (first pass); the rest is
        generated with the caller's settings (keywords or a ``generation_config``), stopping
        criteria and streamer (second pass), and the output is in the caller's frame: its
        ``input_ids``, then the continuation (the streamer, too, is shown the caller's input first).
        Rows may be padded on the left (``attention_mask``); each is healed on its own. Inputs that
        already carry a :class:`HealingProcessor`, or ask for ``return_dict_in_generate``, pass
        through unchanged."""
        stock = type(model).generate  # an instance's generate may be this method, bound by the folder
        processors = list(kwargs.get("logits_processor") or [])
        config = kwargs.get("generation_config")
        if (
            kwargs.get("return_dict_in_generate")
            or getattr(config, "return_dict_in_generate", False)
            or any(type(p).__name__ == "HealingProcessor" for p in processors)
        ):
            return stock(model, input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        pad, text_symbols = self.stream.pad, self.stream.text_symbols
        rows = _unpadded_rows(input_ids, attention_mask, pad)
        split = [self._split_stream(row) for row in rows]
        if not any(open_bytes for _, open_bytes in split):
            return stock(model, input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        sampling = {k: v for k, v in kwargs.items() if k not in _LENGTH_AND_STOPPING}
        if config is not None:
            sampling["generation_config"] = _without_length(config)
        first, first_mask = _left_padded([committed for committed, _ in split], input_ids.device, pad)
        forced = [open_bytes for _, open_bytes in split]
        fed = stock(  # a row per prompt and return sequence (num_return_sequences), each healed on its own
            model,
            input_ids=first,
            attention_mask=first_mask,
            logits_processor=LogitsProcessorList([*processors, self.healing(forced, first.shape[1])]),
            stopping_criteria=StoppingCriteriaList([_Fed(forced, first.shape[1], text_symbols)]),
            max_new_tokens=2 * max(len(f) for f in forced),
            min_new_tokens=0,
            **{**sampling, "pad_token_id": pad},
        )
        healed = [
            c + _until_fed(fed[r, first.shape[1] :].tolist(), len(open_bytes), text_symbols)
            for r, (c, open_bytes) in enumerate(_per_row(split, fed.shape[0]))
        ]
        callers = input_ids.repeat_interleave(len(healed) // len(split), dim=0)  # the caller's rows, expanded
        second, second_mask = _left_padded(healed, input_ids.device, pad)
        start = second.shape[1]
        kwargs["num_return_sequences"] = 1  # each healed row is one of the sequences asked for
        kwargs["stopping_criteria"] = StoppingCriteriaList(
            [_InCallersFrame(c, callers, start) for c in kwargs.get("stopping_criteria") or []]
        )
        length = kwargs.get("max_length")
        if length is None and config is not None and kwargs.get("max_new_tokens") is None:
            length = config.max_length if config.max_new_tokens is None else None
        if length is not None:
            kwargs["max_length"] = length - input_ids.shape[1] + start
        if kwargs.get("streamer") is not None:
            kwargs["streamer"] = _CallersPrompt(kwargs["streamer"], input_ids)
        kwargs["logits_processor"] = LogitsProcessorList([*processors, self.healing([b""] * len(healed), start)])
        output = stock(model, input_ids=second, attention_mask=second_mask, **kwargs)
        return torch.cat([callers, output[:, start:]], dim=1)

    def _split_stream(self, row: list[int]) -> tuple[list[int], bytes]:
        """A row as (committed stream, open bytes): healed when it is this tokenizer's stream of its
        bytes, or (cut on the left, as lm-evaluation-harness truncates long prompts) when what
        follows its first token end (``<eot>``, or a byte flagged "ends") is the stream of those bytes."""
        stream = self.stream
        ends = [i for i, symbol in enumerate(row) if stream.closes_token(symbol)][:1]
        start = 0 if row[:1] == [stream.bos] else ends[0] + 1 if ends else len(row)
        tail = row[start:]
        data = self.stream_text(tail)
        own = stream_symbols(self.teacher.streamed_tokens(data), stream, bos=start == 0)
        if not data or tail != own:
            return row, b""
        committed, open_bytes = self.teacher.split_prompt(data)
        return row[:start] + stream_symbols(committed, stream, bos=start == 0), open_bytes

    def tokenize(self, text: str, **kwargs) -> list[str]:
        data = text.encode("utf-8")
        begin = self.chat_prefix.encode("utf-8")
        if begin and data.startswith(begin):  # a rendered conversation's first token is the stream's <bos>
            data = data[len(begin) :]
        symbols = self.encode_bytes(data, bos=False)
        return [self._tokens[s] for s in symbols]

    def _convert_token_to_id(self, token: str) -> int:
        return self._vocab[token]

    def _convert_id_to_token(self, index: int) -> str:
        return self._tokens[int(index)]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        parts: list[str] = []
        pending = bytearray()
        for token in tokens:
            if token in self._token_bytes:
                pending.append(self._token_bytes[token])
                continue
            parts.append(pending.decode("utf-8", errors="replace"))
            pending.clear()
            parts.append(token)
        parts.append(pending.decode("utf-8", errors="replace"))
        return "".join(parts)

    def build_inputs_with_special_tokens(
        self, token_ids_0: list[int], token_ids_1: list[int] | None = None
    ) -> list[int]:
        return [self.stream.bos] + token_ids_0 + (token_ids_1 or [])

    def get_special_tokens_mask(self, token_ids_0, token_ids_1=None, already_has_special_tokens=False) -> list[int]:
        if already_has_special_tokens:
            return [1 if t >= self.stream.text_symbols else 0 for t in token_ids_0 + (token_ids_1 or [])]
        return [1] + [0] * (len(token_ids_0) + len(token_ids_1 or []))

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return 1

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        path = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "") + TEACHER_TOKENIZER_FILE)
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.teacher.tokenizer_json)
        return (path,)


_LENGTH_AND_STOPPING = (
    "max_length",
    "max_new_tokens",
    "min_length",
    "min_new_tokens",
    "stopping_criteria",
    "logits_processor",
    "streamer",
    "generation_config",
)


def _without_length(config):
    """A copy of a ``GenerationConfig`` with no length or stop of its own (the first pass sets them)."""
    config = type(config).from_dict(config.to_dict())
    config.max_new_tokens, config.min_new_tokens, config.min_length = None, None, 0
    config.stop_strings = None
    return config


class _CallersPrompt:
    """A streamer shown the caller's input as the prompt (the first ``put``), then what is generated."""

    def __init__(self, inner, caller_ids: torch.LongTensor):
        self.inner, self.caller_ids, self.started = inner, caller_ids, False

    def put(self, value):
        if not self.started:
            self.started, value = True, self.caller_ids.cpu()
        self.inner.put(value)

    def end(self):
        self.inner.end()


def _unpadded_rows(input_ids: torch.LongTensor, attention_mask, pad: int) -> list[list[int]]:
    if attention_mask is None:
        attention_mask = input_ids != pad
    return [[s for s, keep in zip(row, mask) if keep] for row, mask in zip(input_ids.tolist(), attention_mask.tolist())]


def _left_padded(rows: list[list[int]], device, pad: int) -> tuple[torch.LongTensor, torch.LongTensor]:
    length = max(map(len, rows), default=0)
    ids = torch.tensor([[pad] * (length - len(r)) + r for r in rows], dtype=torch.long, device=device)
    mask = torch.tensor([[0] * (length - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=device)
    return ids, mask


def _until_fed(symbols: list[int], count: int, text_symbols: int) -> list[int]:
    """The symbols up to and including the ``count``-th byte."""
    seen = 0
    for i, symbol in enumerate(symbols):
        if seen == count:
            return symbols[:i]
        seen += symbol < text_symbols
    return symbols


class _Fed(StoppingCriteria):
    """A row is done once its forced bytes are all fed."""

    def __init__(self, forced: list[bytes], prompt_length: int, text_symbols: int):
        self.counts = [len(f) for f in forced]
        self.prompt_length, self.text_symbols = prompt_length, text_symbols

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        produced = (input_ids[:, self.prompt_length :] < self.text_symbols).sum(-1)
        counts = torch.tensor(_per_row(self.counts, len(produced)), device=produced.device)
        return produced >= counts


class _InCallersFrame(StoppingCriteria):
    """A caller's stopping criterion, shown the caller's input followed by what was generated."""

    def __init__(self, inner, caller_ids: torch.LongTensor, start: int):
        self.inner, self.caller_ids, self.start = inner, caller_ids, start

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs):
        callers = self.caller_ids.repeat_interleave(len(input_ids) // len(self.caller_ids), dim=0)  # beams
        return self.inner(torch.cat([callers, input_ids[:, self.start :]], dim=1), scores, **kwargs)


def auto_map() -> dict[str, list[str | None]]:
    """The ``tokenizer_config.json`` entry that makes ``AutoTokenizer(..., trust_remote_code=True)`` load this class."""
    return {"AutoTokenizer": [f"tokenization_bytedistill.{ByteStreamTokenizer.__name__}", None]}
