"""Every name in a store directory (FORMAT.md, "Directory"), made and recognised in one place.

A writer's files are named by its id (a shard also by its sequence number), five digits each:
:class:`WriterFileName` makes such a name from its template and recognises it by the pattern the
same template gives, so that a name is never spelled twice. :func:`store_file_kind` tells what a
name is in a store: a writer creates, replaces or deletes only files of these names
(:mod:`logit_store.ownership`). A dump's lock on a writer (:data:`WRITER_LOCK`) lies in the
directory too, but is not a store file: it is never checked or deleted as one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

MANIFEST = "manifest.json"
VOCAB_FILE = "vocab.bin"
NUMBER = "{:05d}"  # a writer id or a sequence number in a name


@dataclass(frozen=True)
class WriterFileName:
    """A kind of file named by writer id (and sequence): ``template`` holds a :data:`NUMBER` for each."""

    template: str

    def __call__(self, *numbers: int) -> str:
        """The name of the file of these numbers (writer id first)."""
        return self.template.format(*numbers)

    @cached_property
    def pattern(self) -> re.Pattern:
        return re.compile("^" + re.escape(self.template).replace(re.escape(NUMBER), r"(\d{5})") + "$")

    @property
    def shown(self) -> str:
        """The names of every writer, as a message shows them: ``skipped-*.jsonl``."""
        return self.template.replace(NUMBER, "*")

    def numbers(self, name: str) -> tuple[int, ...] | None:
        """The numbers in ``name`` (writer id first), or None for a name of another kind."""
        match = self.pattern.match(name)
        return tuple(int(n) for n in match.groups()) if match else None

    def paths(self, directory: Path, writer_id: int | None = None) -> list[Path]:
        """The files of this kind in ``directory`` (of one writer, if given), sorted by name."""
        found = []
        for path in Path(directory).iterdir():
            numbers = self.numbers(path.name)
            if numbers is not None and (writer_id is None or numbers[0] == writer_id):
                found.append(path)
        return sorted(found)


SHARD = WriterFileName(f"shard-{NUMBER}-{NUMBER}.bds")
PARTIAL_SHARD = WriterFileName(SHARD.template + ".tmp")  # a shard being written
COMPLETION_RECORD = WriterFileName(f"writer-{NUMBER}.json")
SKIP_LIST = WriterFileName(f"skipped-{NUMBER}.jsonl")
SOURCE_RECORD = WriterFileName(f"source-{NUMBER}.json")
WRITER_LOCK = WriterFileName(f".writer-{NUMBER}.lock")


def partial_name(name: str, writer_id: int) -> str:
    """Where writer ``writer_id`` writes the file ``name`` before renaming it into place."""
    return f"{name}.w{writer_id}.tmp"


PARTIAL_FILE = re.compile(  # a manifest, vocabulary, completion or source record being written
    rf"^({re.escape(MANIFEST)}|{re.escape(VOCAB_FILE)}|{COMPLETION_RECORD.pattern.pattern[1:-1]}"
    rf"|{SOURCE_RECORD.pattern.pattern[1:-1]})\.w\d+\.tmp$"
)
STORE_FILE_KINDS = {
    "manifest": re.compile(f"^{re.escape(MANIFEST)}$"),
    "vocab": re.compile(f"^{re.escape(VOCAB_FILE)}$"),
    "shard": SHARD.pattern,
    "partial shard": PARTIAL_SHARD.pattern,
    "completion record": COMPLETION_RECORD.pattern,
    "skip list": SKIP_LIST.pattern,
    "source record": SOURCE_RECORD.pattern,
    "partial file": PARTIAL_FILE,
}


def store_file_kind(name: str) -> str | None:
    """What a file of this name is in a store, or None for a name a writer never uses."""
    return next((kind for kind, pattern in STORE_FILE_KINDS.items() if pattern.match(name)), None)
