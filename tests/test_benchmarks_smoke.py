"""Every benchmark runs: ``python -m benchmarks.X --smoke`` (toy sizes, seconds) exits 0 and prints
its table, so that an API change that breaks one fails here rather than at its next real run.

Not here: ``benchmarks.generation`` (its own smoke test), and the benchmarks that need a trained
quickstart model, the real SmolLM2 teacher or a GPU (see the list in ``NOT_SMOKED``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# benchmark -> a line its smoke run prints
SMOKED = {
    "startup": "bytedistill --help",
    "train": "ratio ",
    "train_threads": "summary: one per CPU",
    "convert": "ratio numba(sorted columns)/floor",
    "train_data": "summary: decompressions per epoch",
    "dump_memory": "summary: worst |estimate - peak| / peak",
}
NOT_SMOKED = {
    "corpus_fingerprint": "hundreds of MB of corpus",
    "dump": "the real SmolLM2 teacher",
    "dump_gpu": "a GPU",
    "loading_paths": "the quickstart's exported model",
    "patched": "the real SmolLM2 teacher and two trainings",
    "prompt_cut": "the quickstart's exported model",
    "store": "the real SmolLM2 teacher",
    "generation": "its own smoke test",
}


def test_every_benchmark_is_smoked_or_says_why_not():
    modules = {p.stem for p in (ROOT / "benchmarks").glob("*.py")} - {"__init__", "common", "results"}
    assert modules - set(SMOKED) - set(NOT_SMOKED) == set()


@pytest.mark.slow
@pytest.mark.parametrize("benchmark", list(SMOKED))
def test_the_benchmark_runs_at_toy_sizes(benchmark):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    result = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{benchmark}", "--smoke"],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert SMOKED[benchmark] in result.stdout, result.stdout[-2000:]
