"""Every benchmark runs: ``python -m benchmarks.X --smoke`` (toy sizes, seconds) exits 0 and prints
its table, so that an API change that breaks one fails here rather than at its next real run. The
module runs as ``__main__`` in the test's process, or in its own where it measures its process
(tests/benchmark_smoke.py).

Where a benchmark needs the real SmolLM2 teacher, the quickstart's model or a GPU, its smoke run
uses the tiny teacher and the toy exported student of ``benchmarks/smoke.py``, or the CPU. Not
here: the benchmarks listed in ``NOT_SMOKED``, with the reason. Here the training half of
``SMOKED`` (tests/benchmark_smoke.py); the dumping half is in tests/test_benchmarks_smoke_dump.py.
"""

from __future__ import annotations

import pytest

from tests.benchmark_smoke import ROOT, SMOKED, SMOKED_TRAINING, run_smoke

NOT_SMOKED = {
    "generation": "its own smoke test",
    "dump_host": "not a script of its own: benchmarks.dump_gpu's host side, which dump_gpu's smoke run measures",
    "onnx_step": "not a benchmark: the ONNX Runtime step benchmarks.serve's smoke run decodes (tests/test_onnx_step.py)",
}


def test_every_benchmark_is_smoked_or_says_why_not():
    modules = {p.stem for p in (ROOT / "benchmarks").glob("*.py")} - {"__init__", "common", "results", "smoke"}
    assert modules - set(SMOKED) - set(NOT_SMOKED) == set()


@pytest.mark.slow
@pytest.mark.parametrize("benchmark", list(SMOKED_TRAINING))
def test_the_benchmark_runs_at_toy_sizes(benchmark, capsys):
    run_smoke(benchmark, capsys)
