"""Runs ``python -m benchmarks.X --smoke`` for the smoke tests, which live in two files
(tests/test_benchmarks_smoke.py and tests/test_benchmarks_smoke_dump.py) so that under
``--dist loadfile`` the two halves go to two workers instead of one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# benchmark -> a line its smoke run prints, in two halves of about equal time
SMOKED_TRAINING = {
    "startup": "bytedistill --help",
    "train": "ratio ",
    "train_threads": "summary: one per CPU",
    "train_data": "summary: decompressions per epoch",
    "corpus_fingerprint": "summary: worker 0 checks this share of the corpus",
    "loading_paths": "summary: documented path",
    "patched": "summary: large-model steps per byte patched/flat",
    "fused": "summary: flat steps per text byte on the quickstart",
}
SMOKED_DUMPING = {
    "convert": "ratio numba(sorted columns)/floor",
    "dump": "share outside the forward = ",
    "dump_gpu": "memory: formula / peak on cpu",
    "prompt_cut": "summary: healed ",
    "store": "best (smallest with mean KL",
    "dump_memory": "summary: worst |estimate - peak| / peak",
}
SMOKED = SMOKED_TRAINING | SMOKED_DUMPING


def run_smoke(benchmark: str) -> None:
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
