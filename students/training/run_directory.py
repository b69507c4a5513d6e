"""A training output directory belongs to one run: a record names the run, a lock keeps one ``train`` in it.

``bytedistill_run.json`` (the run's id) is written before anything else of a new run. Then:

- a new run (no ``resume``) into a directory that holds a recorded run is refused, so that no
  checkpoint of the old run survives next to the new run's (``export DIR`` takes the newest);
  ``overwrite`` removes the recorded run's files first, exactly those :data:`RUN_FILES` names
  (in ``checkpoints/`` only the ``step-*`` folders; anything else in the directory stays), never
  through a linked folder (a ``logs`` linked to a folder other runs log into keeps what it holds);
- train's own names without a record (another program's ``metrics.jsonl``, a run of an older
  version) are never removed: a new run there is refused even with ``overwrite``, resuming one
  of its checkpoints adopts it;
- a resume continues the recorded run; a checkpoint of another run is refused;
- ``.train.lock`` is held (``flock``) for the whole session by the main process; a second
  ``train`` on the directory is refused while it is held. The system releases it however the
  process ends. It, ``metrics.jsonl`` and the temporary files are opened with no symlink followed
  (:mod:`common.files`): a link planted at one of those names is refused in one line;
- a session that fails or is stopped before its run wrote anything of its own removes what it
  added to the directory (:func:`undone_if_unstarted`), so nothing of it refuses the next ``train``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common.errors import UserError
from common.files import check_own, lock_file
from students.training.checkpoints import (
    ANSWERS,
    CHECKPOINTS,
    METRICS,
    RUN_INFO,
    latest_checkpoint,
    read_json,
    write_json,
)

RUN_RECORD = "bytedistill_run.json"
LOCK_FILE = ".train.lock"
TRACKER = "bytedistill"  # the trackers' project name: its logs go to LOG_DIR/bytedistill
# what a run writes in its directory besides the record; "logs" holds only the trackers' own folder
RUN_FILES = (
    CHECKPOINTS,
    METRICS,
    RUN_INFO,
    ANSWERS,
    "metrics.tmp",
    "run_info.tmp",
    "on_policy_answers.tmp",
    f"logs/{TRACKER}",
)
MARKERS = (CHECKPOINTS, METRICS, RUN_INFO)  # any of them: the directory has held a run


@contextmanager
def run_lock(output_dir: Path) -> Iterator[None]:
    """Hold the directory's train lock for the duration of the block."""
    if output_dir.exists() and not output_dir.is_dir():
        raise UserError(f"--output-dir {output_dir} is a file, not a directory")
    output_dir.mkdir(parents=True, exist_ok=True)
    fd = lock_file(output_dir / LOCK_FILE)  # a link planted there is refused, never followed
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"another train is running in {output_dir}: wait for it or stop it first") from None
        check_own(output_dir / METRICS)  # appended to at each evaluation: a link there is refused now, not at step N
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextmanager
def undone_if_unstarted(output_dir: Path) -> Iterator[None]:
    """Remove what this session added to ``output_dir`` (the folder itself, the run record, the lock,
    the trackers' ``logs``) if the block fails or is stopped before the run wrote anything of its own
    (:data:`MARKERS`): a command that never started leaves nothing that refuses the next one. What
    was there before stays."""
    added = [name for name in (RUN_RECORD, LOCK_FILE, "logs") if not _present(output_dir / name)]
    created = [folder for folder in (output_dir, *output_dir.parents) if not _present(folder)]
    try:
        yield
    except BaseException:
        if not any(_present(output_dir / name) for name in MARKERS):
            _remove_added(output_dir, added, created)
        raise


def _present(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _remove_added(output_dir: Path, added: list[str], created: list[Path]) -> None:
    """Remove the names of ``added`` from ``output_dir``, then the folders of ``created`` (innermost
    first) that are left empty."""
    for name in added:
        path = output_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        elif path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)
    for folder in created:
        if not folder.is_dir() or folder.is_symlink() or any(folder.iterdir()):
            return
        folder.rmdir()


