"""``hub_files.json``: the list of a store's files that ``push-store`` publishes beside them, so that a
reader of the Hub copy knows every file before it fetches one (FORMAT.md, "The Hub copy").

For each file: its name (a store file name, nothing else: no folder, no ``..``), its size and its
SHA-256; for each shard also its *ends*: the 16-byte header and the index with the trailer (the
bytes :class:`logit_store.shard.ShardReader` reads on open), base64, so that a reader opens every
shard's index and plans its reading without fetching a shard. A fetched file is trusted only if
its size and SHA-256 are the list's, and a shard's own ends the list's.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from common.errors import UserError
from common.files import read_regular
from logit_store.file_names import MANIFEST, SHARD, store_file_kind

HUB_FILES = "hub_files.json"
FORMAT_NAME = "bytedistill-hub-files"
VERSION = 1
PUBLISHED_KINDS = {"manifest", "vocab", "shard", "completion record", "skip list", "source record"}
MAX_FILE_BYTES = 1 << 50  # no store file is larger: a list naming more is refused
MAX_LIST_BYTES = 1 << 30  # the list itself
HEADER_SIZE, TRAILER_SIZE = 16, 64  # a shard's header and trailer (logit_store/shard.py)
SHA256 = re.compile(r"^[0-9a-f]{64}$")
BLOCK = 1 << 22  # bytes read at a time when hashing


@dataclass(frozen=True)
class FileEntry:
    name: str
    size: int
    sha256: str
    ends: bytes | None = None  # a shard's header, index and trailer


@dataclass(frozen=True)
class FileList:
    entries: dict[str, FileEntry]  # by name

    @property
    def shard_names(self) -> list[str]:
        return sorted(name for name in self.entries if SHARD.numbers(name) is not None)

    def names_of(self, kind) -> list[str]:
        """The listed names of one :class:`logit_store.file_names.WriterFileName` kind."""
        return sorted(name for name in self.entries if kind.numbers(name) is not None)

    def to_bytes(self) -> bytes:
        files = [
            {"name": e.name, "size": e.size, "sha256": e.sha256}
            | ({"ends": base64.b64encode(e.ends).decode()} if e.ends is not None else {})
            for e in sorted(self.entries.values(), key=lambda e: e.name)
        ]
        return (json.dumps({"format": FORMAT_NAME, "version": VERSION, "files": files}, indent=1) + "\n").encode()


def is_published(name: str) -> bool:
    """Whether ``push-store`` publishes a store file of this name (not a partial file or a lock)."""
    return store_file_kind(name) in PUBLISHED_KINDS


def shard_ends(handle: BinaryIO, size: int) -> bytes:
    """A shard file's header and its index with the trailer (the whole file, if its trailer's
    index bounds do not fit it: the reader then names what is wrong)."""
    handle.seek(0)
    header = handle.read(HEADER_SIZE)
    if size < HEADER_SIZE + TRAILER_SIZE:
        return header
    handle.seek(size - TRAILER_SIZE)
    trailer = handle.read(TRAILER_SIZE)
    offset, length = struct.unpack("<QQ", trailer[:16])
    start = size - TRAILER_SIZE - length
    if offset != start or start < HEADER_SIZE:
        start = HEADER_SIZE
    handle.seek(start)
    return header + handle.read(size - start)


def describe(name: str, handle: BinaryIO) -> FileEntry:
    """The list's entry for the open file ``name`` (read once to hash it)."""
    digest, size = hashlib.sha256(), 0
    handle.seek(0)
    while block := handle.read(BLOCK):
        digest.update(block)
        size += len(block)
    ends = shard_ends(handle, size) if SHARD.numbers(name) is not None else None
    handle.seek(0)
    return FileEntry(name, size, digest.hexdigest(), ends)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


def parse(data: bytes, where: str) -> FileList:
    """The list in ``data``, every entry checked (names, sizes, hashes, ends); a UserError naming
    ``where`` otherwise."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise UserError(f"{where} is not a file list ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME or doc.get("version") != VERSION:
        raise UserError(f"{where} is not a bytedistill file list of version {VERSION}")
    files = doc.get("files")
    if not isinstance(files, list):
        raise UserError(f"{where}: corrupt (no list of files)")
    entries = {}
    for item in files:
        entry = _entry(item, where)
        if entry.name in entries:
            raise UserError(f"{where}: corrupt ({entry.name} listed twice)")
        entries[entry.name] = entry
    if MANIFEST not in entries:
        raise UserError(f"{where}: corrupt (it lists no {MANIFEST})")
    return FileList(entries)


def _entry(item, where: str) -> FileEntry:
    name = item.get("name") if isinstance(item, dict) else None
    if not isinstance(name, str) or not is_published(name):
        raise UserError(f"{where}: corrupt (it names {name!r}, not a store file)")
    size, sha = item.get("size"), item.get("sha256")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_FILE_BYTES:
        raise UserError(f"{where}: corrupt (size {size!r} of {name})")
    if not isinstance(sha, str) or not SHA256.match(sha):
        raise UserError(f"{where}: corrupt (sha256 {sha!r} of {name})")
    ends = None
    if SHARD.numbers(name) is not None:
        try:
            ends = base64.b64decode(item.get("ends"), validate=True)
        except (TypeError, ValueError):
            raise UserError(f"{where}: corrupt (the ends of {name} are not base64)") from None
        if not HEADER_SIZE + TRAILER_SIZE <= len(ends) <= size:
            raise UserError(f"{where}: corrupt (the ends of {name} do not fit its size)")
    return FileEntry(name, size, sha, ends)


def read_file_list(directory: Path) -> FileList | None:
    """The file list in a store directory (a Hub copy's), or None for a store on disk."""
    path = Path(directory) / HUB_FILES
    if not path.is_file():
        return None
    if path.stat().st_size > MAX_LIST_BYTES:
        raise UserError(f"{path}: larger than a file list can be")
    return parse(read_regular(path), str(path))


def store_names(directory: Path) -> list[str]:
    """The names of the files in a store: its file list's for a Hub copy (fetched or not), else the
    directory's."""
    listed = read_file_list(directory)
    if listed is not None:
        return sorted(listed.entries)
    return sorted(path.name for path in Path(directory).iterdir())
