"""A row of teacher logits: the order of its columns, and the Numba kernels every stream's
conversion reads one with.

The conversion reads a row's regular ids in byte-string order, then its end-of-text ids, then the
kept specials (a chat store's reserved symbols, docs/DESIGN.md "Conversations"), then the
dropped specials (:class:`distill.conversion.converter.Converter`). A row in the teacher's own id
order is read through that permutation (a gather); a teacher whose output layer is permuted into it
(:meth:`distill.teacher.model.Teacher.with_sorted_head`) emits rows the conversion reads
contiguously. Logits carry their order (:class:`distill.teacher.model.TeacherLogits`), so the
conversion is told it, never guesses it.

A row read (:func:`read_row`) leaves g, its regular logits in byte-string order, and p = exp(g −
shift), shift being the largest regular or end-of-text logit; the mass M(s) of a trie range is then
a direct float64 sum over p (:func:`sum_range`), and where a whole range underflowed in p it is
rescaled by its own maximum (:func:`rescale_range`, :func:`log_range_mass`).
"""

from __future__ import annotations

import math
from enum import Enum

import numba
import numpy as np

from distill.conversion.fastexp import exp_shifted


class ColumnOrder(Enum):
    TEACHER = "teacher"  # column i is teacher id i
    SORTED = "sorted"  # column i is teacher id Converter.sorted_columns[i]


@numba.njit(cache=True)
def row_buffers(regular):
    """Scratch for :func:`read_row` over ``regular`` ids: g (logits), p (exp(g − shift)), an index."""
    return np.empty(regular, np.float64), np.empty(regular, np.float64), np.empty(regular, np.int64)


@numba.njit(cache=True)
def read_row(row, order, end_of_text_ids, kept_ids, dropped_ids, g, p, kept, scratch):
    """Gather ``row`` into g and exponentiate it into p, the kept specials' masses into ``kept``;
    return (shift, end-of-text mass, dropped mass), every mass relative to the shift (see
    :func:`gather_row`)."""
    shift, end_of_text, dropped = gather_row(row, order, end_of_text_ids, kept_ids, dropped_ids, g, kept)
    exp_shifted(g, 0, len(order), shift, p, scratch)
    return shift, end_of_text, dropped


@numba.njit(cache=True, fastmath=True)
def sum_range(p, lo, hi):
    total = 0.0
    for i in range(lo, hi):
        total += p[i]
    return total


@numba.njit(cache=True)
def gather_row(row, order, end_of_text_ids, kept_ids, dropped_ids, g, kept):
    """g[i] = row[order[i]] in float64, kept[r] = the mass of kept special r; return (shift,
    end-of-text mass, dropped mass) where shift is the max over regular + end-of-text + kept
    logits and the masses are relative to it."""
    shift = -np.inf
    for i in range(len(order)):
        g[i] = row[order[i]]
        shift = max(shift, g[i])
    for i in end_of_text_ids:
        shift = max(shift, np.float64(row[i]))
    for i in kept_ids:
        shift = max(shift, np.float64(row[i]))
    for r in range(len(kept_ids)):
        kept[r] = math.exp(np.float64(row[kept_ids[r]]) - shift)
    end_of_text = 0.0
    for i in end_of_text_ids:
        end_of_text += math.exp(np.float64(row[i]) - shift)
    dropped = 0.0
    for i in dropped_ids:
        dropped += math.exp(np.float64(row[i]) - shift)
    return shift, end_of_text, dropped


@numba.njit(cache=True)
def rescale_range(g, p, lo, hi):
    """p[lo:hi] = exp(g[lo:hi] − their own maximum), for a range that underflowed relative to the
    row's maximum; return its new sum (the range's probabilities relative to each other are kept)."""
    shift = -np.inf
    for i in range(lo, hi):
        shift = max(shift, g[i])
    for i in range(lo, hi):
        p[i] = math.exp(g[i] - shift)
    return sum_range(p, lo, hi)


@numba.njit(cache=True)
def log_range_mass(g, p, lo, hi, shift):
    """log Σ exp(g[lo:hi] − shift), exact even where the whole range underflowed in p."""
    total = sum_range(p, lo, hi)
    if total > 0.0:
        return math.log(total)
    top = -np.inf
    for i in range(lo, hi):
        top = max(top, g[i])
    total = 0.0
    for i in range(lo, hi):
        total += math.exp(g[i] - top)
    return top - shift + math.log(total)
