"""Exact token→byte conversion into the fused stream, on the CPU with Numba (docs/DESIGN.md,
"The fused stream"); the device path is :class:`distill.convert_torch.TorchConversion` with
``fused=True``.

At a position whose token has read the bytes s and goes on, with q the teacher's row, M(x) the
mass of the tokens whose bytes start with x and C(s) = M(s) − q(s) (the mass that goes on past s):

    P(b, ends | s) = q(s·b) / C(s)        P(b, goes on | s) = (M(s·b) − q(s·b)) / C(s)

At the root C = 1 (the row renormalised over the regular and end-of-text ids) and ``<eos>`` takes
the end-of-text mass. Every mass is a direct float64 sum over its own range of the sorted
probabilities: q(s·b) is the exact-token head of s·b's range, M(s·b) − q(s·b) its tail, and C(s)
the sum of s's child ranges, so no mass is ever a difference.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from distill.convert import _gather_row, _log_range_mass, _sum_range
from distill.fastexp import exp_shifted


def convert_fused_rows(trie, order, end_of_text, dropped_ids, layout, logits, first_row, values, dropped) -> float:
    """Fill the fused document's ``values`` and ``dropped`` for teacher rows ``first_row ..
    first_row + len(logits)``; return the context log mass when row 0 is among them (else 0)."""
    first_position = int(np.searchsorted(layout.position_row, first_row))
    return _convert_fused_rows(
        logits,
        first_row,
        order,
        trie.node_lo,
        trie.node_hi,
        trie.node_n_exact,
        trie.child_offsets,
        trie.child_nodes,
        end_of_text,
        dropped_ids,
        trie.start_node,
        layout.position_node[first_position:],
        layout.position_row[first_position:],
        layout.offsets[first_position:],
        values,
        dropped[first_row : first_row + len(logits)],
    )


@numba.njit(cache=True, nogil=True)
def _convert_fused_rows(
    logits,
    first_row,
    order,
    node_lo,
    node_hi,
    node_n_exact,
    child_offsets,
    child_nodes,
    end_of_text_ids,
    dropped_ids,
    start_node,
    position_node,
    position_row,
    offsets,
    values,
    dropped,
):
    g = np.empty(len(order), np.float64)  # the row's logits in byte-string order
    p = np.empty(len(order), np.float64)  # exp(g - shift)
    scratch = np.empty(len(order), np.int64)
    context = 0.0
    pos = 0
    for j in range(logits.shape[0]):
        row = first_row + j
        shift, end_of_text, other = _gather_row(logits[j], order, end_of_text_ids, dropped_ids, g)
        exp_shifted(g, 0, len(order), shift, p, scratch)
        z = _sum_range(p, 0, len(order)) + end_of_text
        dropped[j] = other / (z + other)
        if row == 0 and start_node > 0:  # the dummy prefix space is context
            lo, hi, n_exact = node_lo[start_node], node_hi[start_node], node_n_exact[start_node]
            if len(position_row) > 0 and position_row[0] == 0:  # the first token goes on past the space
                context = _log_range_mass(g, p, lo + n_exact, hi, shift) - math.log(z)
            else:  # the first token is the space alone
                context = _log_range_mass(g, p, lo, lo + n_exact, shift) - math.log(z)
        while pos < len(position_row) and position_row[pos] == row:
            node = position_node[pos]
            _fused_values(
                g,
                p,
                node,
                node_lo,
                node_hi,
                node_n_exact,
                child_offsets,
                child_nodes,
                end_of_text,
                values,
                offsets[pos],
            )
            pos += 1
    return context


@numba.njit(cache=True)
def _fused_values(g, p, node, node_lo, node_hi, node_n_exact, child_offsets, child_nodes, end_of_text, out, at):
    """Write the goes-on masses, then the ends masses of ``node``'s children (then ``<eos>`` at the
    root), each over the mass that goes on past the node."""
    begin, hi = node_lo[node] + node_n_exact[node], node_hi[node]
    eos = end_of_text if node == 0 else 0.0
    total = _sum_range(p, begin, hi) + eos
    if total == 0.0 and node != 0:  # the whole range underflowed relative to the row max: rescale it
        shift = -np.inf
        for i in range(begin, hi):
            shift = max(shift, g[i])
        for i in range(begin, hi):
            p[i] = math.exp(g[i] - shift)
        total = _sum_range(p, begin, hi)
    for k in range(child_offsets[node], child_offsets[node + 1]):
        c = child_nodes[k]
        if node_hi[c] - node_lo[c] > node_n_exact[c]:
            out[at] = _sum_range(p, node_lo[c] + node_n_exact[c], node_hi[c]) / total
            at += 1
    for k in range(child_offsets[node], child_offsets[node + 1]):
        c = child_nodes[k]
        if node_n_exact[c] > 0:
            out[at] = _sum_range(p, node_lo[c], node_lo[c] + node_n_exact[c]) / total
            at += 1
    if node == 0:
        out[at] = eos / total
