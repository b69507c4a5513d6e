"""The command line starts fast: ``bytedistill --help`` and every ``bytedistill CMD --help`` build
their parsers from config classes that import no torch, transformers, accelerate or Numba (those
load where a command runs). Measured in fresh interpreters, against a bound generous enough for a
busy machine (about 1 s each on an idle one; ``python -m benchmarks.startup`` prints the figures).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bytedistill.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
BOUND_S = 5.0  # the goal is 2 s on an idle machine
HEAVY = ("torch", "transformers", "accelerate", "numba")

EVERY_HELP = f"""
import sys
from bytedistill.cli import main
for argv in [[], *([name] for name in {list(COMMANDS)!r})]:
    try:
        main([*argv, "--help"])
    except SystemExit:
        pass
    heavy = [m for m in {HEAVY!r} if m in sys.modules]
    print("bytedistill", *argv, "--help imported", heavy or "none", file=sys.stderr)
    assert not heavy, heavy
"""


def run_python(code: str) -> tuple[float, subprocess.CompletedProcess]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", code], check=False, cwd=ROOT, env=env, capture_output=True, text=True
    )
    return time.perf_counter() - start, result


def test_help_starts_within_the_bound():
    seconds, result = run_python("import sys\nfrom bytedistill.cli import main\nsys.exit(main(['--help']))")
    assert result.returncode == 0, result.stderr
    assert "dump" in result.stdout and "train" in result.stdout
    assert seconds < BOUND_S, f"bytedistill --help took {seconds:.1f} s"


def test_no_help_imports_a_heavy_library():
    """Every subcommand's --help, one after another in one process: none has imported torch & co."""
    seconds, result = run_python(EVERY_HELP)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("imported none") == len(COMMANDS) + 1, result.stderr
    assert seconds < BOUND_S * 2, f"every --help took {seconds:.1f} s together"


@pytest.mark.slow
def test_the_probe_sees_a_heavy_import():
    """The check can fail: a --help after ``import torch`` is reported."""
    _, result = run_python("import torch\n" + EVERY_HELP)
    assert result.returncode != 0 and "['torch']" in result.stderr
