"""The conversion on a torch device (GPU next to the teacher's forward, or CPU for tests).

Vocabulary-wide work stays on the device and every sum is a segment sum over a contiguous range
of the sorted probabilities (``torch.segment_reduce``: one ordered sum per segment, so the result
does not depend on thread scheduling, unlike ``index_add_``'s atomics on CUDA). Only the support
values are copied to the host.

A position inside a token is normalised relative to its own range's largest logit (the Numba path
rescales when a range underflows; here it always does), so no range underflows to 0/0; a root
row is shifted by its own maximum, and the dropped special mass by the maximum over every column.
A range whose logits are all −inf (probability zero under the teacher) gets the uniform
distribution over its support instead of NaN. Rows are independent: :meth:`TorchConversion.convert_rows`
converts any run of a document's rows, which is how the dump streams row chunks.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch

from distill.conversion.rows import ColumnOrder

ROW_CHUNKS = {"cuda": 512}  # rows whose float64 copies are exponentiated at once, by device type (else 32)
MAX_ELEMENTS = 1 << 23  # in-token range elements gathered at once (bounds device memory)
LARGEST = torch.finfo(torch.float64).max  # +inf logits are clamped here (−inf stays: probability 0)


@dataclass(frozen=True)
class _Segments:
    """Per trie node, the lengths of its support's ranges in support order (child ranges by byte,
    then the exact-token range when the prefix is a token): ``lengths[offsets[n]:offsets[n+1]]``."""

    offsets: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of(cls, trie) -> _Segments:
        n_children = np.diff(trie.child_offsets)
        count = n_children + (trie.node_n_exact > 0)
        offsets = np.concatenate([[0], np.cumsum(count)])
        lengths = np.empty(offsets[-1], dtype=np.int64)
        parent = np.repeat(np.arange(trie.num_nodes), n_children)
        kids = trie.child_nodes
        lengths[offsets[parent] + np.arange(len(kids)) - trie.child_offsets[parent]] = (
            trie.node_hi[kids] - trie.node_lo[kids]
        )
        exact = np.flatnonzero(trie.node_n_exact > 0)
        lengths[offsets[exact] + n_children[exact]] = trie.node_n_exact[exact]
        return cls(offsets, lengths)

    def count(self, nodes: np.ndarray) -> np.ndarray:
        return self.offsets[nodes + 1] - self.offsets[nodes]

    def lengths_of(self, nodes: np.ndarray) -> np.ndarray:
        return self.lengths[_ranges(self.offsets[nodes], self.count(nodes))]


@dataclass(frozen=True)
class _FusedSegments:
    """Per trie node, its children's ranges split in two, in trie order: each child's exact tokens
    ("ends") then the rest of its range ("goes on"): ``lengths[offsets[n]:offsets[n+1]]``, two per
    child. ``support[support_offsets[n]:support_offsets[n+1]]`` indexes those halves in the fused
    support's order (every goes-on half that is not empty, then every ends half that is not)."""

    offsets: np.ndarray
    lengths: np.ndarray
    support_offsets: np.ndarray
    support: np.ndarray

    @classmethod
    def of(cls, trie) -> _FusedSegments:
        n_children = np.diff(trie.child_offsets)
        offsets = np.concatenate([[0], np.cumsum(2 * n_children)])
        kids = trie.child_nodes
        exact, size = trie.node_n_exact[kids], trie.node_hi[kids] - trie.node_lo[kids]
        lengths = np.stack([exact, size - exact], axis=1).reshape(-1)
        goes_on, ends = size > exact, exact > 0
        parent = np.repeat(np.arange(trie.num_nodes), n_children)
        counts = np.bincount(parent, weights=goes_on.astype(np.int64) + ends, minlength=trie.num_nodes)
        support_offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        within = 2 * (np.arange(len(kids)) - trie.child_offsets[parent])  # each child's ends half
        halves = np.concatenate([np.flatnonzero(goes_on), np.flatnonzero(ends)])
        entries = np.concatenate([within[goes_on] + 1, within[ends]])
        order = np.lexsort((np.arange(len(halves)), parent[halves]))  # by node, goes-on first (stable)
        return cls(offsets, lengths, support_offsets, entries[order])

    def count(self, nodes: np.ndarray) -> np.ndarray:
        return self.support_offsets[nodes + 1] - self.support_offsets[nodes]

    def lengths_of(self, nodes: np.ndarray) -> np.ndarray:
        return self.lengths[_ranges(self.offsets[nodes], self.offsets[nodes + 1] - self.offsets[nodes])]

    def support_of(self, nodes: np.ndarray) -> np.ndarray:
        """The support entries of ``nodes`` as indices into their concatenated halves."""
        halves = self.offsets[nodes + 1] - self.offsets[nodes]
        base = np.cumsum(halves) - halves
        counts = self.count(nodes)
        return self.support[_ranges(self.support_offsets[nodes], counts)] + np.repeat(base, counts)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + c)`` for each start s and count c."""
    before = np.cumsum(counts) - counts
    return np.repeat(starts - before, counts) + np.arange(int(counts.sum()))


class TorchConversion:
    """The conversion tables of one converter on one device, for one column order."""

    def __init__(self, converter, device: torch.device, columns: ColumnOrder, fused: bool = False):
        trie = converter.trie
        order, end_of_text, kept, dropped = converter.column_tables(columns)
        self.trie, self.device, self.fused = trie, device, fused
        self.row_chunk = row_chunk(device)
        self.order = torch.from_numpy(order).to(device)
        self.end_of_text_ids = torch.from_numpy(end_of_text).to(device)
        self.kept_ids = torch.from_numpy(kept).to(device)  # a chat store's reserved symbols, in order
        self.dropped_ids = torch.from_numpy(dropped).to(device)
        self.segments = _FusedSegments.of(trie) if fused else _Segments.of(trie)
        root = np.array([0])
        self.root_lengths = torch.from_numpy(self.segments.lengths_of(root)).to(device)
        self.root_support = torch.from_numpy(self.segments.support_of(root)).to(device) if fused else None

    @torch.no_grad()
    def convert_rows(self, layout, logits: torch.Tensor, first_row: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Support values of the positions of teacher rows ``first_row .. first_row + len(logits)``
        (a contiguous slice of the document's values) and those rows' dropped special mass."""
        rows = logits.shape[0]
        p0, p1 = np.searchsorted(layout.position_row, [first_row, first_row + rows])
        base = layout.offsets[p0]
        values = torch.empty(int(layout.offsets[p1] - base), dtype=torch.float64, device=self.device)
        dropped = torch.empty(rows, dtype=torch.float64, device=self.device)
        for r0 in range(0, rows, self.row_chunk):
            r1 = min(rows, r0 + self.row_chunk)
            block = logits[r0:r1].to(torch.float64).clamp(max=LARGEST)
            root, dropped[r0:r1] = self._root(block)
            q0, q1 = np.searchsorted(layout.position_row, [first_row + r0, first_row + r1])
            node = layout.position_node[q0:q1]
            is_root = torch.from_numpy(np.repeat(node == 0, np.diff(layout.offsets[q0 : q1 + 1]))).to(self.device)
            part = values[layout.offsets[q0] - base : layout.offsets[q1] - base]
            # one root position per row, except row 0 when it starts at the dummy prefix's node
            root_rows = layout.position_row[q0:q1][node == 0] - first_row - r0
            part[is_root] = root[torch.from_numpy(root_rows).to(self.device)].reshape(-1)
            inner = np.flatnonzero(node != 0)
            row_of = layout.position_row[q0:q1][inner] - first_row - r0
            part[~is_root] = torch.cat(
                [torch.zeros(0, dtype=torch.float64, device=self.device)]
                + [self._inner(block, row_of[k], node[inner[k]]) for k in self._split_by_elements(node[inner])]
            )
        return values.cpu().numpy(), dropped.cpu().numpy()

    def _root(self, block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, root support) values — first bytes, then end-of-text, then the kept specials — and
        the dropped mass."""
        regular = block.index_select(1, self.order)
        eot = block.index_select(1, self.end_of_text_ids)
        kept_logits = block.index_select(1, self.kept_ids)
        shift = torch.maximum(regular.amax(-1), eot.amax(-1))
        if len(self.kept_ids):
            shift = torch.maximum(shift, kept_logits.amax(-1))
        shift = _finite(shift)
        lengths = self.root_lengths.expand(len(block), -1)
        masses = torch.segment_reduce(torch.exp(regular - shift[:, None]), "sum", lengths=lengths, axis=1)
        if self.fused:
            masses = masses.index_select(1, self.root_support)
        masses = torch.cat(
            [masses, torch.exp(eot - shift[:, None]).sum(-1, keepdim=True), torch.exp(kept_logits - shift[:, None])],
            dim=1,
        )
        z = masses.sum(-1)
        if len(self.dropped_ids):
            others = block.index_select(1, self.dropped_ids)
            top = torch.maximum(shift, _finite(others.amax(-1)))
            other = torch.exp(others - top[:, None]).sum(-1)
            kept = z * torch.exp(shift - top)
            dropped = torch.where(kept + other > 0, other / (kept + other), 0.0)
        else:
            dropped = torch.zeros_like(z)
        return _normalise(masses, z[:, None], masses.shape[1]), dropped

    def _inner(self, block: torch.Tensor, rows: np.ndarray, nodes: np.ndarray) -> torch.Tensor:
        """Values of in-token positions (their node and row within ``block``), in position order."""
        if self.fused:
            return self._inner_fused(block, rows, nodes)
        t, device = self.trie, self.device
        lo, size, n_exact = t.node_lo[nodes], t.node_hi[nodes] - t.node_lo[nodes], t.node_n_exact[nodes]
        # each range read children first, then its exact tokens: the support order
        within = _ranges(np.zeros_like(size), size)
        index = np.repeat(lo, size) + (within + np.repeat(n_exact, size)) % np.repeat(size, size)
        p = self._shifted_probabilities(block, rows, index, size)
        masses = torch.segment_reduce(
            p, "sum", lengths=torch.from_numpy(self.segments.lengths_of(nodes)).to(device), unsafe=True
        )
        return self._per_position(masses, self.segments.count(nodes))

    def _inner_fused(self, block: torch.Tensor, rows: np.ndarray, nodes: np.ndarray) -> torch.Tensor:
        """Fused values of in-token positions: each node's child ranges (its own exact tokens left
        out: the token goes on), summed by halves, then put in support order."""
        t, device = self.trie, self.device
        lo = t.node_lo[nodes] + t.node_n_exact[nodes]
        size = t.node_hi[nodes] - lo
        index = np.repeat(lo, size) + _ranges(np.zeros_like(size), size)
        p = self._shifted_probabilities(block, rows, index, size)
        halves = torch.segment_reduce(
            p, "sum", lengths=torch.from_numpy(self.segments.lengths_of(nodes)).to(device), unsafe=True
        )
        masses = halves[torch.from_numpy(self.segments.support_of(nodes)).to(device)]
        return self._per_position(masses, self.segments.count(nodes))

    def _shifted_probabilities(self, block, rows: np.ndarray, index: np.ndarray, size: np.ndarray) -> torch.Tensor:
        """exp(logit − the range's largest) of sorted positions ``index``: ranges of ``size`` each, of
        the block's ``rows``, so that no range underflows."""
        device = self.device
        sizes = torch.from_numpy(size).to(device)
        row = torch.from_numpy(np.repeat(rows, size)).to(device)
        logits = block[row, self.order[torch.from_numpy(index).to(device)]]
        peak = _finite(torch.segment_reduce(logits, "max", lengths=sizes, unsafe=True))
        return torch.exp(logits - torch.repeat_interleave(peak, sizes, output_size=len(index)))

    def _per_position(self, masses: torch.Tensor, counts: np.ndarray) -> torch.Tensor:
        """``masses`` (``counts`` of them per position) normalised over each position."""
        counts_t = torch.from_numpy(counts).to(self.device)
        z = torch.segment_reduce(masses, "sum", lengths=counts_t, unsafe=True)
        total = int(counts.sum())
        return _normalise(
            masses,
            torch.repeat_interleave(z, counts_t, output_size=total),
            torch.repeat_interleave(counts_t, counts_t, output_size=total),
        )

    def context_log_mass(self, layout, logits: torch.Tensor) -> float:
        """log of the first row's mass on the context before the first position (0 without a dummy
        prefix): tokens starting with the space; fused, those going on past it, or the space alone."""
        node = int(self.trie.start_node)
        if node == 0 or layout.num_positions == 0 or (not self.fused and layout.position_node[0] == 0):
            return 0.0
        t = self.trie
        lo, hi, n_exact = int(t.node_lo[node]), int(t.node_hi[node]), int(t.node_n_exact[node])
        if self.fused:
            lo, hi = (lo + n_exact, hi) if layout.position_row[0] == 0 else (lo, lo + n_exact)
        row = logits[0].to(torch.float64)
        kept = torch.cat([self.order, self.end_of_text_ids, self.kept_ids])
        return float(torch.logsumexp(row[self.order[lo:hi]], 0) - torch.logsumexp(row[kept], 0))

    def _split_by_elements(self, nodes: np.ndarray):
        """Index slices of consecutive positions whose ranges hold at most MAX_ELEMENTS elements."""
        sizes = self.trie.node_hi[nodes] - self.trie.node_lo[nodes]
        start, acc = 0, 0
        for k, size in enumerate(sizes):
            if acc + size > MAX_ELEMENTS and k > start:
                yield slice(start, k)
                start, acc = k, 0
            acc += int(size)
        if start < len(nodes):
            yield slice(start, len(nodes))


def row_chunk(device: torch.device) -> int:
    return ROW_CHUNKS.get(device.type, 32)


def _finite(shift: torch.Tensor) -> torch.Tensor:
    """A shift of −inf (every logit −inf) becomes 0, so exp(logit − shift) is 0, not NaN."""
    return torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))


def _normalise(masses: torch.Tensor, z: torch.Tensor, count) -> torch.Tensor:
    """masses / z; the uniform distribution over the support where all of it had probability 0."""
    return torch.where(z > 0, masses / torch.where(z > 0, z, 1.0), 1.0 / count)


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def torch_conversion(
    converter, device: torch.device, columns: ColumnOrder = ColumnOrder.TEACHER, fused: bool = False
) -> TorchConversion:
    """The converter's tables on ``device`` (built once per converter, device, column order and stream)."""
    tables = _CACHE.setdefault(converter, {})
    key = (str(device), columns, fused)
    if key not in tables:
        tables[key] = TorchConversion(converter, device, columns, fused)
    return tables[key]
