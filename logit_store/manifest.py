"""``manifest.json``: what a store holds and how its values are encoded (FORMAT.md, "manifest.json")."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from bytestream.stream_kind import StreamKind
from common.errors import UserError
from logit_store.file_names import MANIFEST, partial_name

FORMAT_NAME = "bytedistill-logit-store"
FORMAT_VERSION = 2  # what writers write for an <eot> store: the stream goes unnamed, as before
STREAM_VERSION = 3  # what writers write for another stream: the manifest names it
CHAT_VERSION = 4  # a store with reserved symbols (conversations): roles per position in every chunk
READABLE_VERSIONS = (1, 2, 3, 4)
# manifest fields that must agree for a writer to append to an existing store; in format 2 every
# shard records a hash of them, so an edited manifest is caught (``identity_hash``)
IDENTITY_FIELDS = (
    "format_version",
    "teacher",
    "teacher_hash",
    "vocab_hash",
    "tokenizer_hash",
    "corpus_hash",
    "settings",
    "encoding",
    "stream",
    "reserved_symbols",
)
# identity fields that stores written before them lack: left out of the identity hash when absent,
# so that those stores' shards still match their manifest (an <eot> store names no stream, a store
# of plain text no reserved symbols)
LATER_FIELDS = ("teacher_hash", "stream", "reserved_symbols")


def format_version_of(stream: StreamKind, chat: bool = False) -> int:
    """The version a writer writes for a store of ``stream`` (``chat``: with reserved symbols and
    roles): the lowest that holds it."""
    if chat:
        return CHAT_VERSION
    return FORMAT_VERSION if stream is StreamKind.EOT else STREAM_VERSION


def stream_fields(stream: StreamKind, reserved_symbols: list[dict] | None = None) -> dict:
    """The manifest fields that say the stream: none for an <eot> store of plain text (every store
    before version 3 is one), ``stream`` for another; a chat store's ``reserved_symbols`` (each
    ``{"text", "teacher_id"}``, in symbol order)."""
    return (
        {"format_version": format_version_of(stream, bool(reserved_symbols))}
        | ({} if stream is StreamKind.EOT else {"stream": stream.value})
        | ({"reserved_symbols": list(reserved_symbols)} if reserved_symbols else {})
    )


def manifest_reserved_symbols(manifest: dict) -> list[dict]:
    """A (read) manifest's reserved symbols, ``[{"text", "teacher_id"}, ...]`` ([] for plain text)."""
    return list(manifest.get("reserved_symbols") or [])


def manifest_stream(manifest: dict) -> StreamKind:
    """The stream a (read) manifest's store holds."""
    return StreamKind(manifest.get("stream", StreamKind.EOT.value))


def settings_hash(settings: dict) -> str:
    return hashlib.sha256(canonical_json(settings)).hexdigest()


def canonical_json(value) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def identity_hash(manifest: dict) -> bytes:
    """16-byte hash of the manifest's content-defining fields (recorded in every v2 shard)."""
    fields = {k: manifest.get(k) for k in IDENTITY_FIELDS if k in manifest or k not in LATER_FIELDS}
    return hashlib.blake2b(canonical_json(fields), digest_size=16).digest()


def read_manifest(directory: Path) -> dict:
    path = Path(directory) / MANIFEST
    if not Path(directory).is_dir():
        raise UserError(f"logit store not found: {directory} is not a directory")
    if not path.is_file():
        raise UserError(f"{directory} is not a logit store: {MANIFEST} is missing")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    except RecursionError:
        raise UserError(f"cannot read {path}: JSON nested too deeply") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise UserError(f"{path} is not a bytedistill logit-store manifest")
    version = manifest.get("format_version")
    if version not in READABLE_VERSIONS:
        known = ", ".join(map(str, READABLE_VERSIONS))
        raise UserError(f"{path}: unknown store format version {version!r} (this reader knows {known})")
    stream = manifest.get("stream")
    named = {kind.value for kind in StreamKind.stored_kinds() if kind is not StreamKind.EOT}  # a manifest names
    stream_ok = stream is None or (isinstance(stream, str) and stream in named)
    if not (
        stream is None if version < STREAM_VERSION else stream_ok and (stream is not None or version >= CHAT_VERSION)
    ):
        raise UserError(f"{path}: corrupt manifest (stream {stream!r} in a version {version} store)")
    reserved = manifest.get("reserved_symbols")
    well_formed = isinstance(reserved, list) and all(
        isinstance(r, dict) and isinstance(r.get("text"), str) and isinstance(r.get("teacher_id"), int)
        for r in reserved
    )
    if (reserved is not None or version >= CHAT_VERSION) and not (version >= CHAT_VERSION and well_formed and reserved):
        raise UserError(f"{path}: corrupt manifest (reserved_symbols {reserved!r} in a version {version} store)")
    if not isinstance(manifest.get("vocab_hash"), str):
        raise UserError(f"{path}: corrupt manifest (vocab_hash missing or not a string)")
    encoding = manifest.get("encoding")
    if not isinstance(encoding, dict) or not isinstance(encoding.get("name"), str):
        raise UserError(f"{path}: corrupt manifest (encoding missing or malformed)")
    if not isinstance(encoding.get("params", {}), dict):
        raise UserError(f"{path}: corrupt manifest (encoding params must be an object)")
    return manifest


def tokenizer_location(directory: Path, manifest: dict) -> str | None:
    """Where the store's teacher tokenizer was read: its recorded place (a path relative to the
    store, resolved here, or a Hub id), else (stores written before it was recorded) the teacher."""
    recorded = manifest.get("tokenizer_source")
    if isinstance(recorded, str) and recorded:
        local = Path(directory) / recorded
        return str(local) if not Path(recorded).is_absolute() and local.exists() else recorded
    teacher = manifest.get("teacher")
    return teacher if isinstance(teacher, str) and teacher else None


def is_store_directory(directory: Path) -> bool:
    """Whether ``directory`` holds a logit store's manifest (a readable one, of this format)."""
    if not (Path(directory) / MANIFEST).is_file():
        return False
    try:
        read_manifest(Path(directory))
    except UserError:
        return False
    return True


def write_atomic(path: Path, data: bytes, writer_id: int) -> None:
    """Write ``path`` whole or not at all: writer ``writer_id`` writes a partial file, then renames it."""
    tmp = path.with_name(partial_name(path.name, writer_id))
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # a full disk, a file-size limit: no partial file is left
        tmp.unlink(missing_ok=True)
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
