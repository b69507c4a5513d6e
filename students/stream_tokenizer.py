"""Text → the student's training stream, exactly: ``<bos> bytes(t_1) <eot> bytes(t_2) <eot> …``.

The student was trained on streams whose ``<eot>`` marks sit where the teacher's tokenizer ended
its tokens (docs/DESIGN.md, "where <eot> comes from at inference"). This module places them: it
runs the teacher's own tokenizer (its ``tokenizer.json``, shipped in the exported folder as
``teacher_tokenizer.json``) only to find the token boundaries; the student still reads every byte.
Encoding follows the dump's rules: literal special-token text is text, and bytes that are not
valid UTF-8 become one single-byte token each, so the stream's bytes always equal the document.

Self-contained on purpose: ``export`` copies this file into the folder as
``tokenization_bytedistill.py`` (loaded with ``trust_remote_code=True``), where bytedistill is not
installed, so it imports only ``tokenizers`` and ``transformers``. The library uses the same
module (``score``, ``generate``), so there is one implementation.

Byte-level BPE teachers (GPT-2 byte alphabet: Llama-3, SmolLM2, Qwen, GPT-2) only; another
tokenizer family is refused when the tokenizer is loaded.
"""

from __future__ import annotations

import json
import os
import re

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

NUM_BYTES, EOT, BOS, EOS, PAD = 256, 256, 257, 258, 259
SPECIAL_NAMES = {EOT: "<eot>", BOS: "<bos>", EOS: "<eos>", PAD: "<pad>"}
TEACHER_TOKENIZER_FILE = "teacher_tokenizer.json"
BYTE_CHARS = bytes_to_unicode()  # byte value -> GPT-2's printable character for it
CHAR_BYTES = {char: value for value, char in BYTE_CHARS.items()}
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


class TeacherTokens:
    """The teacher's tokenization of document bytes, as each token's bytes."""

    def __init__(self, tokenizer_json: str):
        self.tokenizer_json = tokenizer_json  # as given, for saving
        self._tokenizer = Tokenizer.from_str(tokenizer_json)
        self._tokenizer.encode_special_tokens = True  # literal "<|begin_of_text|>" is text
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        spec = json.loads(tokenizer_json)
        if not (_has_byte_level(spec.get("pre_tokenizer")) or _has_byte_level(spec.get("decoder"))):
            raise ValueError(
                "the teacher tokenizer is not a byte-level BPE (no ByteLevel pre-tokenizer or decoder); "
                "its <eot> marks cannot be placed exactly"
            )

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> TeacherTokens:
        with open(path, encoding="utf-8") as f:
            return cls(f.read())

    def _single_byte(self, value: int) -> bytes:
        """A byte outside valid UTF-8 is its own token, as in the dump; refused if the vocabulary has none."""
        if self._tokenizer.token_to_id(BYTE_CHARS[value]) is None:
            raise ValueError(f"the teacher vocabulary has no token for the byte 0x{value:02X}")
        return bytes([value])

    def pieces(self, data: bytes) -> list[bytes]:
        """The bytes of each teacher token of ``data``; their concatenation is ``data`` (checked)."""
        out: list[bytes] = []
        for valid, run in utf8_runs(data):
            if not valid:
                out.extend(self._single_byte(b) for b in run)
                continue
            for token in self._tokenizer.encode(run.decode("utf-8"), add_special_tokens=False).tokens:
                if any(char not in CHAR_BYTES for char in token):
                    raise ValueError(f"the teacher tokenizer produced {token!r}, which is not byte-level text")
                out.append(bytes(CHAR_BYTES[char] for char in token))
        joined = b"".join(out)
        if joined != data:
            at = next((i for i, (a, b) in enumerate(zip(joined, data)) if a != b), min(len(joined), len(data)))
            raise ValueError(
                f"the teacher tokenizer does not reproduce the text's bytes (first difference at byte {at})"
            )
        return out


def _has_byte_level(component) -> bool:
    """Whether a tokenizer.json component (or a Sequence of them) is ByteLevel."""
    if isinstance(component, dict):
        if component.get("type") == "ByteLevel":
            return True
        return any(_has_byte_level(c) for key in ("pretokenizers", "decoders") for c in component.get(key) or [])
    return False


