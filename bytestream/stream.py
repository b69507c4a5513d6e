"""A document's symbol stream and the support of every stream position (docs/DESIGN.md, "Stream" and
"Supports").

The stream of a document tokenised as t_1..t_m is::

    <bos> bytes(t_1) <eot> bytes(t_2) <eot> … bytes(t_m) <eot> <eos>

Position i (0 ≤ i < L−1) predicts symbol i+1. The position after the first k bytes of t_j is at
trie node x[:k]; the ``<bos>``/``<eot>`` positions are at the root (k = 0). A position's support
follows from its node alone, in ascending symbol order: the node's child bytes, then ``<eot>``
if the prefix is a token (k ≥ 1), or ``<eos>`` at the root. Only the values need storing.

A vocabulary that keeps specials as reserved symbols (a chat store's, docs/DESIGN.md,
"Conversations") adds them after the alphabet (symbol 260 + r) and to every root support, after
``<eos>``; a kept special in the document is that one symbol, predicted at a root position, and the
position after it is the root position of the next teacher row (no ``<eot>`` follows it).

For a teacher that adds SentencePiece's dummy prefix, t_1's bytes start with that space, which is
context, not text: the ``<bos>`` position sits at the space's trie node (``VocabTrie.start_node``)
instead of the root, so it predicts the document's first byte given the space, and the stream
holds exactly the document's bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numba
import numpy as np

from bytestream.alphabet import ALPHABET_SIZE, BOS, EOS, EOT, FUSED_ALPHABET_SIZE, NUM_BYTES
from bytestream.trie import VocabTrie


@dataclass(frozen=True)
class StreamLayout:
    symbols: np.ndarray  # (L,) int16: the stream
    position_node: np.ndarray  # (L-1,) int64: trie node of each target position (0 = root)
    position_row: np.ndarray  # (L-1,) int64: teacher row (0..m) whose distribution it uses
    offsets: np.ndarray  # (L,) int64: support of position i is support[offsets[i]:offsets[i+1]]
    support: np.ndarray  # (S,) int16: symbols of all supports, concatenated
    fused: bool = False  # symbols of the fused alphabet (bytes with their token-end flag), no <eot>
    reserved: int = 0  # reserved symbols (kept teacher specials) after the stream's alphabet

    @property
    def num_positions(self) -> int:
        return len(self.position_node)

    @property
    def num_values(self) -> int:
        return len(self.support)

    def position_runs(self, max_values: int) -> Iterator[range]:
        """The positions in order, in runs of at most ``max_values`` values (a position with more
        is a run of its own): a long document handled a bounded slice at a time."""
        start, end = 0, self.num_positions
        while start < end:
            last = int(np.searchsorted(self.offsets, self.offsets[start] + max_values, side="right")) - 1
            stop = min(max(last, start + 1), end)
            yield range(start, stop)
            start = stop

    @property
    def alphabet_size(self) -> int:
        """The symbols its stream and supports are drawn from (the reserved ones included)."""
        return self.base_alphabet_size + self.reserved

    @property
    def base_alphabet_size(self) -> int:
        """The stream's own alphabet (260 or 515): reserved symbol r is ``base_alphabet_size + r``."""
        return FUSED_ALPHABET_SIZE if self.fused else ALPHABET_SIZE

    def _byte_symbols(self) -> np.ndarray:
        return self.symbols[self.symbols < (2 * NUM_BYTES if self.fused else NUM_BYTES)]

    def text_bytes(self) -> bytes:
        """The document's bytes: the stream's byte symbols in order (without their flags, if fused)."""
        return (self._byte_symbols() % NUM_BYTES).astype(np.uint8).tobytes()

    def num_text_bytes(self) -> int:
        """How many text bytes the stream stands for (a dummy prefix space is context, not stream)."""
        return len(self._byte_symbols())


