"""Files a command keeps in its own folders (lock files, logs, temporary files), opened with no
symbolic link followed: a link or hard link planted at such a name is refused in one line, and
what it points at is never opened, written or truncated.

Each function opens the path once (``O_NOFOLLOW``: the last part is never a link), then checks
what it opened (``fstat``: a regular file with one link), so no check can be raced by replacing
the file between the check and its use.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from common.errors import UserError


def _refusal(path: Path) -> UserError:
    try:
        target = f" (to {os.readlink(path)})"
    except OSError:
        target = ""
    return UserError(f"{path} is a symbolic link{target}: refusing to follow it out of its folder; remove it")


def open_own(path: Path, flags: int, mode: int = 0o644, *, single_link: bool = True) -> int:
    """``os.open(path, flags)`` with no link followed; the descriptor of a regular file (with one
    link, unless ``single_link`` is False), else a UserError naming the path."""
    path = Path(path)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refusal(path) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"{path} is not a regular file: move it away")
        if single_link and info.st_nlink != 1:
            raise UserError(
                f"{path} has {info.st_nlink} hard links (another name shares its data): refusing to write it; remove it"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def lock_file(path: Path) -> int:
    """Open (creating it if missing) a lock file to ``flock``; returns the descriptor."""
    return open_own(path, os.O_RDWR | os.O_CREAT, single_link=False)  # a lock's content is never written


def append_text(path: Path, text: str) -> None:
    """Append ``text`` to ``path`` (created if missing)."""
    fd = open_own(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(text)


def read_text(path: Path) -> str:
    """The text of ``path``, refused if it is a link."""
    fd = open_own(path, os.O_RDONLY, single_link=False)
    with os.fdopen(fd, encoding="utf-8") as f:
        return f.read()


def write_new(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as a new file (``O_EXCL``): whatever was at the name (a file, a
    link) is removed first, never followed."""
    path = Path(path)
    path.unlink(missing_ok=True)  # removes a link itself, not its target
    fd = open_own(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def check_own(path: Path) -> None:
    """Refuse ``path`` if it is a symbolic link, not a regular file, or a file with another hard link
    (it need not exist)."""
    path = Path(path)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise _refusal(path)
    if not stat.S_ISREG(info.st_mode):
        raise UserError(f"{path} is not a regular file: move it away")
    if info.st_nlink != 1:
        raise UserError(
            f"{path} has {info.st_nlink} hard links (another name shares its data): refusing to write it; remove it"
        )


def open_regular(path: Path):
    """``open(path, "rb")`` for a regular file only (links followed, as any reader follows them): a
    FIFO, device or socket at the name is refused in one line, never waited on (opening a FIFO
    blocks until something writes to it)."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UserError(f"{path} is not a regular file: move it away")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_regular(path: Path) -> bytes:
    """The bytes of ``path``, a regular file (:func:`open_regular`)."""
    with open_regular(path) as f:
        return f.read()


NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_inside(folder: Path, folder_fd: int, name: str, action: str, writer: str, remedy: str):
    """The file ``name`` (relative, forward slashes) opened part by part from the folder's descriptor
    with no symlink followed, and checked as opened: a regular file with one link (a hard link could
    be a file from outside the folder). A refusal reads ``cannot {action} {folder}: …`` and, for a
    file missing or unfit, names what ``writer`` wrote and the ``remedy``."""
    parts, fd, held = name.split("/"), folder_fd, []
    try:
        for part in parts[:-1]:
            fd = os.open(part, NOFOLLOW | os.O_DIRECTORY, dir_fd=fd)
            held.append(fd)
        opened = os.open(parts[-1], NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)  # a FIFO put there never blocks
    except FileNotFoundError:
        raise UserError(f"{folder} lacks {name}, which {writer} wrote: {remedy}") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UserError(
                f"cannot {action} {folder}: {name} is reached through a symbolic link: {action} sends only files "
                "inside the folder (nothing was uploaded)"
            ) from None
        raise UserError(f"cannot {action} {folder}: cannot open {name}: {exc.strerror}") from None
    finally:
        for fd in held:
            os.close(fd)
    info = os.fstat(opened)
    problem = (
        "is not a regular file"
        if not stat.S_ISREG(info.st_mode)
        else f"has {info.st_nlink} links (a hard link: its data may be a file outside the folder)"
        if info.st_nlink != 1
        else None
    )
    if problem:
        os.close(opened)
        raise UserError(f"cannot {action} {folder}: {name} {problem}; {remedy} (nothing was uploaded)")
    os.set_blocking(opened, True)
    return os.fdopen(opened, "rb")