def stream_symbols(pieces: list[bytes], *, bos: bool = True, eos: bool = False) -> list[int]:
    """``[<bos>] bytes(t_1) <eot> … bytes(t_m) <eot> [<eos>]``: the training stream of the pieces."""
    symbols = [BOS] if bos else []
    for piece in pieces:
        symbols.extend(piece)
        symbols.append(EOT)
    if eos:
        symbols.append(EOS)
    return symbols


class ByteStreamTokenizer(PreTrainedTokenizer):
    """A ``transformers`` tokenizer whose ids are the student's training stream for the text.

    ``tokenizer(text).input_ids`` = ``<bos>`` + each teacher token's bytes followed by ``<eot>``
    (``add_special_tokens=False``: without ``<bos>``). Tokens are GPT-2's character per byte and
    the four specials, as in the folder's plain byte tokenizer; ``decode`` drops ``<eot>`` with
    ``skip_special_tokens=True`` and shows invalid UTF-8 as U+FFFD.
    """

    # transformers reads these class attributes; ClassVar would need one more import in the shipped file
    vocab_files_names = {"teacher_tokenizer_file": TEACHER_TOKENIZER_FILE}  # noqa: RUF012
    model_input_names = ["input_ids", "attention_mask"]  # noqa: RUF012

    def __init__(self, teacher_tokenizer_file: str | None = None, **kwargs):
        if teacher_tokenizer_file is None:
            raise ValueError(f"ByteStreamTokenizer needs the teacher's tokenizer ({TEACHER_TOKENIZER_FILE})")
        self.teacher = TeacherTokens.from_file(teacher_tokenizer_file)
        self._vocab = {char: value for value, char in BYTE_CHARS.items()}
        self._vocab.update({name: symbol for symbol, name in SPECIAL_NAMES.items()})
        self._tokens = {symbol: token for token, symbol in self._vocab.items()}
        kwargs.setdefault("bos_token", SPECIAL_NAMES[BOS])
        kwargs.setdefault("eos_token", SPECIAL_NAMES[EOS])
        kwargs.setdefault("pad_token", SPECIAL_NAMES[PAD])
        kwargs.pop("additional_special_tokens", None)
        kwargs.pop("extra_special_tokens", None)
        kwargs["clean_up_tokenization_spaces"] = False
        super().__init__(additional_special_tokens=[SPECIAL_NAMES[EOT]], **kwargs)

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    def get_vocab(self) -> dict[str, int]:
        return dict(self._vocab)

    def encode_bytes(self, data: bytes, *, bos: bool = True, eos: bool = False) -> list[int]:
        """The stream of raw document bytes (any bytes, not only valid UTF-8)."""
        return stream_symbols(self.teacher.pieces(data), bos=bos, eos=eos)

    def tokenize(self, text: str, **kwargs) -> list[str]:
        symbols = self.encode_bytes(text.encode("utf-8"), bos=False)
        return [self._tokens[s] for s in symbols]

    def _convert_token_to_id(self, token: str) -> int:
        return self._vocab[token]

    def _convert_id_to_token(self, index: int) -> str:
        return self._tokens[int(index)]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        parts: list[str] = []
        pending = bytearray()
        for token in tokens:
            if token in CHAR_BYTES:
                pending.append(CHAR_BYTES[token])
                continue
            parts.append(pending.decode("utf-8", errors="replace"))
            pending.clear()
            parts.append(token)
        parts.append(pending.decode("utf-8", errors="replace"))
        return "".join(parts)

    def build_inputs_with_special_tokens(
        self, token_ids_0: list[int], token_ids_1: list[int] | None = None
    ) -> list[int]:
        return [BOS] + token_ids_0 + (token_ids_1 or [])

    def get_special_tokens_mask(self, token_ids_0, token_ids_1=None, already_has_special_tokens=False) -> list[int]:
        if already_has_special_tokens:
            return [1 if t >= NUM_BYTES else 0 for t in token_ids_0 + (token_ids_1 or [])]
        return [1] + [0] * (len(token_ids_0) + len(token_ids_1 or []))

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return 1

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        path = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "") + TEACHER_TOKENIZER_FILE)
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.teacher.tokenizer_json)
        return (path,)


def auto_map() -> dict[str, list[str | None]]:
    """The ``tokenizer_config.json`` entry that makes ``AutoTokenizer(..., trust_remote_code=True)`` load this class."""
    return {"AutoTokenizer": [f"tokenization_bytedistill.{ByteStreamTokenizer.__name__}", None]}
