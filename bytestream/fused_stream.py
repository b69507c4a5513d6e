"""A document's fused stream: one symbol per text byte, carrying whether the teacher's token ends
with it (docs/DESIGN.md, "The fused stream").

The fused stream of a document tokenised as t_1..t_m is::

    <bos> f(t_1) f(t_2) … f(t_m) <eos>

where f(t) is the bytes of t, each byte b inside the token as the symbol b and its last byte as
``FUSED_ENDS + b``. Position i predicts symbol i + 1, so a document of n bytes has n + 1 positions
and no ``<eot>`` symbol. A position inside a token (its first k bytes read, the token known to go
on) is at the trie node of those k bytes and uses teacher row j; the ``<bos>`` position and the
position after a token's last byte are at the root and use the next token's row.

A position's support follows from its node alone, in ascending symbol order: the child bytes b
with longer tokens below them ("goes on"), then ``FUSED_ENDS + b`` for the children that are tokens
("ends"), then ``<eos>`` at the root, then the reserved symbols (kept specials, 515 + r) of a chat
store's vocabulary; a kept special in the document is that one symbol, between two root positions.

With SentencePiece's dummy prefix the ``<bos>`` position sits at the space's node, known to go on,
unless the first token is that space alone: then the whole first token is context and the
``<bos>`` position is the root of row 1 (:func:`fused_stream_layout`).
"""

from __future__ import annotations

import numba
import numpy as np

from bytestream.alphabet import FUSED_ALPHABET_SIZE, FUSED_BOS, FUSED_ENDS, FUSED_EOS
from bytestream.stream import StreamLayout, checked_token_ids, layout_refusal, path_to_node, token_extent
from bytestream.trie import VocabTrie


@numba.njit(cache=True, nogil=True)
def _fused_layout(
    token_ids,
    start_node,
    max_depth,
    token_node,
    token_reserved,
    num_reserved,
    node_lo,
    node_hi,
    node_n_exact,
    node_parent,
    node_byte,
    child_offsets,
    child_nodes,
):
    m = len(token_ids)
    path = np.empty(max_depth + 1, np.int64)
    text_bytes, specials, start_depth = token_extent(
        token_ids, start_node, token_node, token_reserved, node_parent, path
    )
    if text_bytes < 0:
        return None
    positions = 1 + text_bytes + specials - start_depth  # a position per text byte and kept special
    symbols = np.empty(positions + 1, np.int16)
    position_node = np.empty(positions, np.int64)
    position_row = np.empty(positions, np.int64)
    symbols[0] = FUSED_BOS
    position_node[0], position_row[0] = 0, 0
    pos = 0  # the position whose symbol comes next
    for j in range(m):
        reserved = token_reserved[token_ids[j]]
        if reserved >= 0:  # a kept special: one symbol, then the next token starts at the root
            symbols[pos + 1] = FUSED_ALPHABET_SIZE + reserved
            pos += 1
            if pos < positions:
                position_node[pos], position_row[pos] = 0, j + 1
            continue
        length = path_to_node(token_node[token_ids[j]], node_parent, path)
        first = start_depth if j == 0 else 0
        if j == 0 and start_depth > 0:
            if length == start_depth:  # the first token is the dummy space alone: all context
                position_row[0] = 1
                continue
            position_node[0] = start_node
        for k in range(first + 1, length + 1):
            ends = k == length
            symbols[pos + 1] = node_byte[path[k]] + (FUSED_ENDS if ends else 0)
            pos += 1
            if pos < positions:
                position_node[pos] = 0 if ends else path[k]
                position_row[pos] = j + 1 if ends else j
    symbols[positions] = FUSED_EOS
    offsets = np.zeros(positions + 1, np.int64)
    for i in range(positions):
        offsets[i + 1] = offsets[i] + _support_size(
            position_node[i], node_lo, node_hi, node_n_exact, child_offsets, child_nodes
        )
        if position_node[i] == 0:
            offsets[i + 1] += num_reserved
    support = np.empty(offsets[positions], np.int16)
    for i in range(positions):
        _write_support(
            position_node[i], node_lo, node_hi, node_n_exact, node_byte, child_offsets, child_nodes, support, offsets[i]
        )
        if position_node[i] == 0:
            for r in range(num_reserved):
                support[offsets[i + 1] - num_reserved + r] = FUSED_ALPHABET_SIZE + r
    return symbols, position_node, position_row, offsets, support


@numba.njit(cache=True, inline="always")
def _goes_on(c, node_lo, node_hi, node_n_exact):
    """Whether some token is longer than child ``c``'s prefix (its range holds more than its exact ids)."""
    return node_hi[c] - node_lo[c] > node_n_exact[c]


@numba.njit(cache=True)
def _support_size(node, node_lo, node_hi, node_n_exact, child_offsets, child_nodes):
    size = 1 if node == 0 else 0
    for at in range(child_offsets[node], child_offsets[node + 1]):
        c = child_nodes[at]
        size += (1 if _goes_on(c, node_lo, node_hi, node_n_exact) else 0) + (1 if node_n_exact[c] > 0 else 0)
    return size


@numba.njit(cache=True)
def _write_support(node, node_lo, node_hi, node_n_exact, node_byte, child_offsets, child_nodes, out, at):
    for k in range(child_offsets[node], child_offsets[node + 1]):
        c = child_nodes[k]
        if _goes_on(c, node_lo, node_hi, node_n_exact):
            out[at] = node_byte[c]
            at += 1
    for k in range(child_offsets[node], child_offsets[node + 1]):
        c = child_nodes[k]
        if node_n_exact[c] > 0:
            out[at] = FUSED_ENDS + node_byte[c]
            at += 1
    if node == 0:
        out[at] = FUSED_EOS


def fused_stream_layout(trie: VocabTrie, token_ids: np.ndarray) -> StreamLayout:
    """The fused stream and supports of one document from its teacher token ids (no BOS/EOS ids)."""
    token_ids = checked_token_ids(trie, token_ids)
    result = _fused_layout(
        token_ids,
        trie.start_node,
        trie.max_depth,
        trie.token_node,
        trie.token_reserved,
        trie.num_reserved,
        trie.node_lo,
        trie.node_hi,
        trie.node_n_exact,
        trie.node_parent,
        trie.node_byte,
        trie.child_offsets,
        trie.child_nodes,
    )
    if result is None:
        raise ValueError(layout_refusal(trie, token_ids))
    return StreamLayout(*result, fused=True, reserved=trie.num_reserved)