@numba.njit(cache=True, nogil=True)
def _layout(
    token_ids,
    start_node,
    max_depth,
    token_node,
    token_reserved,
    num_reserved,
    node_parent,
    node_byte,
    node_n_exact,
    child_offsets,
    child_bytes,
):
    m = len(token_ids)
    path = np.empty(max_depth + 1, np.int64)
    text_bytes, _, start_depth = token_extent(token_ids, start_node, token_node, token_reserved, node_parent, path)
    if text_bytes < 0:
        return None
    positions = 1 + text_bytes - start_depth + m  # a root position per token, kept specials included
    symbols = np.empty(positions + 1, np.int16)
    position_node = np.empty(positions, np.int64)
    position_row = np.empty(positions, np.int64)
    offsets = np.zeros(positions + 1, np.int64)
    symbols[0] = BOS
    pos = 0  # the position whose next symbol is written
    for j in range(m + 1):
        position_node[pos], position_row[pos] = 0, j  # a root position: token j starts
        if j == m:
            break
        reserved = token_reserved[token_ids[j]]
        if reserved >= 0:  # a kept special: one symbol, and the next token starts at the root
            symbols[pos + 1] = ALPHABET_SIZE + reserved
            pos += 1
            continue
        length = path_to_node(token_node[token_ids[j]], node_parent, path)
        first = start_depth if j == 0 else 0
        position_node[pos] = path[first]
        for k in range(first + 1, length + 1):
            symbols[pos + 1] = node_byte[path[k]]
            pos += 1
            position_node[pos], position_row[pos] = path[k], j
        symbols[pos + 1] = EOT
        pos += 1
    symbols[pos + 1] = EOS
    for i in range(positions):
        node = position_node[i]
        offsets[i + 1] = (
            offsets[i]
            + child_offsets[node + 1]
            - child_offsets[node]
            + (1 + num_reserved if node == 0 else (1 if node_n_exact[node] > 0 else 0))
        )
    support = np.empty(offsets[positions], np.int16)
    for i in range(positions):
        node = position_node[i]
        at = offsets[i]
        first, count = child_offsets[node], child_offsets[node + 1] - child_offsets[node]
        support[at : at + count] = child_bytes[first : first + count]
        at += count
        if node == 0:
            support[at] = EOS
            for r in range(num_reserved):
                support[at + 1 + r] = ALPHABET_SIZE + r
        elif node_n_exact[node] > 0:
            support[at] = EOT
    return symbols, position_node, position_row, offsets, support


@numba.njit(cache=True, inline="always")
def _depth(node, node_parent):
    d = 0
    while node > 0:
        node = node_parent[node]
        d += 1
    return d


@numba.njit(cache=True)
def token_extent(token_ids, start_node, token_node, token_reserved, node_parent, path):
    """What a document's teacher tokens hold, as both streams lay them out: (their text bytes, their
    kept specials, the depth of the node the first token's positions start at: the dummy prefix
    space's, or 0), or (-1, 0, 0) when no stream has these ids (a dropped special, or a first token
    without the space the teacher adds). ``path`` is scratch of the trie's depth + 1."""
    text_bytes, specials = 0, 0
    for j in range(len(token_ids)):
        node = token_node[token_ids[j]]
        if node < 0:
            if token_reserved[token_ids[j]] < 0:
                return -1, 0, 0
            specials += 1
            continue
        text_bytes += _depth(node, node_parent)
    start_depth = 0
    if len(token_ids) > 0 and start_node > 0 and token_reserved[token_ids[0]] < 0:
        start_depth = _depth(start_node, node_parent)
        if path_to_node(token_node[token_ids[0]], node_parent, path) < start_depth or path[start_depth] != start_node:
            return -1, 0, 0
    return text_bytes, specials, start_depth


@numba.njit(cache=True)
def path_to_node(node, node_parent, path):
    """Fill ``path[0..d]`` with the nodes from the root to ``node``; return d."""
    d = _depth(node, node_parent)
    k = d
    while k >= 0:
        path[k] = node
        node = node_parent[node] if node > 0 else 0
        k -= 1
    return d


