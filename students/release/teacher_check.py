"""The teacher tokenizer an export ships: the one the training store was dumped with, checked
against the store's vocabulary (the student learnt that teacher's ``<eot>`` marks and no other)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from bytestream.errors import UserError
from bytestream.stream_tokenizer import TeacherTokens
from bytestream.vocab import TeacherVocab


def training_stores(info: dict[str, Any]) -> list[Path]:
    """The training stores a run names: as train resolved them (``train_store_paths``, absolute), else
    (a run of an older version) as given to train, taken from the current folder."""
    recorded = info.get("train_store_paths") or info.get("config", {}).get("train_stores", [])
    return [Path(p) for p in recorded]


def teacher_tokenizer_json(source: str | None, info: dict[str, Any]) -> str:
    """The teacher's ``tokenizer.json`` text: from ``source`` (tokenizer.json, model folder or .gguf),
    else the teacher recorded in the training store; checked against the store's vocabulary, with
    every added token the dump treats as special marked special (its literal text is text). Without
    the store (moved, or named relative to another folder) the check cannot be made: refused unless
    ``source`` is given, which is then shipped unchecked (with a warning)."""
    from bytestream.vocab import load_teacher_tokenizer, vocab_from_tokenizer
    from distill.encode import with_specials_marked
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
    if found and not same_tokens(vocab, LogitStore(stores[0]).vocab):
        raise UserError(f"the tokenizer of {source} is not the one the training store {stores[0]} was dumped with")
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    text = json.dumps(with_specials_marked(json.loads(backend.to_str()), vocab), ensure_ascii=False)
    try:
        TeacherTokens(text)
    except ValueError as exc:
        raise UserError(f"{source}: {exc}") from exc
    return text


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
    """Whether a tokenizer's vocabulary is the one a store was dumped with: the same bytes and
    specials, once padded to the store's output rows (Phi-3), whatever the end-of-text names."""
    if stored.size > vocab.size:
        vocab = vocab.padded_to(stored.size)
    return dataclasses.replace(vocab, end_of_text_ids=stored.end_of_text_ids).hash == stored.hash
