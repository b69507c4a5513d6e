"""``skipped-RRRRR.jsonl``: the documents writer RRRRR was dealt and did not store, with the
reason (FORMAT.md, "Skip lists").

One JSON object per line, ``{"index": i, "key": ..., "reason": ...}``, in the order the writer
met them; ``index`` is the document's number among the documents the writer was dealt (which
do not depend on the number of processes). Lines are appended as documents are skipped, so
a list may run ahead of the writer's complete shards; a line cut by a crash is dropped on open.
A resuming writer continues after its stored documents *and* the skips among them
(:meth:`SkipList.resume_ordinal`) and passes over every listed document without reading it
again, so the store and its lists do not depend on where a run was interrupted.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from common.errors import UserError
from common.files import read_regular
from logit_store.file_names import SKIP_LIST


@dataclass(frozen=True)
class Skip:
    index: int  # the document's number among those its writer was dealt
    key: str
    reason: str


def skip_path(directory: Path, writer_id: int) -> Path:
    return Path(directory) / SKIP_LIST(writer_id)


class SkipList:
    """One writer's skip list: the skips recorded so far, and appending new ones."""

    def __init__(self, directory: Path, writer_id: int):
        self.path = skip_path(directory, writer_id)
        self.skips = _read(self.path, keep_partial=False)
        self._file = None

    @property
    def indices(self) -> frozenset[int]:
        return frozenset(s.index for s in self.skips)

    def resume_ordinal(self, stored: int) -> int:
        """The writer's first dealt document not yet done: past ``stored`` stored documents and
        the skipped ones among them."""
        ordinal = stored
        for skipped in sorted(s.index for s in self.skips):
            if skipped < ordinal:
                ordinal += 1
            else:
                break
        return ordinal

    def add(self, skip: Skip) -> None:
        if self._file is None:
            self._file = self.path.open("ab")
        self._file.write(json.dumps(asdict(skip)).encode() + b"\n")
        self._file.flush()
        self.skips.append(skip)

    def close(self) -> None:
        if self._file is not None:
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None


def _read(path: Path, keep_partial: bool) -> list[Skip]:
    """The skips in ``path``; without ``keep_partial`` a last line cut by a crash is cut off the file."""
    if not path.exists():
        return []
    data = read_regular(path)
    complete = data[: data.rfind(b"\n") + 1]
    if not keep_partial and len(complete) < len(data):
        with path.open("r+b") as f:
            f.truncate(len(complete))
    skips = []
    for number, line in enumerate(complete.splitlines(), start=1):
        try:
            record = json.loads(line)
            skips.append(Skip(int(record["index"]), str(record["key"]), str(record["reason"])))
        except (ValueError, KeyError, TypeError, RecursionError):
            raise UserError(f"{path}:{number} is corrupt (not a skip record)") from None
    return skips


def read_skips(directory: Path) -> list[Skip]:
    """Every writer's skips in a store, writer by writer, each in the order it was dealt them."""
    lists = [_read(path, keep_partial=True) for path in SKIP_LIST.paths(directory)]
    return [s for skips in lists for s in sorted(skips, key=lambda s: s.index)]
