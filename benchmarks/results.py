"""The sections of ``docs/RESULTS.md`` that benchmarks write (``--markdown``), so that a rerun
updates its table instead of a hand edit.

A section is the text between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->``; a
benchmark replaces it with the command that ran, the commit and the machine's load, and its
table. A section not yet in the file is appended at its end.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "RESULTS.md"


def provenance() -> str:
    """``python -m benchmarks.X ARGS`` at commit C (load L on N CPUs): what a reader reruns."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    program = f"python -m {spec.name}" if spec else f"python {shlex.quote(sys.argv[0])}"
    command = " ".join([program, *map(shlex.quote, sys.argv[1:])])  # quoted: a reader pastes it into a shell
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True, cwd=RESULTS.parent
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"`{command}` at commit {commit} (load {load:.1f} on {os.cpu_count()} CPUs)"


def write_section(name: str, table: str, path: Path = RESULTS) -> None:
    """Replace (or append) section ``name`` of ``path`` with its provenance line and ``table``."""
    begin, end = f"<!-- results:{name} -->", f"<!-- /results:{name} -->"
    body = f"{begin}\n{provenance()}:\n\n{table.rstrip()}\n{end}"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Measured results\n"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    text = pattern.sub(lambda _: body, text) if pattern.search(text) else text.rstrip() + f"\n\n{body}\n"
    path.write_text(text, encoding="utf-8")
    print(f"wrote section {name!r} of {path}")


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