def stream_layout(trie: VocabTrie, token_ids: np.ndarray) -> StreamLayout:
    """The stream and supports of one document from its teacher token ids (no BOS/EOS ids)."""
    token_ids = checked_token_ids(trie, token_ids)
    result = _layout(
        token_ids,
        trie.start_node,
        trie.max_depth,
        trie.token_node,
        trie.token_reserved,
        trie.num_reserved,
        trie.node_parent,
        trie.node_byte,
        trie.node_n_exact,
        trie.child_offsets,
        trie.child_bytes,
    )
    if result is None:
        raise ValueError(layout_refusal(trie, token_ids))
    return StreamLayout(*result, reserved=trie.num_reserved)


def checked_token_ids(trie: VocabTrie, token_ids) -> np.ndarray:
    """``token_ids`` as contiguous int64, each an id of the vocabulary (else ValueError)."""
    token_ids = np.ascontiguousarray(token_ids, dtype=np.int64)
    if len(token_ids) and (token_ids.min() < 0 or token_ids.max() >= trie.vocab_size):
        raise ValueError(f"token id out of range for a vocabulary of {trie.vocab_size}")
    return token_ids


def layout_refusal(trie: VocabTrie, token_ids: np.ndarray) -> str:
    """Why no stream has these ids: a special token, or a first token without the dummy prefix space."""
    special = [int(t) for t in token_ids if trie.token_node[t] < 0 and trie.token_reserved[t] < 0]
    if special:
        kept = " and the kept ones" if trie.num_reserved else ""
        return f"token id {special[0]} is a special token; documents hold regular tokens{kept} only"
    return f"token id {int(token_ids[0])} does not start with the dummy prefix space the teacher adds"


def target_values(layout: StreamLayout, values: np.ndarray, positions: range | None = None) -> np.ndarray:
    """Each position's value at the symbol that actually comes next (0 where it is off the support);
    given ``positions`` (a run of them, as :meth:`StreamLayout.position_runs` cuts), theirs alone,
    ``values`` being those positions' values."""
    positions = range(layout.num_positions) if positions is None else positions
    return _target_values(layout.symbols, layout.offsets, layout.support, values, positions.start, len(positions))


def target_indices(layout: StreamLayout, positions: range | None = None) -> np.ndarray:
    """(P,) int64: the index among the values of each position's value at the symbol that
    actually comes next, -1 where it is off the support; given ``positions`` (a run of them),
    theirs alone, counted from the run's first value."""
    positions = range(layout.num_positions) if positions is None else positions
    return _target_indices(layout.symbols, layout.offsets, layout.support, positions.start, len(positions))


def log_likelihood(taken: np.ndarray) -> float:
    """Σ log of each position's value at its next symbol (:func:`target_values`), in float64
    whatever their type (only the taken values are widened: float32 values need no float64 copy)."""
    return float(np.log(taken.astype(np.float64)).sum())


@numba.njit(cache=True, nogil=True)
def _target_values(symbols, offsets, support, values, first, count):
    out = np.empty(count, values.dtype)
    base = offsets[first] if count else 0  # where ``values`` start among the document's
    for i in range(count):
        p = first + i
        target = symbols[p + 1]
        for at in range(offsets[p], offsets[p + 1]):
            if support[at] == target:
                out[i] = values[at - base]
                break
        else:
            out[i] = 0.0
    return out


@numba.njit(cache=True, nogil=True)
def _target_indices(symbols, offsets, support, first, count):
    out = np.full(count, -1, np.int64)
    base = offsets[first] if count else 0  # the run's first value among the document's
    for i in range(count):
        p = first + i
        target = symbols[p + 1]
        for at in range(offsets[p], offsets[p + 1]):
            if support[at] == target:
                out[i] = at - base
                break
    return out