def recorded_run(output_dir: Path) -> str | None:
    """The id of the run the directory belongs to, if one is recorded."""
    path = output_dir / RUN_RECORD
    return str(read_json(path)["run_id"]) if path.is_file() else None


def checkpoint_run(checkpoint: Path) -> str | None:
    """The id of the run a checkpoint belongs to (None for a checkpoint of an older version)."""
    path = checkpoint / RUN_INFO
    return read_json(path).get("run_id") if path.is_file() else None


def claim(output_dir: Path, resume_from: Path | None, overwrite: bool, resuming: bool) -> str:
    """Check that this session may write ``output_dir`` (see the module docstring); the run's id.

    ``resume_from`` is the checkpoint to continue; None with ``resuming`` (``--resume latest`` before
    the first checkpoint) starts the recorded run again from its beginning. Call it holding :func:`run_lock`.
    """
    refuse_foreign(output_dir, resume_from)
    recorded = recorded_run(output_dir)
    if resume_from is not None:
        return _continue(output_dir, resume_from, recorded)
    if recorded is not None:
        if not (overwrite or resuming):
            newest = latest_checkpoint(output_dir)
            holds = f"run {recorded}" + (f" (newest checkpoint {newest.name})" if newest else "")
            raise UserError(
                f"{output_dir} holds {holds}: give --resume latest to continue it or --overwrite to replace it"
            )
        remove_run_files(output_dir)
        if resuming:
            return recorded
    run_id = uuid.uuid4().hex
    write_json(output_dir / RUN_RECORD, {"run_id": run_id})
    return run_id


def refuse_foreign(output_dir: Path, resume_from: Path | None) -> None:
    """Refuse a directory holding train's names without a record, unless resuming a checkpoint of its own
    (a run of an older version). Read-only: call it before :func:`run_lock` creates the lock file too."""
    if (output_dir / RUN_RECORD).is_file():
        return
    if resume_from is not None and resume_from.resolve().parent.parent == output_dir.resolve():
        return
    if found := [name for name in MARKERS if (output_dir / name).exists()]:
        raise UserError(
            f"{output_dir / found[0]} was not written by a run recorded in {output_dir} (no {RUN_RECORD}): "
            "give another --output-dir"
        )


def _continue(output_dir: Path, checkpoint: Path, recorded: str | None) -> str:
    """The run a resume continues: the directory's, which the checkpoint must belong to."""
    own = checkpoint_run(checkpoint)
    if recorded is not None and own is not None and own != recorded:
        raise UserError(f"cannot resume {checkpoint}: it belongs to run {own}, {output_dir} to run {recorded}")
    run_id = recorded or own or uuid.uuid4().hex
    if recorded is None:
        write_json(output_dir / RUN_RECORD, {"run_id": run_id})
    return run_id


def remove_run_files(output_dir: Path) -> None:
    """Remove what a recorded run wrote (:data:`RUN_FILES`); anything else in the directory stays.
    No symbolic link is followed: a link at one of those names is removed itself, and a name
    reached through a linked folder (``logs`` linked to a folder other runs log into too) is left
    alone, with what that folder holds."""
    for name in RUN_FILES:
        path = output_dir / name
        if _through_link(output_dir, name):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path) if name != CHECKPOINTS else _remove_checkpoints(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    for folder in (output_dir / CHECKPOINTS, output_dir / "logs"):
        if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
            folder.rmdir()


def _through_link(output_dir: Path, name: str) -> bool:
    """Whether a folder between ``output_dir`` and its ``name`` is a symbolic link."""
    parts = Path(name).parts[:-1]
    return any((output_dir.joinpath(*parts[: i + 1])).is_symlink() for i in range(len(parts)))


def _remove_checkpoints(folder: Path) -> None:
    """The checkpoint folders train names (``step-*``, complete or not); another file there stays."""
    for path in folder.glob("step-*"):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
