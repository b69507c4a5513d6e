"""Every benchmark runs: ``python -m benchmarks.X --smoke`` (toy sizes, seconds) exits 0 and prints
its table, so that an API change that breaks one fails here rather than at its next real run.

Where a benchmark needs the real SmolLM2 teacher, the quickstart's model or a GPU, its smoke run
uses the tiny teacher and the toy exported student of ``benchmarks/smoke.py``, or the CPU. Not
here: the benchmarks listed in ``NOT_SMOKED``, with the reason.
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
    "corpus_fingerprint": "summary: worker 0 checks this share of the corpus",
    "dump": "share outside the forward = ",
    "dump_gpu": "memory: formula / peak on cpu",
    "loading_paths": "summary: documented path",
    "patched": "summary: large-model steps per byte patched/flat",
    "prompt_cut": "summary: healed ",
    "store": "best (smallest with mean KL",
    "dump_memory": "summary: worst |estimate - peak| / peak",
    "fused": "summary: flat steps per text byte on the quickstart",
}
NOT_SMOKED = {
    "generation": "its own smoke test",
}


def test_every_benchmark_is_smoked_or_says_why_not():
    modules = {p.stem for p in (ROOT / "benchmarks").glob("*.py")} - {"__init__", "common", "results", "smoke"}
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
