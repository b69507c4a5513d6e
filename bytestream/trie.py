"""The byte trie of a teacher vocabulary, as flat NumPy arrays usable from Numba and torch.

Regular ids are sorted by byte string (ties by id). Every byte prefix ``s`` of some token is a
node and covers the contiguous range ``[lo, hi)`` of that order; the ids whose bytes equal ``s``
(``n_exact`` of them, several for SentencePiece duplicates) sit first in it, and the ranges of
the children ``s·b`` tile the rest in byte order. Node 0 is the root (the empty prefix).

``start_node`` is where a document's first token starts: the root, or for a teacher that adds
SentencePiece's dummy prefix, the node of the space it adds (the space is context, not text).
``kept_ids`` are the specials a chat store keeps as reserved symbols (``token_reserved`` numbers them).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

import numba
import numpy as np

from bytestream.vocab import TeacherVocab
from common.errors import UserError


@dataclass(frozen=True)
class VocabTrie:
    order: np.ndarray  # (R,) int64: regular ids in byte-string order
    node_lo: np.ndarray  # (N,) int64: first position of the node's range in `order`
    node_hi: np.ndarray  # (N,) int64: one past the last position
    node_n_exact: np.ndarray  # (N,) int64: ids whose bytes equal the prefix (0: not a token)
    node_depth: np.ndarray  # (N,) int64: prefix length
    node_parent: np.ndarray  # (N,) int64: -1 for the root
    node_byte: np.ndarray  # (N,) int64: last byte of the prefix (-1 for the root)
    child_offsets: np.ndarray  # (N+1,) int64: children of n are child_nodes[off[n]:off[n+1]]
    child_nodes: np.ndarray  # (C,) int64: children in byte order
    token_node: np.ndarray  # (V,) int64: node of each id's byte string, -1 for specials
    vocab_size: int
    start_node: int = 0  # node of the dummy prefix space, if the teacher adds one
    kept_ids: tuple[int, ...] = ()  # specials kept as reserved stream symbols, in symbol order

    @property
    def num_reserved(self) -> int:
        """How many reserved symbols follow the stream's alphabet (the kept specials)."""
        return len(self.kept_ids)

    @cached_property
    def token_reserved(self) -> np.ndarray:
        """(V,) int64: the reserved symbol number of each kept special id, -1 for every other id."""
        table = np.full(self.vocab_size, -1, dtype=np.int64)
        table[list(self.kept_ids)] = np.arange(len(self.kept_ids), dtype=np.int64)
        return table

    @property
    def max_depth(self) -> int:
        """The longest token's length in bytes (sizes the kernels' path buffers)."""
        return int(self.node_depth.max())

    @property
    def num_nodes(self) -> int:
        return len(self.node_lo)

    @cached_property
    def child_bytes(self) -> np.ndarray:
        """(C,) int16: the byte of each child in ``child_nodes`` (a node's support, in order)."""
        return self.node_byte[self.child_nodes].astype(np.int16)

    def children(self, node: int) -> np.ndarray:
        return self.child_nodes[self.child_offsets[node] : self.child_offsets[node + 1]]

    def node_of_prefix(self, prefix: bytes) -> int:
        """The node of a byte prefix, or -1 if no token starts with it."""
        node = 0
        for b in prefix:
            kids = self.children(node)
            match = kids[self.node_byte[kids] == b]
            if len(match) == 0:
                return -1
            node = int(match[0])
        return node


@numba.njit(cache=True)
def _build_nodes(flat, offsets):
    """Nodes of the sorted strings ``flat[offsets[i]:offsets[i+1]]`` in pre-order."""
    count = len(offsets) - 1
    cap = len(flat) + 1
    lo = np.empty(cap, np.int64)
    hi = np.empty(cap, np.int64)
    n_exact = np.zeros(cap, np.int64)
    depth = np.empty(cap, np.int64)
    parent = np.empty(cap, np.int64)
    last_byte = np.empty(cap, np.int64)
    string_node = np.empty(count, np.int64)
    max_len = 0
    for i in range(count):
        max_len = max(max_len, offsets[i + 1] - offsets[i])
    path = np.zeros(max_len + 1, np.int64)
    lo[0], depth[0], parent[0], last_byte[0] = 0, 0, -1, -1
    n = 1
    prev_len = 0
    for i in range(count):
        start, length = offsets[i], offsets[i + 1] - offsets[i]
        common = 0
        if i > 0:
            prev = offsets[i - 1]
            while common < min(length, prev_len) and flat[prev + common] == flat[start + common]:
                common += 1
        for d in range(prev_len, common, -1):  # close nodes that this string leaves
            hi[path[d]] = i
        for d in range(common + 1, length + 1):  # open the nodes it enters
            lo[n], depth[n], parent[n], last_byte[n] = i, d, path[d - 1], flat[start + d - 1]
            path[d] = n
            n += 1
        n_exact[path[length]] += 1
        string_node[i] = path[length]
        prev_len = length
    for d in range(prev_len, -1, -1):
        hi[path[d]] = count
    return lo[:n], hi[:n], n_exact[:n], depth[:n], parent[:n], last_byte[:n], string_node


def build_trie(vocab: TeacherVocab) -> VocabTrie:
    regular = vocab.regular_ids
    order = np.array(sorted(regular.tolist(), key=lambda i: (vocab.token_bytes[i], i)), dtype=np.int64)
    strings = [vocab.token_bytes[i] for i in order]
    offsets = np.zeros(len(strings) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in strings], out=offsets[1:])
    flat = np.frombuffer(b"".join(strings), dtype=np.uint8)
    lo, hi, n_exact, depth, parent, last_byte, string_node = _build_nodes(flat, offsets)

    # children grouped by parent; pre-order creation already lists siblings in byte order
    by_parent = np.argsort(parent[1:], kind="stable") + 1
    counts = np.bincount(parent[1:], minlength=len(lo))
    child_offsets = np.zeros(len(lo) + 1, dtype=np.int64)
    np.cumsum(counts, out=child_offsets[1:])

    token_node = np.full(vocab.size, -1, dtype=np.int64)
    token_node[order] = string_node
    trie = VocabTrie(
        order=order,
        node_lo=lo,
        node_hi=hi,
        node_n_exact=n_exact,
        node_depth=depth,
        node_parent=parent,
        node_byte=last_byte,
        child_offsets=child_offsets,
        child_nodes=by_parent.astype(np.int64),
        token_node=token_node,
        vocab_size=vocab.size,
        kept_ids=tuple(vocab.kept_ids),
    )
    if not vocab.adds_prefix_space:
        return trie
    start = trie.node_of_prefix(b" ")
    if start < 0:
        raise UserError("the tokenizer adds a dummy prefix space, but none of its tokens starts with a space")
    return dataclasses.replace(trie, start_node=start)
