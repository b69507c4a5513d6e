"""A static rANS coder with one frequency table per context and two interleaved states (Numba).

``encode(symbols, contexts, freq)`` turns byte symbols into 16-bit words; ``decode`` gives them
back, given the same contexts and tables. Symbol i is coded by state i mod 2, so decoding runs
two independent chains side by side. A context may depend on the symbol two places back (the
one the same state decoded last): given ``groups[i] = 2 * g + start``, :func:`chained_contexts`
is ``g * width`` where symbol i or i − 1 starts a group, else ``g * width + buckets[symbols[i -
2]]``; ``decode`` computes the same as it decodes. States: 32 bits in [2^16, 2^32), renormalised
16 bits at a time; a table row sums to 2^PRECISION (FORMAT.md, "pow8-ans"). The decoder checks
every read against the word count and that the final states are the initial ones, so a corrupt
stream is refused, never read past its end.

Decoding speed: each symbol's context depends on a symbol decoded before it, so one state is
one dependency chain; two states halve its length (contexts on the symbol just before would
chain the states together again). The slot → symbol table (1024 bytes per context, megabytes
per chunk) misses the cache; code 0 (most pow8 values) occupies the slots below its frequency,
so the decoder tests that first against a small per-context array and reads the table only for
other codes.
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
    groups: np.ndarray,
    width: int,
    buckets: np.ndarray,
    symbols: np.ndarray,
    num_contexts: int,
    out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The context of every symbol (int16: 2 bytes a value, the largest array of a chunk being
    coded), into ``out`` if given (``groups`` itself, when int16: chained in place, so that a chunk
    needs one such array), and the (num_contexts, 256) symbol counts per context."""
    if num_contexts > np.iinfo(np.int16).max + 1:
        raise ValueError(f"{num_contexts} contexts do not fit int16")
    out = np.empty(len(groups), np.int16) if out is None else out
    counts = np.zeros((num_contexts, 256), np.int64)
    _chain(groups, width, buckets.astype(np.int64), symbols, out, counts)
    return out, counts


@numba.njit(cache=True, nogil=True)
def _chain(groups, width, buckets, symbols, out, counts):
    before = groups[-1] if len(groups) else 0  # groups[i - 1], read before out[i - 1] may overwrite it
    for i in range(len(groups)):
        g = groups[i]  # as _decode computes it (a helper function here costs 7×)
        out[i] = (g >> 1) * width if g & 1 or before & 1 else (g >> 1) * width + buckets[symbols[i - 2]]
        counts[out[i], symbols[i]] += 1
        before = g


def cumulative(freq: np.ndarray) -> np.ndarray:
    """(C, A+1) cumulative frequencies: row r, column a is the sum of freq[r, :a]."""
    cum = np.zeros((freq.shape[0], freq.shape[1] + 1), np.uint32)
    np.cumsum(freq, axis=1, out=cum[:, 1:])
    return cum


