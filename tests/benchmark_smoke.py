"""Runs ``python -m benchmarks.X --smoke`` for the smoke tests, which live in two files
(tests/test_benchmarks_smoke.py and tests/test_benchmarks_smoke_dump.py) so that under
``--dist loadfile`` the two halves go to two workers instead of one."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
import warnings
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
    "serve": "per-step overhead at batch 1",
    "on_policy": "summary: best on-policy run",
    "chat": "summary: chat student (loss on all, train's default; the default size)",
    "hub_store": "summary: Hub/disk positions/s after the first epoch",
    "bytes_student": "summary: plain-byte BPB bytes - fused self-flagged at equal training FLOPs",
    "peers": " clients / 1 client bytes/s",
}
SMOKED_DUMPING = {
    "convert": "ratio numba(sorted columns)/floor",
    "dump": "share outside the forward = ",
    "dump_gpu": "summary: host side: ",
    "prompt_cut": "summary: healed ",
    "store": "best (smallest with mean KL",
    "dump_memory": "summary: worst |estimate - peak| / peak",
    "budget": "summary: <eot> stream: best BPB patched - flat at budgets",
    "fused_store_coding": "summary: fused/<eot> shard bytes",
    "step_profile": "summary: flat S batch 1 step",
}
SMOKED = SMOKED_TRAINING | SMOKED_DUMPING


# benchmarks that measure their own process (its peak memory, its start-up), so run in one of their own
OWN_PROCESS = {"startup", "dump_memory", "dump_gpu"}


def run_smoke(benchmark: str, capsys) -> str:
    """``python -m benchmarks.X --smoke``: the module run as ``__main__`` with that command line, in
    this process (it has torch and transformers imported already: about 7 s less per run) unless it
    measures its process (:data:`OWN_PROCESS`). What a run may change in the process (threads,
    environment, working folder, compiled graphs, accelerate's state) is put back afterwards."""
    if benchmark in OWN_PROCESS:
        out = _run_in_subprocess(benchmark)
    else:
        out = _run_in_process(benchmark, capsys)
    assert SMOKED.get(benchmark, "summary") in out, out[-2000:]
    return out


def _run_in_subprocess(benchmark: str) -> str:
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
    return result.stdout


def _run_in_process(benchmark: str, capsys) -> str:
    import torch
    from accelerate.state import AcceleratorState

    threads, environ, cwd, argv = torch.get_num_threads(), dict(os.environ), os.getcwd(), sys.argv
    capsys.readouterr()
    try:
        os.chdir(ROOT)
        sys.argv = [f"benchmarks/{benchmark}.py", "--smoke"]
        with warnings.catch_warnings():  # a benchmark another one imports runs as __main__ all the same
            warnings.filterwarnings("ignore", "'benchmarks.* found in sys.modules", RuntimeWarning)
            runpy.run_module(f"benchmarks.{benchmark}", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        assert exc.code in (0, None), capsys.readouterr().err[-4000:]
    finally:
        sys.argv = argv
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)
        torch.set_num_threads(threads)
        torch._dynamo.reset()
        AcceleratorState._reset_state(reset_partial_state=True)
    return capsys.readouterr().out
