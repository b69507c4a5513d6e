"""benchmarks/budget.py's plan: each run spends its budget in at least the minimum steps, and the
report finds where two families' lines cross."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from benchmarks.budget import SMOKE_SIZES, Stores, crossing, flops_per_symbol, planned
from students.models.cost import StreamRates


@pytest.fixture
def stores() -> Stores:
    rates = StreamRates(symbols_per_byte=1.25, patches_per_byte=0.25)
    return Stores("eot", Path("train"), Path("heldout"), 100_000, rates)


@pytest.mark.parametrize("size", SMOKE_SIZES, ids=lambda s: s.name)
@pytest.mark.parametrize("budget_steps", [1000, 1500, 7777])
def test_a_run_spends_its_budget_in_at_least_the_minimum_steps(size, budget_steps, stores):
    args = argparse.Namespace(seq_len=64, min_steps=1000, sizes_scale=1)
    per_step = flops_per_symbol(size, stores, args) * args.seq_len
    budget = budget_steps * per_step * 3.3  # room for a batch of 3
    run = planned(size, stores, budget, 1e-3, args)
    assert run.steps >= args.min_steps
    spent = run.steps * run.batch * per_step
    assert abs(spent - budget) <= run.batch * per_step / 2 + 1e-6 * budget  # within half a step
    assert run.batch == math.floor(budget / (args.min_steps * per_step))


def test_a_budget_below_the_minimum_steps_takes_batch_one(stores):
    args = argparse.Namespace(seq_len=64, min_steps=1000, sizes_scale=1)
    size = SMOKE_SIZES[0]
    per_step = flops_per_symbol(size, stores, args) * args.seq_len
    run = planned(size, stores, 10 * per_step, 1e-3, args)
    assert (run.steps, run.batch) == (10, 1)


def test_crossing_names_where_the_sign_changes():
    assert "do not cross" in crossing([1e12, 3e12, 9e12], [0.2, 0.1, 0.05])
    text = crossing([1e12, 1e13], [0.1, -0.1])
    assert "near 3.2e+12" in text  # halfway on a log scale
