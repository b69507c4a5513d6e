"""Exact token→byte conversion (docs/DESIGN.md, "Exact conversion"), with Numba on the CPU or on any
torch device.

Both paths take one document's teacher token ids and the teacher's logits (or log-probs) for its
m+1 positions, in the teacher's id order, and return :class:`DocumentDistributions`: the stream
layout and, for every stream position, the probabilities over its support, plus the mass of the
special tokens dropped at each teacher position. Each range mass M(s) is a direct float64 sum over
the sorted probabilities (never a difference of cumulative sums, which loses small masses).

With SentencePiece's dummy prefix the first row is read at the space's node (see
:mod:`bytestream.stream`): P(first byte b) = M(space·b)/M(space), and the log-likelihood identity
becomes Σ log P(stream) = teacher token log-likelihood − log M(space) at the first row, with M
normalised over the regular and end-of-text ids; ``context_log_mass`` holds that log M(space).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np

from bytestream.fused_stream import fused_stream_layout
from bytestream.stream import StreamLayout, log_likelihood, path_to_node, stream_layout, target_values
from bytestream.trie import VocabTrie, build_trie
from bytestream.vocab import TeacherVocab
from distill.column_order import ColumnOrder
from distill.fastexp import exp_shifted


@dataclass(frozen=True)
class DocumentDistributions:
    layout: StreamLayout
    values: np.ndarray  # (S,) float64: P over each position's support, in support order
    dropped_mass: np.ndarray  # (m+1,) float64: special-token mass renormalised away per teacher row
    context_log_mass: float = 0.0  # log M(space) at the first row with a dummy prefix, else 0

    def position(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        start, stop = self.layout.offsets[i], self.layout.offsets[i + 1]
        return self.layout.support[start:stop], self.values[start:stop]

    def target_probabilities(self) -> np.ndarray:
        """P(actual next symbol) at every position."""
        return target_values(self.layout, self.values)

    def log_likelihood(self) -> float:
        """Σ over positions of log P(next symbol): the teacher's token log-likelihood minus
        :attr:`context_log_mass`; summed in float64 whatever the values' type."""
        return log_likelihood(self.target_probabilities())

    def dense(self) -> np.ndarray:
        """(L−1, A) probabilities over the stream's whole alphabet (zeros off the support)."""
        out = np.zeros((self.layout.num_positions, self.layout.alphabet_size), dtype=self.values.dtype)
        rows = np.repeat(np.arange(self.layout.num_positions), np.diff(self.layout.offsets))
        out[rows, self.layout.support] = self.values
        return out


