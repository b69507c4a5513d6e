"""The files of a local corpus: which entries are read, which are not and why, and reading a
compressed file to its end.

A folder is searched recursively in sorted order, links to folders followed like links to files;
an entry is read if it is a readable regular file (or a link to one) with a supported suffix.
Every other entry is listed with the reason it is not read (a dangling link, an unreadable file
or folder, a suffix that is not supported, not a regular file, a link to a folder on its own path
— a loop —, a logit store inside the corpus folder), so that a corpus never loses a file without
a word. A file name that is not UTF-8 cannot
become a document key and is refused. A ``.zst`` file must decompress to the end of its last
frame: a truncated or corrupt file is an error naming it, never a shorter corpus.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import UserError
from logit_store.manifest import is_store_directory

TEXT_SUFFIXES = (".txt", ".text", ".md")
RECORD_SUFFIXES = (".jsonl", ".jsonl.zst", ".parquet")
READ_BYTES = 1 << 16  # compressed bytes decompressed at a time


def file_suffix(path: Path) -> str:
    name = path.name.lower()
    for suffix in RECORD_SUFFIXES + TEXT_SUFFIXES:
        if name.endswith(suffix):
            return suffix
    return path.suffix.lower()


@dataclass(frozen=True)
class CorpusListing:
    files: list[Path]
    not_read: list[tuple[Path, str]] = field(default_factory=list)  # (entry, why it is not read)

    def not_read_note(self) -> str | None:
        """``3 corpus entries (not a supported suffix: 2, dangling link: 1)``, or None."""
        if not self.not_read:
            return None
        reasons = Counter(reason for _, reason in self.not_read)
        detail = ", ".join(f"{reason}: {n}" for reason, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
        entries = "entry" if len(self.not_read) == 1 else "entries"
        return f"{len(self.not_read)} corpus {entries} ({detail})"


def list_corpus(source: Path) -> CorpusListing:
    """The files to read under ``source`` (or ``source`` itself) and the entries left out."""
    if source.is_file():
        return CorpusListing([source])
    entries, folders_not_read = _walk(source)
    files, not_read = [], []
    for entry in sorted(entries):
        reason = folders_not_read.get(entry) or _why_not_read(entry)
        if reason is None:
            _check_name(entry, source)
            files.append(entry)
        elif reason != "folder":
            not_read.append((entry, reason))
    return CorpusListing(files, not_read)


def _walk(source: Path) -> tuple[list[Path], dict[Path, str]]:
    """Every entry under ``source``, links to folders followed as folders are, and the folders not
    entered with why: a link to a folder on its own path (a loop), a logit store (its files are a
    dump's, never corpus files: a store inside its corpus folder resumes), an unreadable folder."""
    entries: list[Path] = []
    not_entered: dict[Path, str] = {}

    def walk(folder: Path, chain: tuple[str, ...]) -> None:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            not_entered[folder] = "unreadable folder"
            return
        for name in names:
            path = folder / name
            entries.append(path)
            if not path.is_dir():
                continue
            real = os.path.realpath(path)
            if any(seen == real or seen.startswith(real.rstrip(os.sep) + os.sep) for seen in chain):
                not_entered[path] = "link loop"
            elif is_store_directory(path):
                not_entered[path] = "a logit store"
            else:
                walk(path, (*chain, real))

    walk(source, (os.path.realpath(source),))
    return entries, not_entered


def _why_not_read(entry: Path) -> str | None:
    if entry.is_symlink() and not entry.exists():
        return "dangling link"
    if entry.is_dir():
        return "folder"
    if not entry.is_file():
        return "not a regular file"
    if file_suffix(entry) not in TEXT_SUFFIXES + RECORD_SUFFIXES:
        return "not a supported suffix"
    if not os.access(entry, os.R_OK):
        return "unreadable"
    return None


def _check_name(file: Path, source: Path) -> None:
    name = str(file.relative_to(source))
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(name).decode("utf-8", errors="backslashreplace")
        raise UserError(f"corpus file name '{shown}' under {source} is not UTF-8: rename it") from None


def zstd_lines(path: Path, read: Callable[[bytes], None] | None = None) -> Iterator[bytes]:
    """The lines of a ``.zst`` file, every frame decompressed to its end; ``read`` is given the
    file's bytes as they are read."""
    import zstandard

    lines = _LineSplitter()
    in_frame = False
    decompressor = zstandard.ZstdDecompressor().decompressobj()
    try:
        with path.open("rb") as f:
            while chunk := f.read(READ_BYTES):
                if read is not None:
                    read(chunk)
                while chunk:
                    yield from lines.feed(decompressor.decompress(chunk))
                    in_frame, chunk = not decompressor.eof, b""
                    if decompressor.eof:  # the next frame, if any, starts in the unused bytes
                        chunk = decompressor.unused_data
                        decompressor = zstandard.ZstdDecompressor().decompressobj()
    except zstandard.ZstdError as exc:
        raise UserError(f"{path}: not a readable zstd file ({exc})") from None
    if in_frame:
        raise UserError(f"{path}: the zstd data ends early (a truncated file)")
    yield from lines.rest()


class _LineSplitter:
    """Cuts a stream of byte pieces into lines (each with its newline), linear in the bytes."""

    def __init__(self):
        self._parts: list[bytes] = []

    def feed(self, data: bytes) -> Iterator[bytes]:
        *complete, tail = data.split(b"\n")
        for line in complete:
            yield b"".join(self._parts) + line + b"\n"
            self._parts.clear()
        self._parts.append(tail)

    def rest(self) -> Iterator[bytes]:
        last = b"".join(self._parts)
        if last:
            yield last
