"""The conversion on a torch device (GPU next to the teacher's forward, or CPU).

Vocabulary-wide work stays on the device: the rows are gathered into byte-string order and
exponentiated in float64, each stream position's range is summed per next symbol with
``index_add_`` into a dense (positions × 259) buffer, and only the support values are copied to
the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from distill.alphabet import EOS, EOT

SLOTS = EOS + 1  # dense slots per position: bytes, <eot> (256), unused <bos> (257), <eos> (258)
MAX_ELEMENTS = 1 << 23  # range elements gathered at once (bounds device memory)


@dataclass
class DeviceTables:
    order: torch.Tensor  # (R,) regular ids in byte-string order
    first_byte: torch.Tensor  # (R,) first byte of each sorted string
    byte_at: torch.Tensor  # (R, max_len + 1): byte k of sorted string i, EOT where it ends
    end_of_text_ids: torch.Tensor
    dropped_ids: torch.Tensor


def device_tables(converter, device: torch.device, columns: str = "teacher") -> DeviceTables:
    key = f"{device}/{columns}"
    if key not in converter._device_tables:
        vocab, trie = converter.vocab, converter.trie
        strings = [vocab.token_bytes[i] for i in trie.order]
        max_len = max(len(s) for s in strings)
        byte_at = np.full((len(strings), max_len + 1), EOT, dtype=np.int16)
        for i, s in enumerate(strings):
            byte_at[i, : len(s)] = np.frombuffer(s, dtype=np.uint8)
        order, end_of_text, dropped = converter.column_tables(columns)
        converter._device_tables[key] = DeviceTables(
            order=torch.from_numpy(order).to(device),
            first_byte=torch.from_numpy(byte_at[:, 0].astype(np.int64)).to(device),
            byte_at=torch.from_numpy(byte_at).to(device),
            end_of_text_ids=torch.from_numpy(end_of_text).to(device),
            dropped_ids=torch.from_numpy(dropped).to(device),
        )
    return converter._device_tables[key]


def _row_masses(block: torch.Tensor, t: DeviceTables):
    """Sorted unnormalised probabilities p, end-of-text mass, dropped mass, normaliser z."""
    gathered = block.index_select(1, t.order)
    eot = block.index_select(1, t.end_of_text_ids)
    shift = torch.maximum(gathered.amax(-1), eot.amax(-1)).unsqueeze(-1)
    p = torch.exp(gathered - shift)
    q_eot = torch.exp(eot - shift).sum(-1)
    other = torch.exp(block.index_select(1, t.dropped_ids) - shift).sum(-1)
    z = p.sum(-1) + q_eot
    return p, q_eot, other / (z + other), z


@torch.no_grad()
def convert_on_device(converter, layout, logits: torch.Tensor, columns: str = "teacher", row_chunk: int = 32):
    device = logits.device
    t = device_tables(converter, device, columns)
    trie = converter.trie
    rows = logits.shape[0]
    positions = layout.num_positions
    dense = torch.zeros(positions, SLOTS, dtype=torch.float64, device=device)
    dropped = torch.empty(rows, dtype=torch.float64, device=device)

    node = layout.position_node
    row_of = layout.position_row
    root_positions = np.flatnonzero(node == 0)  # one per row, but none in the first row when it
    root_rows = row_of[root_positions]  # starts at the dummy prefix space (an inner position)
    inner = np.flatnonzero(node != 0)
    lo, hi, depth = trie.node_lo[node], trie.node_hi[node], trie.node_depth[node]

    for r0 in range(0, rows, row_chunk):
        r1 = min(rows, r0 + row_chunk)
        p, q_eot, dropped[r0:r1], z = _row_masses(logits[r0:r1].to(torch.float64), t)
        root = torch.zeros(r1 - r0, SLOTS, dtype=torch.float64, device=device)
        root.index_add_(1, t.first_byte, p)
        root[:, EOS] = q_eot
        here = (root_rows >= r0) & (root_rows < r1)
        dense[torch.from_numpy(root_positions[here]).to(device)] = (root / z.unsqueeze(-1))[torch.from_numpy(root_rows[here] - r0).to(device)]
        chunk = inner[(row_of[inner] >= r0) & (row_of[inner] < r1)]
        for part in _split_by_elements(chunk, hi - lo):
            _accumulate_ranges(dense, p, part, row_of[part] - r0, lo[part], hi[part], depth[part], t)
        if len(chunk):
            sel = torch.from_numpy(chunk).to(device)
            dense[sel] /= dense[sel].sum(-1, keepdim=True)

    support_position = np.repeat(np.arange(positions), np.diff(layout.offsets))
    flat = torch.from_numpy(support_position * SLOTS + layout.support.astype(np.int64)).to(device)
    values = dense.view(-1).index_select(0, flat)
    return values.cpu().numpy(), dropped.cpu().numpy()


def _split_by_elements(positions: np.ndarray, sizes: np.ndarray):
    """Consecutive groups of positions whose ranges hold at most MAX_ELEMENTS elements together."""
    start, acc = 0, 0
    for k, pos in enumerate(positions):
        acc += int(sizes[pos])
        if acc > MAX_ELEMENTS and k > start:
            yield positions[start:k]
            start, acc = k, int(sizes[pos])
    if start < len(positions):
        yield positions[start:]


def _accumulate_ranges(dense, p, positions, rows, lo, hi, depth, t: DeviceTables) -> None:
    """dense[pos, next symbol] += p[row, i] for every sorted index i in the position's range."""
    device = p.device
    counts = torch.from_numpy(hi - lo).to(device)
    total = int(counts.sum())
    starts = torch.cumsum(counts, 0) - counts
    within = torch.arange(total, device=device) - torch.repeat_interleave(starts, counts, output_size=total)
    index = torch.repeat_interleave(torch.from_numpy(lo).to(device), counts, output_size=total) + within
    row = torch.repeat_interleave(torch.from_numpy(rows).to(device), counts, output_size=total)
    level = torch.repeat_interleave(torch.from_numpy(depth).to(device), counts, output_size=total)
    slot = t.byte_at[index, level].to(torch.int64)
    target = torch.repeat_interleave(torch.from_numpy(positions).to(device), counts, output_size=total)
    dense.view(-1).index_add_(0, target * SLOTS + slot, p[row, index])
