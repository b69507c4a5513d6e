"""The ``pow8`` codes (``pow8`` and ``pow8-ans``) are found by a table search instead of a power per
value: the search gives the power's code for every value, the hard ones included (at and around
every code's threshold, zero, the code-0 bound, 1 and just above it), and the same target tails."""

from __future__ import annotations

import numpy as np

from logit_store.encodings import _encode_pow, get_encoding


def hard_values(encoding, rng: np.random.Generator) -> np.ndarray:
    thresholds = encoding._code_search[0][1:-1]
    around = np.repeat(thresholds, 40) * (1 + rng.uniform(-4e-9, 4e-9, 40 * len(thresholds)))
    steps = [np.nextafter(thresholds, 0), thresholds, np.nextafter(thresholds, 2)]
    edges = [0.0, 1e-300, 1e-12, 1.0, np.nextafter(1.0, 0), np.nextafter(1.0, 2), 1.0 + 1e-12]
    return np.concatenate([around, *steps, edges])


def test_searched_pow8_codes_and_target_tails_equal_the_power_codes():
    rng = np.random.default_rng(0)
    for name, gamma in (("pow8-ans", None), ("pow8", 0.5), ("pow8", 0.3)):
        encoding = get_encoding(name, {} if gamma is None else {"gamma": gamma})
        weights = np.exp(4.0 * rng.standard_normal(200_000))
        values = np.concatenate([weights / weights.sum() * 300, hard_values(encoding, rng)])  # a few "positions"
        offsets = np.linspace(0, len(values), 301).astype(np.int64)
        targets = rng.integers(offsets[:-1], offsets[1:])  # every position's target: most get code 0
        searched, tails = encoding.encode(values, offsets, targets)
        positions = len(offsets) - 1
        codes, power_tails, target_tails = (
            np.empty(len(values), np.uint8),
            np.empty(positions, np.uint8),
            np.zeros(positions, np.uint8),
        )
        _encode_pow(values, offsets, encoding.gamma, encoding.levels, targets, codes, power_tails, target_tails)
        assert np.array_equal(searched.reshape(-1), codes), name
        assert np.array_equal(tails[:, 0], power_tails), name
        assert np.array_equal(tails[:, 1], target_tails) and target_tails.any() and not target_tails.all(), name
        assert len(np.unique(codes)) == 256  # every code met
