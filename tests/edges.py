"""The harness of the edge-case tables: one row per bad input, one line and exit 2, nothing touched.

A row (:class:`Edge`) names the command line, how to set up the folder it runs in, and a fragment
of the one error line it must print. :func:`check_edge` runs it in a fresh folder and asserts:

- exit status 2 (or ``Edge.status``), no traceback on stderr;
- the last line of stderr is ``bytedistill CMD: error: …`` and contains the fragment;
- every file in the folder (and the targets of its symlinks) is byte-identical before and after:
  a refused command touched nothing (``creates_ok``: it may have added files of its own);
- ``after``, if given, holds of the folder afterwards (e.g. no partial files of its own left).

Arguments and environment values may use ``{tmp}`` for the case's folder, and ``{name}`` for any
value the test passes in ``values`` (a server's URL, a fixture's path). Rows run in-process (``bytedistill`` main) by
default; ``subprocess=True`` runs ``python -m bytedistill`` instead, for cases that need their own
process (a resource limit, an environment variable read at import, a signal, what standard input holds).
"""

from __future__ import annotations

import hashlib
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bytedistill.cli import main as bytedistill


def no_setup(tmp: Path) -> None:
    """A row whose command needs nothing in its folder."""


@dataclass(frozen=True)
class Edge:
    name: str
    argv: list[str]
    expect: str
    setup: Callable[[Path], None] = no_setup
    status: int = 2
    subprocess: bool = False
    env: dict[str, str] = field(default_factory=dict)
    file_size_limit: int | None = None  # bytes (``ulimit -f``), subprocess rows only
    stdin: str | None = None  # what standard input holds, subprocess rows only (default: the test's own)
    timeout: float = 300.0
    creates_ok: bool = False  # the command may leave new files of its own; existing ones stay as they were
    after: Callable[[Path], None] | None = None  # asserts about the folder once the command has run

    def __str__(self) -> str:
        return self.name


def snapshot(root: Path) -> dict[str, str]:
    """Path → sha256 of every file under ``root``; a symlink → its target (and the target's hash)."""
    state: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        if path.is_symlink():
            target = os.readlink(path)
            state[key] = f"-> {target}" + (f" {_digest(path)}" if path.is_file() else "")
        elif path.is_file():
            state[key] = _digest(path)
        elif path.is_dir():
            state[key] = "dir"
    return state


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fill(text: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        text = text.replace(f"{{{name}}}", value)
    return text


def _run_in_process(edge: Edge, tmp: Path, capsys, monkeypatch, values: dict[str, str]) -> tuple[int, str]:
    monkeypatch.chdir(tmp)
    for name, value in edge.env.items():
        monkeypatch.setenv(name, _fill(value, values))
    capsys.readouterr()
    status = bytedistill([_fill(arg, values) for arg in edge.argv])
    return status, capsys.readouterr().err


def _run_subprocess(edge: Edge, tmp: Path, values: dict[str, str]) -> tuple[int, str]:
    env = {**os.environ, **{k: _fill(v, values) for k, v in edge.env.items()}}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH", "")])

    def limit() -> None:
        if edge.file_size_limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (edge.file_size_limit, edge.file_size_limit))

    done = subprocess.run(
        [sys.executable, "-m", "bytedistill", *(_fill(arg, values) for arg in edge.argv)],
        check=False,
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        input=edge.stdin,
        timeout=edge.timeout,
        preexec_fn=limit,
    )
    return done.returncode, done.stderr


def check_edge(edge: Edge, tmp: Path, capsys, monkeypatch, values: dict[str, str] | None = None) -> str:
    """Run one row in ``tmp`` and assert its contract; returns the error line. ``values`` fill the
    row's ``{name}`` placeholders besides ``{tmp}``."""
    values = {**(values or {}), "tmp": str(tmp)}
    edge.setup(tmp)
    before = snapshot(tmp)
    if edge.subprocess:
        status, err = _run_subprocess(edge, tmp, values)
    else:
        status, err = _run_in_process(edge, tmp, capsys, monkeypatch, values)
    assert "Traceback" not in err, f"{edge}: traceback\n{err}"
    lines = [line for line in err.splitlines() if line.strip()]
    command = edge.argv[0]
    assert lines, f"{edge}: nothing on stderr (status {status})"
    last = lines[-1]
    assert status == edge.status, f"{edge}: status {status}, stderr:\n{err}"
    assert last.startswith(f"bytedistill {command}: error: "), f"{edge}: last line {last!r}"
    assert edge.expect in last, f"{edge}: {edge.expect!r} not in {last!r}"
    after = snapshot(tmp)
    if edge.creates_ok:
        after = {key: value for key, value in after.items() if key in before}
    assert after == before, f"{edge}: files changed"
    if edge.after is not None:
        edge.after(tmp)
    return last
