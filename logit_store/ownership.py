"""Which files in a store directory a store writer wrote, so that it never overwrites or deletes
another's (FORMAT.md, "Directory").

A writer creates, replaces or deletes only files with a store's names
(:func:`logit_store.file_names.store_file_kind`).
Before it touches anything, :func:`check_store_files` refuses a directory where such a name holds
something no writer wrote: any store file in a directory without ``manifest.json`` (a writer
writes the manifest first), a ``.bds.tmp`` that does not begin as a shard, a completion record or
skip list that is not one. Other files in the directory are never touched.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

from common.errors import UserError
from common.files import open_regular, read_regular
from logit_store.file_names import MANIFEST, store_file_kind
from logit_store.manifest import FORMAT_NAME
from logit_store.shard import SHARD_MAGIC
from logit_store.source_record import SOURCE_START

MANIFEST_START = b'{\n  "compression": '  # how every manifest a writer writes begins (sorted keys, indent 2)


def check_store_files(directory: Path) -> None:
    """Refuse ``directory`` if a file with a store's name there was not written by a store writer."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise UserError(f"{directory} is a file, not a folder: give a folder for the store")
    if not directory.is_dir():
        return
    has_manifest = (directory / MANIFEST).is_file() and _is_manifest(directory / MANIFEST)
    for entry in sorted(directory.iterdir()):
        kind = store_file_kind(entry.name)
        if kind is None or kind == "manifest":
            continue
        try:
            regular = stat.S_ISREG(entry.lstat().st_mode)
            if not regular:
                problem = "is a link or not a regular file"
            elif not has_manifest and not (kind == "partial file" and entry.name.startswith(MANIFEST)):
                problem = f"is not from a store (there is no {MANIFEST})"
            else:
                problem = _content_problem(entry, kind)
        except FileNotFoundError:  # renamed or removed since the listing, by another job writing this store
            continue
        if problem:
            raise UserError(
                f"{entry} {problem}: a dump would overwrite or delete it; move it away or choose another --output"
            )
    if (directory / MANIFEST).exists() and not has_manifest:
        raise UserError(f"{directory / MANIFEST} is not a bytedistill store manifest: choose another --output")


def _content_problem(path: Path, kind: str) -> str | None:
    """Why a file with a store's name does not hold what a writer writes there (None if it does)."""
    with open_regular(path) as f:
        head = f.read(4096)
    if kind == "partial shard" and head and not head.startswith(SHARD_MAGIC[: len(head)]):
        return "does not begin as a shard"
    if kind == "completion record" and not _json_object_with(head, "writer_id"):
        return "is not a completion record"
    if kind == "source record" and not head.startswith(SOURCE_START):
        return "is not a record of a writer's source"
    first_line, complete, _ = head.partition(b"\n")  # a line cut by a crash is the writer's too
    if kind == "skip list" and complete and not _json_object_with(first_line, "reason"):
        return "is not a skip list"
    if (
        kind == "partial file"
        and path.name.startswith(MANIFEST)
        and not MANIFEST_START.startswith(head[: len(MANIFEST_START)])
    ):
        return "is not a partial store manifest"
    return None


def _json_object_with(text: bytes, key: str) -> bool:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return isinstance(value, dict) and key in value


def _is_manifest(path: Path) -> bool:
    try:
        value = json.loads(read_regular(path))
    except (OSError, ValueError, RecursionError, UserError):
        return False
    return isinstance(value, dict) and value.get("format") == FORMAT_NAME


def remove_unfinished_store(directory: Path) -> list[str]:
    """Delete a store that holds no complete shard: its files (checked to be a store's first), never
    another file; returns the names deleted."""
    directory = Path(directory)
    check_store_files(directory)
    names = sorted(e.name for e in directory.iterdir() if store_file_kind(e.name) is not None)
    if any(store_file_kind(name) == "shard" for name in names):
        raise UserError(f"{directory} holds finished documents: it is not replaced")
    for name in names:
        (directory / name).unlink()
    return names
