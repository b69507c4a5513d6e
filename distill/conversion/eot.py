"""Exact token→byte conversion into the ``<eot>`` stream, on the CPU with Numba (docs/DESIGN.md,
"Exact conversion"); the device path is :class:`distill.conversion.device.TorchConversion`.

At a position that uses row q and sits at prefix s ≠ ε, with M(x) the mass of the tokens whose
bytes start with x:

    P(b | s) = M(s·b) / M(s)        P(<eot> | s) = q(s) / M(s)

and at the root P(b) = M(b) / Z, P(<eos>) = q(end-of-text) / Z and P(reserved symbol r) = q(kept
special r) / Z, with Z = M(ε) + q(end-of-text) + Σ q(kept) (docs/DESIGN.md, "Conversations").
Every mass is a direct float64 sum over its own range of the sorted probabilities
(:mod:`distill.conversion.rows`).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from bytestream.stream import path_to_node
from distill.conversion.rows import log_range_mass, read_row, rescale_range, row_buffers, sum_range


def convert_eot_rows(
    trie, order, end_of_text, kept_ids, dropped_ids, layout, token_ids, logits, first_row, values, dropped
):
    """Fill the document's ``values`` and ``dropped`` for teacher rows ``first_row ..
    first_row + len(logits)``; return the context log mass when row 0 is among them (else 0)."""
    stop = first_row + len(logits)
    first_position = int(np.searchsorted(layout.position_row, first_row))
    return _convert_rows(
        logits,
        token_ids[first_row : min(stop, len(token_ids))],
        order,
        trie.node_lo,
        trie.node_hi,
        trie.node_n_exact,
        trie.node_parent,
        trie.child_offsets,
        trie.child_nodes,
        trie.token_node,
        end_of_text,
        kept_ids,
        dropped_ids,
        layout.position_node[first_position:],
        layout.offsets[first_position:],
        values,
        dropped[first_row:stop],
        np.empty(trie.max_depth + 1, np.int64),
    )


@numba.njit(cache=True, nogil=True)
def _convert_rows(
    logits,
    token_ids,
    order,
    node_lo,
    node_hi,
    node_n_exact,
    node_parent,
    child_offsets,
    child_nodes,
    token_node,
    end_of_text_ids,
    kept_ids,
    dropped_ids,
    position_node,
    offsets,
    values,
    dropped,
    path,
):
    """Fill ``values`` and ``dropped``; return log M(start node) at the first row (0 at the root)."""
    g, p, scratch = row_buffers(len(order))
    kept = np.empty(len(kept_ids), np.float64)
    context = 0.0
    pos = 0
    for j in range(logits.shape[0]):
        shift, end_of_text, other = read_row(
            logits[j], order, end_of_text_ids, kept_ids, dropped_ids, g, p, kept, scratch
        )
        start = position_node[pos]
        if start == 0:
            z = _root_values(p, node_lo, node_hi, child_offsets, child_nodes, end_of_text, kept, values, offsets[pos])
        else:  # the dummy prefix space is context: this row's first position is at its node
            z = sum_range(p, 0, len(order)) + end_of_text + kept.sum()
            context = log_range_mass(g, p, node_lo[start], node_hi[start], shift) - math.log(z)
            _node_values(g, p, start, node_lo, node_hi, node_n_exact, child_offsets, child_nodes, values, offsets[pos])
        dropped[j] = other / (z + other)
        pos += 1
        if j == len(token_ids):
            break
        if token_node[token_ids[j]] < 0:  # a kept special: its one symbol was the root position's
            continue
        length = path_to_node(token_node[token_ids[j]], node_parent, path)
        first = _index_on_path(start, path, length)
        for k in range(first + 1, length + 1):
            _node_values(
                g, p, path[k], node_lo, node_hi, node_n_exact, child_offsets, child_nodes, values, offsets[pos]
            )
            pos += 1
    return context


@numba.njit(cache=True)
def _node_values(g, p, node, node_lo, node_hi, node_n_exact, child_offsets, child_nodes, out, at):
    """Write P(child byte)… then P(<eot>) for a non-root node."""
    lo, hi, n_exact = node_lo[node], node_hi[node], node_n_exact[node]
    total = sum_range(p, lo, hi)
    if total == 0.0:  # the whole range underflowed relative to the row max: rescale it locally
        total = rescale_range(g, p, lo, hi)
    for c in range(child_offsets[node], child_offsets[node + 1]):
        child = child_nodes[c]
        out[at] = sum_range(p, node_lo[child], node_hi[child]) / total
        at += 1
    if n_exact > 0:
        out[at] = sum_range(p, lo, lo + n_exact) / total


@numba.njit(cache=True)
def _index_on_path(node, path, length):
    """The index of ``node`` on ``path[0..length]`` (0 for the root)."""
    for k in range(length + 1):
        if path[k] == node:
            return k
    return 0


@numba.njit(cache=True)
def _root_values(p, node_lo, node_hi, child_offsets, child_nodes, end_of_text, kept, out, at):
    """Write P(first byte)…, P(<eos>), then P(reserved symbol)… at a root position; return the
    normaliser z."""
    start = at
    regular = 0.0
    for c in range(child_offsets[0], child_offsets[1]):  # the root's children tile the order
        child = child_nodes[c]
        mass = sum_range(p, node_lo[child], node_hi[child])
        out[at] = mass
        regular += mass
        at += 1
    z = regular + end_of_text
    out[at] = end_of_text
    for r in range(len(kept)):
        at += 1
        out[at] = kept[r]
        z += kept[r]
    for k in range(start, at + 1):
        out[k] /= z
    return z
