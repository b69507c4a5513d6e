"""How ``export`` replaces a folder's export without ever losing it: one export at a time, the new
one written beside the old and swapped in only when complete.

- **The lock.** An export holds an exclusive ``flock`` on the output folder itself (created if
  missing) for its whole run; a second export into the folder, or a ``push`` of it (which holds a
  shared one), is refused in one line while it is held. The system releases it however the process
  ends.
- **Staging.** The new export is written into a hidden folder beside the output,
  ``.NAME.bytedistill-export`` (inside the output instead, as ``.bytedistill-export``, where the
  output is a mount point or its parent cannot be written), whose first file is a marker
  (:data:`MARKER`) saying whose it is and how far it got. A failure while writing (a full disk, a
  file-size limit, an interrupt) removes it and leaves the output as it was; a ``SIGKILL`` leaves
  it behind, and the next export into the same output recognises it by its marker (only a folder
  this module wrote, or an empty one, is ever removed) and removes it.
- **The swap.** Once every file is written and synced, the marker says ``complete`` and lists the
  files; then, inside the output: the old record goes first (a half-swapped folder is not an
  export: ``push`` refuses it), each new file is renamed over its old name, the old files the new
  export does not write are deleted, and the new record comes last. Renames take no space, so only
  a kill can stop the swap midway; the next export then finishes it from the marker first.
  Dotfiles in the output (a ``.git``) and the folder itself (its owner, its permissions, a shell
  inside it) are never touched.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from common.errors import UserError, first_line
from students.release.export_record import EXPORT_RECORD

MARKER = ".bytedistill-staging.json"
MARKER_KIND = "bytedistill export staging"
INSIDE = ".bytedistill-export"


# --------------------------------------------------------------------------------- the lock


def _created_folders(output: Path) -> list[Path]:
    """The folders ``output.mkdir(parents=True)`` would create, deepest first."""
    missing, path = [], output
    while not path.exists() and not path.is_symlink() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


@contextmanager
def export_lock(output: Path, *, shared: bool = False, create: bool = True) -> Iterator[None]:
    """Hold the output folder's export lock for the block (``shared``: push's, which any number
    hold at once but not with an export). ``create`` makes the folder first if it is missing; the
    folders it made are removed again if the block fails and leaves them empty."""
    output = Path(output)
    if (output.exists() or output.is_symlink()) and not output.is_dir():
        raise UserError(f"{output} exists and is not a folder")
    created = _created_folders(output) if create else []
    try:
        output.mkdir(parents=True, exist_ok=True) if create else None
        fd = os.open(output, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise UserError(f"cannot create or open the folder {output}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            held, here = os.fstat(fd), os.stat(output)
            if (held.st_dev, held.st_ino) != (here.st_dev, here.st_ino):  # replaced since it was opened
                raise BlockingIOError
        except BlockingIOError:
            what = "an export is writing" if shared else "another export (or a push) is using"
            raise UserError(f"{what} {output}: wait for it or stop it first") from None
        try:
            yield
        except BaseException:
            for folder in created:
                try:
                    folder.rmdir()  # only if empty: a failed first export leaves no folder behind
                except OSError:
                    break
            raise
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------- staging


def staging_candidates(output: Path) -> list[Path]:
    """Where an export into ``output`` stages: beside it, or inside it."""
    real = Path(output).resolve()
    return [real.parent / f".{real.name}{INSIDE}", real / INSIDE]


def _staging_place(output: Path) -> Path:
    beside, inside = staging_candidates(output)
    real = Path(output).resolve()
    if os.access(real.parent, os.W_OK | os.X_OK) and os.stat(real.parent).st_dev == os.stat(real).st_dev:
        return beside
    return inside


def _read_marker(folder: Path) -> dict | None:
    """The marker of a staging folder this module wrote (None: not one)."""
    try:
        info = os.lstat(folder / MARKER)
        if not stat.S_ISREG(info.st_mode) or info.st_size > 1 << 20:
            return None
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and marker.get("kind") == MARKER_KIND else None


def _write_marker(folder: Path, marker: dict) -> None:
    tmp = folder / f"{MARKER}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps({"kind": MARKER_KIND, **marker}, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / MARKER)


def clean_leftover(output: Path) -> str | None:
    """Remove, or finish swapping in, what an export killed earlier left staged for ``output``;
    a note saying what was done (None: nothing was there). Call it holding :func:`export_lock`.
    A folder at a staging name that this module did not write is refused, never removed."""
    output = Path(output)
    for place in staging_candidates(output):
        try:
            mode = os.lstat(place).st_mode
        except FileNotFoundError:
            continue
        marker = _read_marker(place) if stat.S_ISDIR(mode) else None
        if marker is None or marker.get("output") != Path(output).resolve().name:
            if stat.S_ISDIR(mode) and {e.name for e in place.iterdir()} <= {f"{MARKER}.tmp"}:
                shutil.rmtree(place)  # killed before its marker was in place
                continue
            raise UserError(
                f"{place} was not written by bytedistill export (no staging marker for {output.name}): "
                "an export stages there; move it away"
            )
        if marker.get("state") == "complete":
            swap_in(place, output, marker)
            return f"finished swapping in the export an earlier export left unfinished in {output}"
        shutil.rmtree(place)
        return f"removed {place}, the unfinished export of an earlier export that was stopped"
    return None


def _sync_tree(folder: Path) -> None:
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(Path(root) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def _write_failure(exc: BaseException, output: Path, previous: list[str]) -> UserError:
    what = f"{exc.strerror}: {exc.filename}" if isinstance(exc, OSError) and exc.strerror else first_line(exc)
    kept = f"the previous export in {output} is whole" if previous else f"{output} is as it was"
    return UserError(f"could not write the export ({what}); nothing of it was kept and {kept}")


@contextmanager
def staging(output: Path, previous: list[str]) -> Iterator[Path]:
    """A fresh staging folder for the new export of ``output`` (whose current export wrote
    ``previous``). When the block ends the folder is synced and marked complete, ready for
    :func:`swap_in`; if it fails, the folder is removed and a write error becomes one line."""
    output = Path(output)
    place = _staging_place(output)
    base = {"output": output.resolve().name, "replaces": previous}
    try:
        place.mkdir()
        _write_marker(place, {**base, "state": "writing"})
    except OSError as exc:
        shutil.rmtree(place, ignore_errors=True)
        raise _write_failure(exc, output, previous) from None
    try:
        yield place
        files = json.loads((place / EXPORT_RECORD).read_text(encoding="utf-8"))["files"]
        _sync_tree(place)
        _write_marker(place, {**base, "state": "complete", "files": files})
    except BaseException as exc:
        shutil.rmtree(place, ignore_errors=True)
        if isinstance(exc, OSError) or type(exc).__name__ == "SafetensorError":
            raise _write_failure(exc, output, previous) from None
        raise


# ---------------------------------------------------------------------------------- swap


def swap_in(place: Path, output: Path, marker: dict | None = None) -> None:
    """Move the complete export staged in ``place`` into ``output`` (module docstring, "The swap");
    safe to run again on a swap a kill stopped midway."""
    output, place = Path(output), Path(place)
    marker = marker or _read_marker(place)
    files, previous = list(marker["files"]), list(marker["replaces"])
    try:
        if (place / EXPORT_RECORD).exists():  # the new record still staged: the swap is not done
            (output / EXPORT_RECORD).unlink(missing_ok=True)
            for name in files:
                if name != EXPORT_RECORD and (place / name).exists():
                    (output / name).parent.mkdir(parents=True, exist_ok=True)
                    os.replace(place / name, output / name)
            for name in sorted(set(previous) - set(files)):
                (output / name).unlink(missing_ok=True)
            for folder in sorted({(output / name).parent for name in previous} - {output}, reverse=True):
                if folder.is_dir() and not any(folder.iterdir()):  # custom_generate/ of an older export
                    folder.rmdir()
            os.replace(place / EXPORT_RECORD, output / EXPORT_RECORD)
        shutil.rmtree(place)
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            raise UserError(f"cannot move the export staged in {place} into {output}: another file system") from None
        raise UserError(
            f"cannot move the export staged in {place} into {output} ({exc.strerror}: {exc.filename}): "
            "run the export again to finish it"
        ) from None
