"""The dumping half of the benchmark smoke runs (tests/test_benchmarks_smoke.py says why)."""

from __future__ import annotations

import pytest

from tests.benchmark_smoke import SMOKED_DUMPING, run_smoke


@pytest.mark.slow
@pytest.mark.parametrize("benchmark", list(SMOKED_DUMPING))
def test_the_benchmark_runs_at_toy_sizes(benchmark, capsys):
    run_smoke(benchmark, capsys)
