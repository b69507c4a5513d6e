"""Teacher vocabularies as byte strings.

:class:`TeacherVocab` is what the rest of the toolkit needs to know about a teacher's tokenizer:
the byte string of every id, which ids are special, which are end-of-text, and a stable hash.
It is built from a Hugging Face ``tokenizers`` object, which :func:`load_teacher_tokenizer` gets
from a ``tokenizer.json``, a model folder / Hub id, or a GGUF file (all through ``transformers``).

Two families are understood (docs/DESIGN.md, "Tokenizer families"):

* byte-level BPE (GPT-2, Llama-3, SmolLM, Qwen): each character of a token stands for one byte
  through the GPT-2 byte↔unicode table;
* SentencePiece with byte fallback (Llama-2, Mistral): ``▁`` is a space and ``<0xNN>`` is the
  byte NN; several ids may share one byte string.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
from tokenizers.pre_tokenizers import ByteLevel

from bytestream.teacher_tokens import (
    BYTE_FALLBACK,
    BYTE_LEVEL,
    adds_dummy_prefix,
    sentencepiece_piece_bytes,
    tokenizer_family,
)
from common.errors import UserError

# Names of end-of-text tokens; their mass becomes the student's <eos>.
# The tag of the dummy-prefix rules a vocabulary's conversion follows (its space is context, not
# stream): hashed into every vocabulary with a dummy prefix, so that stores converted under other
# rules do not match. Change the tag whenever those rules change.
DUMMY_PREFIX_RULES = b"space-is-context|"
END_OF_TEXT_NAMES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "<|eot_id|>", "<|im_end|>")


def gpt2_unicode_to_byte() -> dict[str, int]:
    """GPT-2's unicode→byte table, from the ``tokenizers`` ByteLevel alphabet: printable bytes are
    their own character, the other bytes take the code points from 256 up, in byte order."""
    chars = sorted(ByteLevel.alphabet())
    direct = {c: ord(c) for c in chars if ord(c) < 256}
    shifted = [c for c in chars if ord(c) >= 256]
    rest = sorted(set(range(256)) - set(direct.values()))
    return direct | dict(zip(shifted, rest))


@dataclass(frozen=True)
class TeacherVocab:
    """The byte view of a teacher's vocabulary.

    ``token_bytes[i]`` is the byte string of id ``i``; special ids have ``b""``.
    """

    token_bytes: tuple[bytes, ...]
    special_ids: tuple[int, ...]
    end_of_text_ids: tuple[int, ...]
    family: str
    prefix_ids: tuple[int, ...] = ()  # what the teacher puts before a document (its BOS), if any
    name: str = ""
    adds_prefix_space: bool = False  # SentencePiece's dummy prefix: the first token starts with b" "
    output_padding: int = 0  # ids past the tokenizer's (a padded output layer): special, mass dropped
    kept_ids: tuple[int, ...] = ()  # specials kept as reserved stream symbols, in symbol order (chat stores)

    @property
    def size(self) -> int:
        return len(self.token_bytes)

    @cached_property
    def regular_ids(self) -> np.ndarray:
        special = np.zeros(self.size, dtype=bool)
        special[list(self.special_ids)] = True
        return np.flatnonzero(~special)

    @cached_property
    def dropped_ids(self) -> np.ndarray:
        """Special ids whose mass is renormalised away (all specials but end-of-text and the kept ones)."""
        keep = set(self.end_of_text_ids) | set(self.kept_ids)
        return np.array([i for i in self.special_ids if i not in keep], dtype=np.int64)

    @cached_property
    def single_byte_ids(self) -> np.ndarray:
        """For each byte value, the lowest regular id whose byte string is that one byte (-1 if none)."""
        table = np.full(256, -1, dtype=np.int64)
        for i in self.regular_ids[::-1]:
            b = self.token_bytes[i]
            if len(b) == 1:
                table[b[0]] = i
        return table

    @cached_property
    def hash(self) -> str:
        """SHA-256 of everything that determines the conversion: bytes, specials, end-of-text."""
        h = hashlib.sha256()
        h.update(f"{self.family}|{self.size}|{self.special_ids}|{self.end_of_text_ids}|".encode())
        h.update(f"{self.prefix_ids}|{self.adds_prefix_space}|".encode())
        if self.adds_prefix_space:
            h.update(DUMMY_PREFIX_RULES)
        if self.kept_ids:  # a vocabulary without kept specials hashes as it always did
            h.update(f"kept|{self.kept_ids}|".encode())
        for b in self.token_bytes:
            h.update(len(b).to_bytes(4, "little"))
            h.update(b)
        return h.hexdigest()

    def bytes_of(self, ids) -> bytes:
        return b"".join(self.token_bytes[int(i)] for i in ids)

    def with_kept(self, kept_ids) -> TeacherVocab:
        """This vocabulary with the special ids ``kept_ids`` kept as reserved stream symbols, in
        that order (docs/DESIGN.md, "Conversations"): their mass is neither dropped nor end of
        text. A kept end-of-text id stops being end of text, unless it is the last one: a teacher
        whose only end-of-text token also closes its turns (Mistral's ``</s>``) keeps it as
        ``<eos>``, so it is not among the kept ids."""
        kept = [int(i) for i in kept_ids]
        special = set(self.special_ids)
        if any(i not in special for i in kept) or len(set(kept)) != len(kept):
            raise ValueError(f"kept ids {kept} must be distinct special ids")
        end_of_text = tuple(i for i in self.end_of_text_ids if i not in kept)
        if not end_of_text:
            end_of_text = self.end_of_text_ids
            kept = [i for i in kept if i not in end_of_text]
        return dataclasses.replace(self, kept_ids=tuple(kept), end_of_text_ids=end_of_text)

    def padded_to(self, rows: int) -> TeacherVocab:
        """This vocabulary extended to an output layer of ``rows`` rows (Qwen2.5 pads its layer
        past the tokenizer's ids): the extra ids are specials, so their mass is dropped."""
        extra = rows - self.size
        return dataclasses.replace(
            self,
            token_bytes=self.token_bytes + (b"",) * extra,
            special_ids=self.special_ids + tuple(range(self.size, rows)),
            output_padding=self.output_padding + extra,
        )


def _piece_to_bytes_byte_level(piece: str, table: dict[str, int]) -> bytes:
    try:
        return bytes(table[ch] for ch in piece)
    except KeyError as exc:
        raise UserError(
            f"token {piece!r} cannot be mapped to bytes: character {exc.args[0]!r} is not in the "
            "GPT-2 byte table (is this really a byte-level BPE tokenizer?)"
        ) from None


def _detect_family(spec: dict) -> str:
    family = tokenizer_family(spec)
    if family is None:
        model = spec.get("model", {})
        raise UserError(
            f"unsupported tokenizer ({model.get('type', '?')} model without a ByteLevel pre-tokenizer "
            "or byte_fallback): its tokens cannot be mapped to bytes exactly"
        )
    return family


def _model_vocab(spec: dict) -> dict[str, int]:
    model = spec["model"]
    vocab = model.get("vocab")
    if isinstance(vocab, dict):
        return vocab
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        return {piece: i for i, (piece, _score) in enumerate(vocab)}
    raise UserError(f"tokenizer model of type {model.get('type')!r} has no readable vocabulary")


def vocab_from_tokenizer(tokenizer, *, name: str = "", end_of_text: list[str] | None = None) -> TeacherVocab:
    """Build the byte view of a ``tokenizers.Tokenizer`` (or a ``transformers`` fast tokenizer).

    ``end_of_text`` names the end-of-text token(s); by default every token in
    :data:`END_OF_TEXT_NAMES` that exists, plus the tokenizer's own ``eos_token``.
    """
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    view = _byte_view(backend.to_str(), backend.get_vocab_size(with_added_tokens=True))
    names = list(end_of_text) if end_of_text else list(END_OF_TEXT_NAMES)
    eos_token = getattr(tokenizer, "eos_token", None)
    if not end_of_text and eos_token:
        names.append(eos_token)
    eot_ids = sorted({view.special_by_name[n] for n in names if n in view.special_by_name})
    if end_of_text and len(eot_ids) != len(set(end_of_text)):
        missing = [n for n in end_of_text if n not in view.special_by_name]
        raise UserError(f"end-of-text token(s) {missing} are not special tokens of this tokenizer")
    if not eot_ids:
        raise UserError("the tokenizer has no end-of-text token; name one with --end-of-text")
    return TeacherVocab(
        token_bytes=view.token_bytes,
        special_ids=view.special_ids,
        end_of_text_ids=tuple(eot_ids),
        family=view.family,
        prefix_ids=tuple(_prefix_ids(tokenizer, backend, view.special_by_name, view.templated)),
        name=name,
        adds_prefix_space=view.adds_prefix_space,
    )


@dataclass(frozen=True)
class _ByteView:
    """What a ``tokenizer.json`` alone says of its ids: their bytes, the special ones, the ids of
    added tokens and special pieces by name (read only: shared by every vocabulary of the text)."""

    family: str
    token_bytes: tuple[bytes, ...]
    special_ids: tuple[int, ...]
    special_by_name: dict[str, int]
    adds_prefix_space: bool
    templated: bool = False  # its post-processor has a template (it says what goes before a document)


@functools.lru_cache(maxsize=4)
def _byte_view(spec_text: str, backend_size: int) -> _ByteView:
    """The byte view of a tokenizer's spec, built once per process and spec (seconds for a
    128k-token vocabulary: a dump, an export and a score each read the teacher's)."""
    spec = json.loads(spec_text)
    family = _detect_family(spec)
    model_ids = _model_vocab(spec)
    added = {tok["id"]: tok for tok in spec.get("added_tokens", [])}
    size = max(backend_size, max(model_ids.values()) + 1, max(added, default=-1) + 1)

    table = gpt2_unicode_to_byte()
    token_bytes: list[bytes | None] = [None] * size
    special: list[int] = []
    for piece, i in model_ids.items():
        if i in added:
            continue
        if family == BYTE_LEVEL:
            token_bytes[i] = _piece_to_bytes_byte_level(piece, table)
        else:
            token_bytes[i] = sentencepiece_piece_bytes(piece)
    for i, tok in added.items():
        if tok.get("special", False):
            token_bytes[i] = b""
            special.append(i)
        else:  # a non-special added token is matched on the raw text
            token_bytes[i] = tok["content"].encode("utf-8")
    for i, b in enumerate(token_bytes):
        if b is None:  # an id the vocabulary never names: unusable, so never predicted
            token_bytes[i] = b""
            special.append(i)
        elif len(b) == 0 and i not in special:
            special.append(i)
    if family == BYTE_FALLBACK:  # <unk>, <s>, </s> are control pieces
        for piece in ("<unk>", "<s>", "</s>", "<pad>"):
            i = model_ids.get(piece)
            if i is not None and i not in special:
                token_bytes[i] = b""
                special.append(i)
    special_set = set(special)
    by_name = {tok["content"]: i for i, tok in added.items()} | {p: i for p, i in model_ids.items() if i in special_set}
    return _ByteView(
        family=family,
        token_bytes=tuple(token_bytes),  # type: ignore[arg-type]
        special_ids=tuple(sorted(special_set)),
        special_by_name=by_name,
        adds_prefix_space=adds_dummy_prefix(spec),
        templated=_has_template(spec.get("post_processor")),
    )


def _prefix_ids(tokenizer, backend, special_by_name: dict[str, int], templated: bool = False) -> list[int]:
    """Ids the teacher expects before a document: what the post-processor puts before a single
    sequence, else the BOS a ``transformers`` tokenizer adds, else Llama-3's ``<|begin_of_text|>``
    for a bare ``tokenizer.json`` (whose BOS ``transformers`` adds from its config) unless its
    post-processor has a template (``templated``: the file says what goes before a document, as
    the teacher tokenizer an export ships does, :func:`with_prefix_template`)."""
    with_special = backend.encode("a", add_special_tokens=True).ids
    without = backend.encode("a", add_special_tokens=False).ids
    for start in range(len(with_special) - len(without) + 1):
        if with_special[start : start + len(without)] == without and start > 0:
            return with_special[:start]
    if tokenizer is not backend:
        bos = getattr(tokenizer, "bos_token_id", None)
        return [bos] if getattr(tokenizer, "add_bos_token", False) and bos is not None else []
    bos = special_by_name.get("<|begin_of_text|>")
    return [bos] if bos is not None and not templated else []


def _has_template(processor) -> bool:
    """Whether a ``tokenizer.json`` post-processor (or one of a sequence of them) is a template."""
    if not isinstance(processor, dict):
        return False
    if processor.get("type") == "Sequence":
        return any(_has_template(p) for p in processor.get("processors") or [])
    return processor.get("type") in ("TemplateProcessing", "BertProcessing", "RobertaProcessing")


def with_prefix_template(spec: dict, prefix_ids: tuple[int, ...] | list[int]) -> dict | None:
    """``spec`` (a ``tokenizer.json``) whose post-processor puts exactly ``prefix_ids`` before a
    document (none: nothing), so that the file read alone names the prefix a teacher read; its
    byte-level post-processor, if any, is kept. None if a prefix id has no name in the file."""
    names = {i: piece for piece, i in _model_vocab(spec).items()} | {
        token["id"]: token["content"] for token in spec.get("added_tokens", [])
    }
    if any(i not in names for i in prefix_ids):
        return None
    tokens = [names[i] for i in prefix_ids]
    single = [{"SpecialToken": {"id": name, "type_id": 0}} for name in tokens]
    single.append({"Sequence": {"id": "A", "type_id": 0}})
    template = {
        "type": "TemplateProcessing",
        "single": single,
        "pair": [*single, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {name: {"id": name, "ids": [i], "tokens": [name]} for name, i in zip(tokens, prefix_ids)},
    }
    existing = spec.get("post_processor")
    sequence = isinstance(existing, dict) and existing.get("type") == "Sequence"
    members = (existing.get("processors") or []) if sequence else [existing]
    byte_level = [p for p in members if isinstance(p, dict) and p.get("type") == "ByteLevel"]
    processor = {"type": "Sequence", "processors": [*byte_level, template]} if byte_level else template
    return {**spec, "post_processor": processor}


def split_gguf_path(source: str | Path, gguf_file: str | None) -> tuple[str, str | None]:
    """``path/to/model.gguf`` → (``path/to``, ``model.gguf``); other sources pass through."""
    path = Path(source)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise UserError(f"GGUF file not found: {path}")
        return str(path.parent), path.name
    return str(source), gguf_file


def load_teacher_tokenizer(source: str | Path, gguf_file: str | None = None):
    """A ``transformers`` fast tokenizer (or a bare ``tokenizers.Tokenizer`` for a tokenizer.json).

    ``source`` may be a ``tokenizer.json``, a model folder or Hub id, or a ``.gguf`` file (or a
    folder with ``gguf_file`` naming the file in it).
    """
    path = Path(source)
    if path.suffix == ".json":
        if not path.is_file():
            raise UserError(f"tokenizer file not found: {path}")
        from tokenizers import Tokenizer

        try:
            return Tokenizer.from_file(str(path))
        except Exception as exc:
            raise UserError(f"cannot read tokenizer {path}: {str(exc).splitlines()[0]}") from exc
    source, gguf_file = split_gguf_path(source, gguf_file)
    path = Path(source)
    from transformers import AutoTokenizer

    looks_local = path.exists() or str(source).startswith((".", "/")) or str(source).count("/") > 1
    if looks_local and not path.exists():
        raise UserError(f"tokenizer folder not found: {path}")
    try:
        kwargs = {"gguf_file": gguf_file} if gguf_file else {}
        tokenizer = AutoTokenizer.from_pretrained(str(path if path.exists() else source), **kwargs)
    except Exception as exc:  # transformers raises many types for a bad source
        raise UserError(f"cannot load a tokenizer from {source}: {str(exc).splitlines()[0]}") from exc
    if not getattr(tokenizer, "is_fast", False):
        raise UserError(f"{source}: only fast (tokenizers-backed) tokenizers are supported")
    return tokenizer