def tables(freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(C, A+1) cumulative frequencies and the (C, TOTAL) slot → symbol table (rows must sum
    to TOTAL)."""
    cum = cumulative(freq)
    slots = np.zeros((freq.shape[0], TOTAL), np.uint8)
    _fill_slots(cum, slots)
    return cum, slots


@numba.njit(cache=True, nogil=True)
def _fill_slots(cum, slots):
    for r in range(cum.shape[0]):
        for a in range(cum.shape[1] - 1):
            slots[r, cum[r, a] : cum[r, a + 1]] = a


@numba.njit(cache=True, nogil=True)
def _encode(symbols, contexts, freq, cum, out):
    states = np.full(2, STATE_LOW, np.uint64)  # symbol i is coded by state i % 2
    n_out = 0
    for i in range(len(symbols) - 1, -1, -1):
        c, s, k = contexts[i], symbols[i], i & 1
        x = states[k]
        f = np.uint64(freq[c, s])
        limit = np.uint64((STATE_LOW >> PRECISION) << 16) * f
        while x >= limit:
            out[n_out] = np.uint16(x & np.uint64(0xFFFF))
            n_out += 1
            x >>= np.uint64(16)
        states[k] = (x // f << np.uint64(PRECISION)) + x % f + np.uint64(cum[c, s])
    for k in (1, 0):
        out[n_out] = np.uint16(states[k] & np.uint64(0xFFFF))
        out[n_out + 1] = np.uint16(states[k] >> np.uint64(16))
        n_out += 2
    return n_out


def encode(symbols: np.ndarray, contexts: np.ndarray, freq: np.ndarray) -> np.ndarray:
    """uint16 words (in decoding order) of ``symbols`` coded with ``freq[contexts[i]]``."""
    cum = cumulative(freq)
    # at most one word a symbol (a state, below 2^32, shifted once is below every limit, 2^22 × f)
    # and two words for each final state
    out = np.empty(len(symbols) + 4, np.uint16)
    n = _encode(np.ascontiguousarray(symbols), np.ascontiguousarray(contexts), freq, cum, out)
    return out[:n][::-1].copy()


@numba.njit(cache=True, nogil=True)
def _decode(words, state, groups, width, buckets, info, entries, slots, out):
    """Decode the next ``len(out)`` symbols, whose contexts ``groups`` give, from ``state``
    (the two states, words read, the next symbol's state) on, and update it. 0 on success; -1:
    the words ran out; -3: a context without a table. ``info[c]`` is ``row << 11 | freq[row, 0]``
    for context c's table (-1: none): a slot below the frequency of code 0 (most values) decodes
    without the slot table; ``entries[row, s]`` is ``cum[row, s] << 11 | freq[row, s]``.
    ``groups[0]`` must start a group (odd), as a document's first value does."""
    states, before = state[:2].copy(), np.zeros(2, np.int64)  # per state: x, the symbol it decoded last
    at, first, n, num_words = state[2], state[3], len(out), len(words)
    if n and not groups[0] & 1:
        return -3
    for i in range(n):
        k = (first + i) & 1
        x, g = states[k], groups[i]  # the context as _chain gives it, written out (a helper costs 60 % more)
        c = (g >> 1) * width if g & 1 or groups[i - 1] & 1 else (g >> 1) * width + buckets[before[k]]
        if info[c] < 0:
            return -3
        slot, zero_freq = x & (TOTAL - 1), info[c] & 2047
        if slot < zero_freq:
            s, x = 0, zero_freq * (x >> PRECISION) + slot
        else:
            r = info[c] >> 11
            s = np.int64(slots[r, slot])
            entry = np.int64(entries[r, s])
            x = (entry & 2047) * (x >> PRECISION) + slot - (entry >> 11)
        if x < STATE_LOW:
            if at >= num_words:
                return -1
            x, at = (x << 16) | np.int64(words[at]), at + 1
        out[i], states[k], before[k] = s, x, s
    state[0], state[1], state[2], state[3] = states[0], states[1], at, (first + n) & 1
    return 0


STATUS = {-1: "the stream ends early", -3: "a context without a frequency table"}


class Decoder:
    """Decodes a stream span by span, each span's contexts given when it is due (so that they
    need not all be held at once). ``freq[k]`` is the table of context ``used[k]``; every table
    must sum to TOTAL. ``ValueError`` if the stream is corrupt."""

    def __init__(self, words, width: int, buckets, used: np.ndarray, freq: np.ndarray, num_contexts: int):
        if np.any(freq.astype(np.int64).sum(axis=1) != TOTAL):
            raise ValueError("a frequency table does not sum to the coder's total")
        if len(words) < 4:
            raise ValueError("entropy-coded values are corrupt (the stream ends early)")
        self.words, self.width, self.buckets = words, width, buckets.astype(np.int64)
        self.info = np.full(num_contexts, -1, np.int64)
        self.info[used] = (np.arange(len(used), dtype=np.int64) << 11) | freq[:, 0]
        cum, self.slots = tables(freq)
        self.entries = (cum[:, :-1].astype(np.int32) << 11) | freq  # one lookup for both
        x = words[:4].astype(np.int64)
        self.state = np.array([x[0] << 16 | x[1], x[2] << 16 | x[3], 4, 0], np.int64)

    def decode(self, groups: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The next ``len(groups)`` symbols (into ``out``, uint8, if given)."""
        out = np.empty(len(groups), np.uint8) if out is None else out
        if len(groups) and (groups.min() < 0 or (int(groups.max()) >> 1) * self.width + self.width > len(self.info)):
            raise ValueError("a context out of range")  # checked here, so that the kernel need not
        args = self.width, self.buckets, self.info, self.entries, self.slots
        status = _decode(self.words, self.state, groups, *args, out)
        if status != 0:
            raise ValueError(f"entropy-coded values are corrupt ({STATUS[status]})")
        return out

    def finish(self) -> None:
        """Check that the stream ended where it should: both states back at their start, every
        word read."""
        x0, x1, at, _ = self.state.tolist()
        if x0 != STATE_LOW or x1 != STATE_LOW or at != len(self.words):
            raise ValueError("entropy-coded values are corrupt (wrong final state)")


def decode(words, groups, width: int, buckets, used: np.ndarray, freq: np.ndarray, num_contexts: int) -> np.ndarray:
    """The symbols coded in ``words`` with contexts as in :func:`chained_contexts` (in one span)."""
    decoder = Decoder(words, width, buckets, used, freq, num_contexts)
    out = decoder.decode(groups)
    decoder.finish()
    return out
