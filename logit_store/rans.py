"""A static rANS coder with one frequency table per context (Numba).

``encode(symbols, contexts, freq)`` turns byte symbols into 16-bit words; ``decode`` gives them
back, given the same contexts and tables. A context may depend on the symbol before: given
``groups[i] = 2 * g + start``, :func:`chained_contexts` is ``g * width`` where ``start`` is 1 and
``g * width + buckets[symbols[i - 1]]`` elsewhere; ``decode`` computes the same as it decodes. State: 32 bits in [2^16, 2^32), renormalised 16 bits
at a time; a table row sums to 2^PRECISION (FORMAT.md, "pow8-ans"). The decoder checks every
read against the word count and that the final state is the initial one, so a corrupt stream
is refused, never read past its end.

Decoding speed: the slot → symbol table (1024 bytes per context, megabytes per chunk) misses
the cache; code 0 (most pow8 values) occupies the slots below its frequency, so the decoder
tests that first against a small per-context array and reads the table only for other codes
(twice as fast on the benchmark's chunks). The decode is one dependency chain per value; the
next step would be several interleaved states (a format change).
"""

from __future__ import annotations

import numba
import numpy as np

PRECISION = 10
TOTAL = 1 << PRECISION
STATE_LOW = 1 << 16


def quantise(counts: np.ndarray) -> np.ndarray:
    """(C, A) symbol counts → (C, A) uint16 frequencies: each used row sums to TOTAL, every
    counted symbol gets ≥ 1; rows without counts stay 0."""
    freq = np.zeros(counts.shape, np.int64)
    _quantise(np.ascontiguousarray(counts, np.int64), freq)
    return freq.astype(np.uint16)


@numba.njit(cache=True, nogil=True)
def _quantise(counts, freq):
    for r in range(counts.shape[0]):
        total = counts[r].sum()
        if total == 0:
            continue
        assigned = 0
        for a in range(counts.shape[1]):
            if counts[r, a] > 0:
                freq[r, a] = max(1, (counts[r, a] * TOTAL) // total)
                assigned += freq[r, a]
        while assigned != TOTAL:  # give or take the rest at the largest entries
            best = np.argmax(freq[r])
            if assigned < TOTAL:
                freq[r, best] += TOTAL - assigned
                assigned = TOTAL
            else:
                step = min(assigned - TOTAL, freq[r, best] - 1)
                freq[r, best] -= step
                assigned -= step


def chained_contexts(
    groups: np.ndarray, width: int, buckets: np.ndarray, symbols: np.ndarray, num_contexts: int
) -> tuple[np.ndarray, np.ndarray]:
    """The context of every symbol, and the (num_contexts, 256) symbol counts per context."""
    out = np.empty(len(groups), np.int64)
    counts = np.zeros((num_contexts, 256), np.int64)
    _chain(groups, width, buckets.astype(np.int64), symbols, out, counts)
    return out, counts


@numba.njit(cache=True, nogil=True)
def _chain(groups, width, buckets, symbols, out, counts):
    for i in range(len(groups)):
        g = groups[i]
        out[i] = (g >> 1) * width + (0 if g & 1 else buckets[symbols[i - 1]])
        counts[out[i], symbols[i]] += 1


def cumulative(freq: np.ndarray) -> np.ndarray:
    """(C, A+1) cumulative frequencies: row r, column a is the sum of freq[r, :a]."""
    cum = np.zeros((freq.shape[0], freq.shape[1] + 1), np.uint32)
    np.cumsum(freq, axis=1, out=cum[:, 1:])
    return cum


def tables(freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(C, A+1) cumulative frequencies and the (C, TOTAL) slot → symbol table."""
    cum = cumulative(freq)
    slots = np.zeros((freq.shape[0], TOTAL), np.uint8)
    for r in range(freq.shape[0]):
        if cum[r, -1]:
            slots[r] = np.repeat(np.arange(freq.shape[1], dtype=np.uint8), freq[r])
    return cum, slots


@numba.njit(cache=True, nogil=True)
def _encode(symbols, contexts, freq, cum, out):
    x = np.uint64(STATE_LOW)
    n_out = 0
    for i in range(len(symbols) - 1, -1, -1):
        c, s = contexts[i], symbols[i]
        f = np.uint64(freq[c, s])
        limit = np.uint64((STATE_LOW >> PRECISION) << 16) * f
        while x >= limit:
            out[n_out] = np.uint16(x & np.uint64(0xFFFF))
            n_out += 1
            x >>= np.uint64(16)
        x = (x // f << np.uint64(PRECISION)) + x % f + np.uint64(cum[c, s])
    out[n_out] = np.uint16(x & np.uint64(0xFFFF))
    out[n_out + 1] = np.uint16(x >> np.uint64(16))
    return n_out + 2


def encode(symbols: np.ndarray, contexts: np.ndarray, freq: np.ndarray) -> np.ndarray:
    """uint16 words (in decoding order) of ``symbols`` coded with ``freq[contexts[i]]``."""
    cum = cumulative(freq)
    out = np.empty(2 * len(symbols) + 2, np.uint16)
    n = _encode(np.ascontiguousarray(symbols), np.ascontiguousarray(contexts), freq, cum, out)
    return out[:n][::-1].copy()


@numba.njit(cache=True, nogil=True)
def _decode(words, groups, width, buckets, info, freq, cum, slots, out):
    """0 on success; -1: the words ran out; -2: the final state is wrong; -3: a context
    without a table. ``info[c]`` is ``row << 11 | freq[row, 0]`` for context c's table (-1:
    none): a slot below the frequency of code 0 (most values) decodes without the slot table."""
    if len(words) < 2:
        return -1
    x = (np.int64(words[0]) << 16) | np.int64(words[1])
    at = 2
    s = 0
    for i in range(len(out)):
        g = groups[i]
        c = (g >> 1) * width + (0 if g & 1 else buckets[s])
        if c < 0 or c >= len(info) or info[c] < 0:
            return -3
        slot = x & (TOTAL - 1)
        zero_freq = info[c] & 2047
        if slot < zero_freq:
            s = 0
            x = zero_freq * (x >> PRECISION) + slot
        else:
            r = info[c] >> 11
            s = slots[r, slot]
            x = np.int64(freq[r, s]) * (x >> PRECISION) + slot - np.int64(cum[r, s])
        while x < STATE_LOW:
            if at >= len(words):
                return -1
            x = (x << 16) | np.int64(words[at])
            at += 1
        out[i] = s
    if x != STATE_LOW or at != len(words):
        return -2
    return 0


STATUS = {-1: "the stream ends early", -2: "wrong final state", -3: "a context without a frequency table"}


def decode(words, groups, width: int, buckets, used: np.ndarray, freq: np.ndarray, num_contexts: int) -> np.ndarray:
    """The symbols coded in ``words`` with contexts as in :func:`chained_contexts`; ``freq[k]``
    is the table of context ``used[k]``. ``ValueError`` if the stream is corrupt (every context
    met must have a table, and every table must sum to TOTAL)."""
    if np.any(freq.astype(np.int64).sum(axis=1) != TOTAL):
        raise ValueError("a frequency table does not sum to the coder's total")
    info = np.full(num_contexts, -1, np.int64)
    info[used] = (np.arange(len(used), dtype=np.int64) << 11) | freq[:, 0]
    cum, slots = tables(freq)
    out = np.empty(len(groups), np.uint8)
    status = _decode(words, groups, width, buckets.astype(np.int64), info, freq, cum, slots, out)
    if status != 0:
        raise ValueError(f"entropy-coded values are corrupt ({STATUS[status]})")
    return out