class Converter:
    """Converts teacher rows to exact byte distributions for one vocabulary."""

    def __init__(self, vocab: TeacherVocab, trie: VocabTrie | None = None):
        self.vocab = vocab
        self.trie = trie if trie is not None else build_trie(vocab)
        self.end_of_text_ids = np.asarray(vocab.end_of_text_ids, dtype=np.int64)
        self.dropped_ids = vocab.dropped_ids
        # ColumnOrder.SORTED: regular ids by byte string, then end-of-text, then the rest. A
        # teacher whose output layer is permuted this way (:meth:`Teacher.with_sorted_head`)
        # emits rows that the conversion reads contiguously, with no gather.
        self.sorted_columns = np.concatenate([self.trie.order, self.end_of_text_ids, self.dropped_ids])
        regular, n_eot = len(self.trie.order), len(self.end_of_text_ids)
        self._tables = {
            ColumnOrder.TEACHER: (self.trie.order, self.end_of_text_ids, self.dropped_ids),
            ColumnOrder.SORTED: (
                np.arange(regular, dtype=np.int64),
                np.arange(regular, regular + n_eot, dtype=np.int64),
                np.arange(regular + n_eot, self.vocab.size, dtype=np.int64),
            ),
        }

    def column_tables(self, columns: ColumnOrder) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where the regular ids (in byte-string order), the end-of-text ids and the dropped
        specials sit among the columns of a row whose columns are in ``columns`` order."""
        if not isinstance(columns, ColumnOrder):
            raise TypeError(f"columns must be a ColumnOrder, not {columns!r}")
        return self._tables[columns]

    def layout(self, token_ids) -> StreamLayout:
        return stream_layout(self.trie, np.asarray(token_ids))

    def _check_shapes(self, token_ids: np.ndarray, logits_shape) -> None:
        rows, width = logits_shape
        if rows != len(token_ids) + 1:
            raise ValueError(f"need m+1 = {len(token_ids) + 1} teacher rows for {len(token_ids)} tokens, got {rows}")
        if width != self.vocab.size:
            raise ValueError(f"logits have {width} columns but the vocabulary has {self.vocab.size} ids")

    def convert_numba(
        self, token_ids, logits: np.ndarray, columns: ColumnOrder = ColumnOrder.TEACHER
    ) -> DocumentDistributions:
        """CPU path: ``logits`` is a (m+1, V) float32/float64 NumPy array whose columns are in
        ``columns`` order (the teacher's ids, or :attr:`sorted_columns`)."""
        token_ids, logits = self._numba_inputs(token_ids, logits)
        layout = self.layout(token_ids)
        values, dropped = _outputs(layout, token_ids)
        context = self.convert_rows_numba(layout, token_ids, logits, 0, values, dropped, columns)
        return DocumentDistributions(layout, values, dropped, context)

    def _numba_inputs(self, token_ids, logits) -> tuple[np.ndarray, np.ndarray]:
        """The ids as int64 and the logits as a contiguous float32/float64 array, their shapes checked."""
        token_ids = np.asarray(token_ids, dtype=np.int64)
        logits = np.ascontiguousarray(logits)
        if logits.dtype not in (np.float32, np.float64):
            logits = logits.astype(np.float32)
        self._check_shapes(token_ids, logits.shape)
        return token_ids, logits

    def convert_rows_numba(
        self, layout, token_ids, logits, first_row, values, dropped, columns: ColumnOrder = ColumnOrder.TEACHER
    ) -> float:
        """Fill the document's ``values`` and ``dropped`` for teacher rows ``first_row ..
        first_row + len(logits)`` (a row's positions depend on that row alone, so a document
        can be converted in row chunks as its logits arrive), into the layout's stream (the
        ``<eot>`` or the fused one). Returns the context log mass of row 0 when it is among these
        rows (see :attr:`DocumentDistributions.context_log_mass`), else 0."""
        order, end_of_text, dropped_ids = self.column_tables(columns)
        if layout.fused:
            from distill.convert_fused import convert_fused_rows

            return convert_fused_rows(
                self.trie, order, end_of_text, dropped_ids, layout, logits, first_row, values, dropped
            )
        stop = first_row + len(logits)
        first_position = int(np.searchsorted(layout.position_row, first_row))
        t = self.trie
        return _convert_rows(
            logits,
            token_ids[first_row : min(stop, len(token_ids))],
            order,
            t.node_lo,
            t.node_hi,
            t.node_n_exact,
            t.node_parent,
            t.child_offsets,
            t.child_nodes,
            t.token_node,
            end_of_text,
            dropped_ids,
            layout.position_node[first_position:],
            layout.offsets[first_position:],
            values,
            dropped[first_row:stop],
            np.empty(t.max_depth + 1, np.int64),
        )

    def fused_layout(self, token_ids) -> StreamLayout:
        return fused_stream_layout(self.trie, np.asarray(token_ids))

    def convert_fused_numba(
        self, token_ids, logits: np.ndarray, columns: ColumnOrder = ColumnOrder.TEACHER
    ) -> DocumentDistributions:
        """:meth:`convert_numba` into the fused stream (docs/DESIGN.md, "The fused stream")."""
        token_ids, logits = self._numba_inputs(token_ids, logits)
        layout = self.fused_layout(token_ids)
        values, dropped = _outputs(layout, token_ids)
        context = self.convert_rows_numba(layout, token_ids, logits, 0, values, dropped, columns)
        return DocumentDistributions(layout, values, dropped, context)

    def convert_fused_torch(
        self, token_ids, logits, columns: ColumnOrder = ColumnOrder.TEACHER
    ) -> DocumentDistributions:
        """:meth:`convert_torch` into the fused stream."""
        from distill.convert_torch import torch_conversion

        token_ids = np.asarray(token_ids, dtype=np.int64)
        self._check_shapes(token_ids, tuple(logits.shape))
        layout = self.fused_layout(token_ids)
        conversion = torch_conversion(self, logits.device, columns, fused=True)
        values, dropped = conversion.convert_rows(layout, logits)
        return DocumentDistributions(layout, values, dropped, conversion.context_log_mass(layout, logits))

    def convert_torch(self, token_ids, logits, columns: ColumnOrder = ColumnOrder.TEACHER) -> DocumentDistributions:
        """Device path: ``logits`` is a (m+1, V) torch tensor on any device; only the support
        values (not vocabulary-wide rows) are copied to the host."""
        from distill.convert_torch import torch_conversion

        token_ids = np.asarray(token_ids, dtype=np.int64)
        self._check_shapes(token_ids, tuple(logits.shape))
        layout = self.layout(token_ids)
        values, dropped = torch_conversion(self, logits.device, columns).convert_rows(layout, logits)
        return DocumentDistributions(layout, values, dropped, self._context_log_mass_torch(layout, logits, columns))

    def _context_log_mass_torch(self, layout: StreamLayout, logits, columns: ColumnOrder) -> float:
        """log M(start node) at the first row (0 when the stream starts at the root)."""
        node = int(layout.position_node[0])
        if node == 0:
            return 0.0
        import torch

        order, end_of_text, _ = self.column_tables(columns)
        row = logits[0].to(torch.float64)
        in_range = torch.from_numpy(order[self.trie.node_lo[node] : self.trie.node_hi[node]]).to(row.device)
        kept = torch.from_numpy(np.concatenate([order, end_of_text])).to(row.device)
        return float(torch.logsumexp(row[in_range], 0) - torch.logsumexp(row[kept], 0))


def _outputs(layout: StreamLayout, token_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Empty float64 arrays for a document's support values and its dropped mass per teacher row."""
    return np.empty(layout.num_values, dtype=np.float64), np.empty(len(token_ids) + 1, dtype=np.float64)


@numba.njit(cache=True, fastmath=True)
def _sum_range(p, lo, hi):
    total = 0.0
    for i in range(lo, hi):
        total += p[i]
    return total


@numba.njit(cache=True)
def _gather_row(row, order, end_of_text_ids, dropped_ids, g):
    """g[i] = row[order[i]] in float64; return (shift, end-of-text mass, dropped mass) where shift
    is the max over regular + end-of-text logits and the masses are relative to it."""
    shift = -np.inf
    for i in range(len(order)):
        g[i] = row[order[i]]
        shift = max(shift, g[i])
    for i in end_of_text_ids:
        shift = max(shift, np.float64(row[i]))
    end_of_text = 0.0
    for i in end_of_text_ids:
        end_of_text += math.exp(np.float64(row[i]) - shift)
    dropped = 0.0
    for i in dropped_ids:
        dropped += math.exp(np.float64(row[i]) - shift)
    return shift, end_of_text, dropped


@numba.njit(cache=True)
def _node_values(g, p, node, node_lo, node_hi, node_n_exact, child_offsets, child_nodes, out, at):
    """Write P(child byte)… then P(<eot>) for a non-root node."""
    lo, hi, n_exact = node_lo[node], node_hi[node], node_n_exact[node]
    total = _sum_range(p, lo, hi)
    if total == 0.0:  # the whole range underflowed relative to the row max: rescale it locally
        shift = -np.inf
        for i in range(lo, hi):
            shift = max(shift, g[i])
        for i in range(lo, hi):
            p[i] = math.exp(g[i] - shift)
        total = _sum_range(p, lo, hi)
    for c in range(child_offsets[node], child_offsets[node + 1]):
        child = child_nodes[c]
        out[at] = _sum_range(p, node_lo[child], node_hi[child]) / total
        at += 1
    if n_exact > 0:
        out[at] = _sum_range(p, lo, lo + n_exact) / total


@numba.njit(cache=True)
def _log_range_mass(g, p, lo, hi, shift):
    """log Σ exp(g[lo:hi] − shift), exact even where the whole range underflowed in p."""
    total = _sum_range(p, lo, hi)
    if total > 0.0:
        return math.log(total)
    top = -np.inf
    for i in range(lo, hi):
        top = max(top, g[i])
    total = 0.0
    for i in range(lo, hi):
        total += math.exp(g[i] - top)
    return top - shift + math.log(total)


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
    dropped_ids,
    position_node,
    offsets,
    values,
    dropped,
    path,
):
    """Fill ``values`` and ``dropped``; return log M(start node) at the first row (0 at the root)."""
    g = np.empty(len(order), np.float64)  # the row's logits in byte-string order
    p = np.empty(len(order), np.float64)  # exp(g - shift)
    scratch = np.empty(len(order), np.int64)
    context = 0.0
    pos = 0
    for j in range(logits.shape[0]):
        shift, end_of_text, other = _gather_row(logits[j], order, end_of_text_ids, dropped_ids, g)
        exp_shifted(g, 0, len(order), shift, p, scratch)
        start = position_node[pos]
        if start == 0:
            z = _root_values(p, node_lo, node_hi, child_offsets, child_nodes, end_of_text, values, offsets[pos])
        else:  # the dummy prefix space is context: this row's first position is at its node
            z = _sum_range(p, 0, len(order)) + end_of_text
            context = _log_range_mass(g, p, node_lo[start], node_hi[start], shift) - math.log(z)
            _node_values(g, p, start, node_lo, node_hi, node_n_exact, child_offsets, child_nodes, values, offsets[pos])
        dropped[j] = other / (z + other)
        pos += 1
        if j == len(token_ids):
            break
        length = path_to_node(token_node[token_ids[j]], node_parent, path)
        first = _index_on_path(start, path, length)
        for k in range(first + 1, length + 1):
            _node_values(
                g, p, path[k], node_lo, node_hi, node_n_exact, child_offsets, child_nodes, values, offsets[pos]
            )
            pos += 1
    return context


@numba.njit(cache=True)
def _index_on_path(node, path, length):
    """The index of ``node`` on ``path[0..length]`` (0 for the root)."""
    for k in range(length + 1):
        if path[k] == node:
            return k
    return 0


@numba.njit(cache=True)
def _root_values(p, node_lo, node_hi, child_offsets, child_nodes, end_of_text, out, at):
    """Write P(first byte)… then P(<eos>) at a root position; return the normaliser z."""
    start = at
    regular = 0.0
    for c in range(child_offsets[0], child_offsets[1]):  # the root's children tile the order
        child = child_nodes[c]
        mass = _sum_range(p, node_lo[child], node_hi[child])
        out[at] = mass
        regular += mass
        at += 1
    z = regular + end_of_text
    out[at] = end_of_text
    for k in range(start, at + 1):
        out[k] /= z
    return z
