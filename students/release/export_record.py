"""The export record (``bytedistill_export.json``): the files ``export`` wrote into a folder.

A new ``export`` replaces the files the record names with its own (deleting those it does not
write again, :mod:`students.release.export_staging`), and ``push`` uploads
exactly them, so the record is trusted only as far as this module checks it: every name is a
relative path inside the folder (not absolute, no ``..``, no part starting with a dot: export writes
no dotfile), and what it names, if it exists, is a regular file reached through no symbolic link.
A record that names anything else is refused whole, before any file is deleted or read.

It also says what export owns in a folder (:func:`previous_export`): the files its record names; a
folder holding anything else (dotfiles aside) is refused before a file is touched.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from common.errors import UserError

EXPORT_RECORD = "bytedistill_export.json"


def _name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a file export wrote (None: it can)."""
    if not isinstance(name, str) or not name:
        return "not a file name"
    if name.startswith("/"):
        return "an absolute path"
    if "\\" in name or "\0" in name:
        return "not a plain path (backslash or NUL)"
    parts = name.split("/")
    if ".." in parts:
        return "a path outside the folder"
    if any(not part or part.startswith(".") for part in parts):
        return "not a plain path (empty or hidden part)"
    return None


def _kind_problem(folder: Path, name: str) -> str | None:
    """Why ``folder / name`` is not a regular file reached through no link (None: it is, or it is absent)."""
    path = folder
    parts = name.split("/")
    for depth, part in enumerate(parts, 1):
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat.S_ISLNK(mode):
            return f"a symlink (to {os.readlink(path)})" if depth == len(parts) else f"inside the symlink {part}"
        if depth == len(parts) and not stat.S_ISREG(mode):
            return "not a regular file"
    return None


def recorded_files(folder: Path) -> list[str]:
    """The names the folder's record lists, each checked (see the module docstring); a UserError otherwise."""
    folder = Path(folder)
    record = folder / EXPORT_RECORD
    if not record.is_file():
        raise UserError(f"{folder} has no {EXPORT_RECORD}: it was not written by bytedistill export")
    try:
        files = json.loads(record.read_text(encoding="utf-8"))["files"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise UserError(f"{record} is not an export record (JSON with a list of files): {exc}") from exc
    if not isinstance(files, list):
        raise UserError(f"{record} is not an export record: its files are not a list")
    for name in files:
        problem = _name_problem(name) or _kind_problem(folder, name)
        if problem:
            raise UserError(
                f"{record} lists {name!r}, {problem}: an export record names only regular files inside "
                "its folder (nothing was touched)"
            )
    return list(files)


def write_record(folder: Path, written: list[str]) -> None:
    """Record ``written`` (and the record itself) as what export wrote into ``folder``."""
    names = sorted(set(written) - {EXPORT_RECORD}) + [EXPORT_RECORD]
    (Path(folder) / EXPORT_RECORD).write_text(json.dumps({"files": names}, indent=2) + "\n", encoding="utf-8")


def visible_entries(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` → ``file``, ``dir`` or ``other`` (symlinks, devices…), relative with
    forward slashes; hidden entries (a part starting with a dot) and what lies below them are left out,
    and no symlink is followed."""
    entries: dict[str, str] = {}
    for root, dirs, files in os.walk(folder):
        base = Path(root).relative_to(folder)
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in [*dirs, *(f for f in files if not f.startswith("."))]:
            mode = os.lstat(Path(root) / name).st_mode
            kind = "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "other"
            entries[(base / name).as_posix()] = kind
    return entries


def foreign_entries(folder: Path, recorded: list[str]) -> list[str]:
    """The visible entries of ``folder`` that are neither recorded files nor folders holding them."""
    holders = {"/".join(name.split("/")[:i]) for name in recorded for i in range(1, name.count("/") + 1)}
    foreign = []
    for name, kind in sorted(visible_entries(folder).items()):
        if any(name.startswith(f"{outer}/") for outer in foreign):
            continue  # inside a foreign folder already named
        if not ((kind == "file" and name in recorded) or (kind == "dir" and name in holders)):
            foreign.append(name)
    return foreign


def previous_export(output: Path) -> list[str]:
    """The files an earlier export wrote into ``output`` (to be replaced); refuses a folder holding anything
    else (dotfiles aside) or a record naming anything but regular files inside it. Touches nothing."""
    if not output.exists() and not output.is_symlink():
        return []
    if not output.is_dir():
        raise UserError(f"{output} exists and is not a folder")
    previous = recorded_files(output) if (output / EXPORT_RECORD).exists() else []
    others = foreign_entries(output, previous)
    if others:
        raise UserError(
            f"{output} is not empty and not a bytedistill export (it holds {', '.join(others[:3])}); "
            "give an empty folder (nothing was touched)"
        )
    return previous


def written_files(output: Path, before: dict[str, str]) -> list[str]:
    """The regular files in ``output`` that were not in ``before`` (a :func:`visible_entries` listing)."""
    return sorted(name for name, kind in visible_entries(output).items() if kind == "file" and name not in before)
