"""The teacher tokenizer an export ships: the one the training store was dumped with, checked
against the store's vocabulary (the student learnt that teacher's ``<eot>`` marks and no other)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from bytestream.teacher_tokens import TeacherTokens
from bytestream.vocab import TeacherVocab
from common.errors import UserError


def training_stores(info: dict[str, Any]) -> list[Path]:
    """The training stores a run names: as train resolved them (``train_store_paths``, absolute), else
    (a run of an older version) as given to train, taken from the current folder."""
    recorded = info.get("train_store_paths") or info.get("config", {}).get("train_stores", [])
    return [Path(p) for p in recorded]


@dataclasses.dataclass(frozen=True)
class TeacherChat:
    """What a chat student's tokenizer needs of its teacher: the reserved symbols' texts (in the
    store's order), the chat template, the special-token texts the template is rendered with, and
    the text of the token the teacher reads before every document (the stream's ``<bos>``; empty
    if none), and the texts that end a turn where the store records them (None for an older store)."""

    reserved_symbols: list[str]
    template: str | None
    template_tokens: dict[str, str]
    prefix: str
    end_of_turn: list[str] | None = None  # the reserved symbols' texts that end a turn, as the store records them

    def tokenizer_kwargs(self) -> dict[str, Any]:
        """The :class:`ByteStreamTokenizer` settings that make it a chat tokenizer (none for plain text)."""
        if not self.reserved_symbols:
            return {}
        return {
            "reserved_symbols": self.reserved_symbols,
            "chat_template_tokens": self.template_tokens,
            "chat_prefix": self.prefix,
            **({"chat_template": self.template} if self.template else {}),
            **({"end_of_turn": self.end_of_turn} if self.end_of_turn is not None else {}),
        }


PLAIN = TeacherChat([], None, {}, "")


def teacher_files(source: str | None, info: dict[str, Any]) -> tuple[str, TeacherChat]:
    """The teacher's ``tokenizer.json`` text: from ``source`` (tokenizer.json, model folder or .gguf),
    else the teacher recorded in the training store; checked against the store's vocabulary, with
    every added token the dump treats as special marked special (its literal text is text). Without
    the store (moved, or named relative to another folder) the check cannot be made: refused unless
    ``source`` is given, which is then shipped unchecked (with a warning). With it, for a store of
    conversations, its chat settings (:class:`TeacherChat`): as the store's manifest records them,
    else the teacher tokenizer's own."""
    from bytestream.vocab import load_teacher_tokenizer, vocab_from_tokenizer, with_prefix_template
    from distill.teacher.encode import with_specials_marked
    from logit_store import LogitStore
    from logit_store.file_names import MANIFEST
    from logit_store.manifest import read_manifest, tokenizer_location

    stores = training_stores(info)
    found = bool(stores) and (stores[0] / MANIFEST).is_file()
    manifest = read_manifest(stores[0]) if found else {}
    where = f"the training store {stores[0]} is not found" if stores else "the run names no training store"
    if not found and not source:
        raise UserError(f"give --teacher-tokenizer: {where}, so its teacher and vocabulary are unknown")
    if not found:
        print(
            f"warning: {where}: --teacher-tokenizer {source} is not checked "
            "against the vocabulary the student was trained with",
            file=sys.stderr,
        )
    location = tokenizer_location(stores[0], manifest) if found else None
    if not source and not _teacher_reachable(location or ""):
        raise UserError(
            f"give --teacher-tokenizer: the teacher {location!r} that the training store {stores[0]} "
            "names is not found from here"
        )
    source = source or location
    tokenizer = load_teacher_tokenizer(source)
    vocab = vocab_from_tokenizer(tokenizer)
    stored = LogitStore(stores[0]).vocab if found else None
    if stored is not None and not same_tokens(vocab, stored):
        raise UserError(f"the tokenizer of {source} is not the one the training store {stores[0]} was dumped with")
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    spec = with_specials_marked(json.loads(backend.to_str()), vocab)
    if stored is not None:  # the file read alone names the prefix the dump's teacher read
        spec = with_prefix_template(spec, stored.prefix_ids) or spec
    text = json.dumps(spec, ensure_ascii=False)
    chat = teacher_chat(manifest, tokenizer, vocab)
    try:
        TeacherTokens(text, chat.reserved_symbols)
    except ValueError as exc:
        raise UserError(f"{source}: {exc}") from exc
    if chat.reserved_symbols and not chat.template:
        raise UserError(
            f"{source} has no chat template, and the training store records none: give a teacher that has one"
        )
    return text, chat


def training_manifest(info: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest of the first training store a run names, or None where it is not found from here."""
    from logit_store.file_names import MANIFEST
    from logit_store.manifest import read_manifest

    stores = training_stores(info)
    return read_manifest(stores[0]) if stores and (stores[0] / MANIFEST).is_file() else None


def recorded_chat(manifest: dict[str, Any]) -> TeacherChat | None:
    """The chat settings of a store's student as its manifest alone records them (no teacher read):
    :data:`PLAIN` for a store of text; None for a store of conversations whose manifest lacks the
    template, its special-token texts or its prefix (a store of an older version)."""
    reserved = [entry["text"] for entry in manifest.get("reserved_symbols") or []]
    if not reserved:
        return PLAIN
    recorded = _recorded_rendering(manifest)
    template, tokens = recorded.get("chat_template"), recorded.get("chat_template_tokens")
    if not (isinstance(template, str) and template and tokens and "chat_prefix" in recorded):
        return None
    _check_template_digest(template, recorded)
    return TeacherChat(reserved, template, dict(tokens), recorded["chat_prefix"], _recorded_ends(recorded))


def _recorded_ends(recorded: dict[str, Any]) -> list[str] | None:
    """The texts that end a turn as a store of conversations records them (None before it recorded them)."""
    ends = recorded.get("end_of_turn")
    return [str(text) for text in ends] if isinstance(ends, list) else None


def _recorded_rendering(manifest: dict[str, Any]) -> dict[str, Any]:
    """The rendering of a store of conversations, as the dump records it (in its settings or at the top)."""
    return {**(manifest.get("settings") or {}), **manifest}


def _check_template_digest(template: str, recorded: dict[str, Any]) -> None:
    """Refuse a template that is not the one the store records the sha256 of."""
    digest = recorded.get("chat_template_sha256")
    if digest and hashlib.sha256(template.encode("utf-8")).hexdigest() != digest:
        raise UserError(
            "the teacher's chat template is not the one the training store was rendered with (its sha256 differs): "
            "export from a store that records its template, or with the teacher it was dumped with"
        )


def teacher_chat(manifest: dict[str, Any], tokenizer, vocab: TeacherVocab) -> TeacherChat:
    """The chat settings of a store's student: the reserved symbols its manifest names and the
    template it was rendered with, each as the manifest records it, else as the teacher has it."""
    chat = recorded_chat(manifest)
    if chat is not None:
        return chat
    reserved = [entry["text"] for entry in manifest.get("reserved_symbols") or []]
    recorded = _recorded_rendering(manifest)
    names = ("bos_token", "eos_token")  # the texts the dump renders its template with
    own = {name: str(getattr(tokenizer, name)) for name in names if getattr(tokenizer, name, None)}
    prefix = vocab.bytes_of(vocab.prefix_ids[:1]).decode("utf-8", errors="replace") if vocab.prefix_ids else ""
    if vocab.prefix_ids and not prefix:  # a special's bytes are empty: its text is its name
        prefix = tokenizer.convert_ids_to_tokens(vocab.prefix_ids[0])
    template = recorded.get("chat_template") or getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one
        template = template.get("default")
    if template:
        _check_template_digest(template, recorded)
    return TeacherChat(
        reserved,
        template,
        dict(recorded.get("chat_template_tokens") or own),
        recorded.get("chat_prefix", prefix),
        _recorded_ends(recorded),
    )


def _teacher_reachable(teacher: str) -> bool:
    """Whether a store's teacher name can be loaded from here: a path that exists, or a Hub id."""
    return bool(teacher) and (Path(teacher).exists() or is_hub_id(teacher))


def is_hub_id(name: str) -> bool:
    """Whether ``name`` looks like a Hub repo id (``owner/name``) and is no local path."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if name.count("/") != 1 or name.startswith((".", "~")) or Path(name).exists():
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def same_tokens(vocab: TeacherVocab, stored: TeacherVocab) -> bool:
    """Whether a tokenizer's vocabulary is the one a store was dumped with, as far as it decides the
    student's stream: the same bytes and specials (and dummy prefix), once padded to the store's output
    rows (Phi-3), whatever the end-of-text names, whichever specials a store of conversations keeps
    as reserved symbols, and whatever the teacher read before a document (its BOS or none: context,
    never a symbol of the stream)."""
    if stored.size > vocab.size:
        vocab = vocab.padded_to(stored.size)
    kept = {"kept_ids": stored.kept_ids} if getattr(stored, "kept_ids", ()) else {}  # a chat store's reserved ids
    same = {"end_of_text_ids": stored.end_of_text_ids, "prefix_ids": stored.prefix_ids, **kept}
    return dataclasses.replace(vocab, **same).hash == stored.hash
