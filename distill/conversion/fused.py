"""Exact token→byte conversion into the fused stream, on the CPU with Numba (docs/DESIGN.md,
"The fused stream"); the device path is :class:`distill.conversion.device.TorchConversion` with
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

from distill.conversion.rows import log_range_mass, read_row, rescale_range, row_buffers, sum_range


def convert_fused_rows(
    trie, order, end_of_text, kept_ids, dropped_ids, layout, logits, first_row, values, dropped
) -> float:
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
        kept_ids,
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
    kept_ids,
    dropped_ids,
    start_node,
    position_node,
    position_row,
    offsets,
    values,
    dropped,
):
    g, p, scratch = row_buffers(len(order))
    kept = np.empty(len(kept_ids), np.float64)
    context = 0.0
    pos = 0
    for j in range(logits.shape[0]):
        row = first_row + j
        shift, end_of_text, other = read_row(
            logits[j], order, end_of_text_ids, kept_ids, dropped_ids, g, p, kept, scratch
        )
        z = sum_range(p, 0, len(order)) + end_of_text + kept.sum()
        dropped[j] = other / (z + other)
        if row == 0 and start_node > 0:  # the dummy prefix space is context
            lo, hi, n_exact = node_lo[start_node], node_hi[start_node], node_n_exact[start_node]
            if len(position_row) > 0 and position_row[0] == 0:  # the first token goes on past the space
                context = log_range_mass(g, p, lo + n_exact, hi, shift) - math.log(z)
            else:  # the first token is the space alone
                context = log_range_mass(g, p, lo, lo + n_exact, shift) - math.log(z)
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
                kept,
                values,
                offsets[pos],
            )
            pos += 1
    return context


@numba.njit(cache=True)
def _fused_values(g, p, node, node_lo, node_hi, node_n_exact, child_offsets, child_nodes, end_of_text, kept, out, at):
    """Write the goes-on masses, then the ends masses of ``node``'s children (then ``<eos>`` and
    the reserved symbols at the root), each over the mass that goes on past the node."""
    begin, hi = node_lo[node] + node_n_exact[node], node_hi[node]
    eos = end_of_text if node == 0 else 0.0
    total = sum_range(p, begin, hi) + eos
    if node == 0:
        total += kept.sum()
    if total == 0.0 and node != 0:  # the whole range underflowed relative to the row max: rescale it
        total = rescale_range(g, p, begin, hi)
    for k in range(child_offsets[node], child_offsets[node + 1]):
        c = child_nodes[k]
        if node_hi[c] - node_lo[c] > node_n_exact[c]:
            out[at] = sum_range(p, node_lo[c] + node_n_exact[c], node_hi[c]) / total
            at += 1
    for k in range(child_offsets[node], child_offsets[node + 1]):
        c = child_nodes[k]
        if node_n_exact[c] > 0:
            out[at] = sum_range(p, node_lo[c], node_lo[c] + node_n_exact[c]) / total
            at += 1
    if node == 0:
        out[at] = eos / total
        for r in range(len(kept)):
            out[at + 1 + r] = kept[r] / total
