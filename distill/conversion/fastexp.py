"""A vectorisable float64 exp for Numba (libm's exp is scalar and ~4× slower).

Cody–Waite reduction x = k·ln2 + r with |r| ≤ ln2/2, a degree-11 Taylor polynomial for e^r
(relative error < 1e-14) and 2^k assembled in the exponent bits. Inputs at or below
:data:`UNDERFLOW` give exactly 0 (true values there are below 1e-307 and subnormal).
"""

from __future__ import annotations

import numba
import numpy as np

LOG2E = 1.4426950408889634
LN2_HI = 0.6931471803691238
LN2_LO = 1.9082149292705877e-10
ROUNDER = 6755399441055744.0  # 2**52 + 2**51: adding it rounds to an integer kept in the low bits
UNDERFLOW = -708.0

# No 'reassoc': the rounding trick must not be simplified away.
_EXACT_FLAGS = {"nnan", "ninf", "nsz", "contract", "afn", "arcp"}


@numba.njit(fastmath=_EXACT_FLAGS, cache=True)
def exp_shifted(src, start, stop, shift, out, scratch):
    """out[i] = exp(src[i] - shift) for i in [start, stop); ``scratch``: int64, len ≥ stop − start.

    Call it on blocks of a few thousand elements so that its three passes stay in L1.
    """
    rounded = scratch.view(np.float64)
    for i in range(start, stop):  # polynomial part; three simple loops so LLVM vectorises each
        v = src[i] - shift
        x = max(v, UNDERFLOW)
        kr = x * LOG2E + ROUNDER
        rounded[i - start] = kr
        k = kr - ROUNDER
        r = x - k * LN2_HI
        r = r - k * LN2_LO
        p = 1.0 / 39916800.0
        p = p * r + 1.0 / 3628800.0
        p = p * r + 1.0 / 362880.0
        p = p * r + 1.0 / 40320.0
        p = p * r + 1.0 / 5040.0
        p = p * r + 1.0 / 720.0
        p = p * r + 1.0 / 120.0
        p = p * r + 1.0 / 24.0
        p = p * r + 1.0 / 6.0
        p = p * r + 0.5
        p = p * r + 1.0
        p = p * r + 1.0
        out[i] = p if v > UNDERFLOW else 0.0
    for i in range(start, stop):  # 2^k from the integer in the low bits
        k = (scratch[i - start] << 32) >> 32
        scratch[i - start] = (k + 1023) << 52
    for i in range(start, stop):
        out[i] *= rounded[i - start]
