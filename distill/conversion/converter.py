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

from dataclasses import dataclass

import numpy as np

from bytestream.fused_stream import fused_stream_layout
from bytestream.stream import StreamLayout, log_likelihood, stream_layout, target_values
from bytestream.trie import VocabTrie, build_trie
from bytestream.vocab import TeacherVocab
from distill.conversion.eot import convert_eot_rows
from distill.conversion.fused import convert_fused_rows
from distill.conversion.rows import ColumnOrder


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
        self.kept_ids = np.asarray(vocab.kept_ids, dtype=np.int64)
        self.dropped_ids = vocab.dropped_ids
        # ColumnOrder.SORTED: regular ids by byte string, then end-of-text, then the kept specials
        # (in reserved-symbol order), then the rest. A teacher whose output layer is permuted this
        # way (:meth:`Teacher.with_sorted_head`) emits rows that the conversion reads
        # contiguously, with no gather.
        self.sorted_columns = np.concatenate([self.trie.order, self.end_of_text_ids, self.kept_ids, self.dropped_ids])
        regular, n_eot, n_kept = len(self.trie.order), len(self.end_of_text_ids), len(self.kept_ids)
        self._tables = {
            ColumnOrder.TEACHER: (self.trie.order, self.end_of_text_ids, self.kept_ids, self.dropped_ids),
            ColumnOrder.SORTED: (
                np.arange(regular, dtype=np.int64),
                np.arange(regular, regular + n_eot, dtype=np.int64),
                np.arange(regular + n_eot, regular + n_eot + n_kept, dtype=np.int64),
                np.arange(regular + n_eot + n_kept, self.vocab.size, dtype=np.int64),
            ),
        }

    def column_tables(self, columns: ColumnOrder) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Where the regular ids (in byte-string order), the end-of-text ids, the kept specials
        (in reserved-symbol order) and the dropped specials sit among the columns of a row whose
        columns are in ``columns`` order."""
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
        order, end_of_text, kept, dropped_ids = self.column_tables(columns)
        if layout.fused:
            return convert_fused_rows(
                self.trie, order, end_of_text, kept, dropped_ids, layout, logits, first_row, values, dropped
            )
        return convert_eot_rows(
            self.trie, order, end_of_text, kept, dropped_ids, layout, token_ids, logits, first_row, values, dropped
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
        from distill.conversion.device import torch_conversion

        token_ids = np.asarray(token_ids, dtype=np.int64)
        self._check_shapes(token_ids, tuple(logits.shape))
        layout = self.fused_layout(token_ids)
        conversion = torch_conversion(self, logits.device, columns, fused=True)
        values, dropped = conversion.convert_rows(layout, logits)
        return DocumentDistributions(layout, values, dropped, conversion.context_log_mass(layout, logits))

    def convert_torch(self, token_ids, logits, columns: ColumnOrder = ColumnOrder.TEACHER) -> DocumentDistributions:
        """Device path: ``logits`` is a (m+1, V) torch tensor on any device; only the support
        values (not vocabulary-wide rows) are copied to the host."""
        from distill.conversion.device import torch_conversion

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

        order, end_of_text, reserved, _ = self.column_tables(columns)
        row = logits[0].to(torch.float64)
        in_range = torch.from_numpy(order[self.trie.node_lo[node] : self.trie.node_hi[node]]).to(row.device)
        kept = torch.from_numpy(np.concatenate([order, end_of_text, reserved])).to(row.device)
        return float(torch.logsumexp(row[in_range], 0) - torch.logsumexp(row[kept], 0))


def _outputs(layout: StreamLayout, token_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Empty float64 arrays for a document's support values and its dropped mass per teacher row."""
    return np.empty(layout.num_values, dtype=np.float64), np.empty(len(token_ids) + 1, dtype=np.float64)
