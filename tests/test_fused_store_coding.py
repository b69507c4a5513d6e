"""The estimates of benchmarks/fused_store_coding.py on rows whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.fused_store_coding import Coded, conditional_entropy, paired_half, sums_and_splits
from bytestream.alphabet import FUSED_ENDS


def test_conditional_entropy_counts_bits_within_each_context():
    # context 0: two codes, equally often (1 bit each); context 1: one code (0 bits)
    assert conditional_entropy(np.array([0, 0, 1, 1]), np.array([5, 6, 7, 7])) == pytest.approx(2 / 8)


N = 5000


def codes16(seed: int) -> np.ndarray:
    """N codes among 16 values, one per bucket of the paired-half context (few cells: a small bias)."""
    return 16 * np.random.default_rng(seed).integers(0, 16, N)


def rows(ends_code, ends_value) -> Coded:
    """N positions, each byte 97 'goes on' (a random code) then 'ends'."""
    goes_codes = codes16(0)
    goes_values = np.random.default_rng(0).uniform(0.01, 0.5, N)
    codes = np.stack([goes_codes, ends_code(goes_codes)], 1).reshape(-1)
    values = np.stack([goes_values, ends_value(goes_values)], 1).reshape(-1)
    return Coded(
        text_bytes=N,
        shard_bytes=0,
        codes=codes,
        contexts=np.zeros(2 * N, np.int64),
        values=values,
        symbols=np.tile([97, FUSED_ENDS + 97], N),
        positions=np.repeat(np.arange(N), 2),
        depths=np.zeros(2 * N, np.int64),
    )


def test_the_paired_half_context_sees_an_ends_code_that_follows_its_goes_on_code():
    fused = rows(lambda goes: goes, lambda goes: goes)  # 4 bits a value alone; the ends half then free
    assert paired_half(fused) == pytest.approx(N * 4 / 8, rel=0.01)
    assert conditional_entropy(fused.contexts, fused.codes) == pytest.approx(2 * N * 4 / 8, rel=0.01)
    independent = rows(lambda goes: codes16(1), lambda goes: goes)
    assert paired_half(independent) == pytest.approx(2 * N * 4 / 8, rel=0.02)


def test_sums_and_splits_code_an_even_split_in_no_bits():
    even = rows(lambda goes: goes, lambda goes: goes)  # each byte's mass split in half: one split code
    uneven = rows(lambda goes: goes, lambda goes: np.random.default_rng(2).uniform(0.01, 0.5, len(goes)))
    assert sums_and_splits(uneven) - sums_and_splits(even) > N * 4 / 8  # over 4 bits a split
