"""Which store writer holds which document, independent of how many processes run.

A store is written by a fixed number of writers, recorded in its settings when it is created.
The corpus's pieces (:mod:`distill.corpus.shares`) are dealt to the writers, piece ``p`` to
writer ``p % writers``; the writers are dealt round-robin to whatever workers (ranks ×
``--num-shards`` jobs) run now. A resume with another process count therefore finds every
document with the writer that stored it, and each writer skips exactly the documents its shards
already hold. A lock file per writer keeps two
jobs from writing (and deleting the partial files of) the same writer at once; the operating
system releases it when the process ends, however it ends.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Self

from common.errors import UserError
from common.files import lock_file
from logit_store.file_names import WRITER_LOCK


def writers_of(worker: int, workers: int, writers: int) -> list[int]:
    """The writer ids that ``worker`` of ``workers`` runs."""
    if writers < workers:
        raise UserError(
            f"the store has {writers} writers but {workers} workers run (processes × --num-shards): "
            f"run at most {writers} workers, or start a new store with --writers {workers} or more"
        )
    return list(range(worker, writers, workers))


class WriterLock:
    """An exclusive lock on one writer id of a store directory (released when the process ends)."""

    def __init__(self, directory: Path, writer_id: int):
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / WRITER_LOCK(writer_id)
        self._fd = lock_file(self.path)  # a link planted there is refused, never followed
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise UserError(
                f"another dump is writing writer {writer_id} of {directory}: wait for it or stop it first"
            ) from None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
