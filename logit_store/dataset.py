"""Training sequences packed from a logit store, as a torch ``IterableDataset``.

Each document's stream ``<bos> … <eot> <eos>`` is appended to one long stream per split; the
stream is cut into consecutive windows of ``seq_len`` inputs. At input position t the target is
the next symbol of the document; the position whose input is ``<eos>`` predicts nothing
(target ``<pad>``, masked), and so do padding positions at the end of the last window. Every
target position of every document is thus in exactly one window once per epoch.

Documents are split among ``world_size`` ranks × DataLoader workers round-robin over the epoch's
document order (split g = rank × num_workers + worker takes documents order[g::G]), so splits never
overlap and have nearly equal sizes. With ``shuffle`` the order is a block shuffle (chunks shuffled,
then documents within each chunk) seeded by ``seed + epoch``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from distill.alphabet import ALPHABET_SIZE, EOS, PAD
from distill.errors import UserError
from distill.stream import stream_layout
from logit_store.store import as_store, densify


class PackedStreamDataset(IterableDataset):
    """Fixed-length sequences of symbols (and the teacher's distributions) from logit stores.

    Yields dicts of tensors: ``input_ids`` (T,) int64, ``target_ids`` (T,) int64 (``<pad>``
    where there is none), ``loss_mask`` (T,) bool, and with ``with_teacher`` ``target_probs``
    (T, 260) float32 (zeros where masked). ``with_teacher=False`` reads only token ids.
    """

    def __init__(
        self,
        stores,
        seq_len: int,
        *,
        with_teacher: bool = True,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        if seq_len < 1:
            raise UserError(f"seq_len must be at least 1, got {seq_len}")
        if not 0 <= rank < world_size:
            raise UserError(f"rank {rank} is not in 0..{world_size - 1}")
        self.store = as_store(stores)
        self.seq_len = int(seq_len)
        self.with_teacher = with_teacher
        self.shuffle = shuffle
        self.seed = int(seed)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.epoch = 0
        self.trie = self.store.trie  # built once, shipped to workers

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def split_documents(self, worker: int = 0, num_workers: int = 1) -> np.ndarray:
        """Document indices of this rank's ``worker`` in this epoch, in reading order."""
        order = self.store.document_order(self.shuffle, self.seed + self.epoch)
        splits = self.world_size * num_workers
        return order[self.rank * num_workers + worker :: splits]

    def num_positions(self, worker: int = 0, num_workers: int = 1) -> int:
        """Target positions of one split (from the index; nothing decoded)."""
        return int(self.store.document_positions()[self.split_documents(worker, num_workers)].sum())

    def __iter__(self):
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return self._windows(self.split_documents(worker, num_workers))

    def _windows(self, documents: np.ndarray):
        T = self.seq_len
        inputs, targets, masks, probs = [], [], [], []
        buffered = 0
        for i in documents:
            i = int(i)
            if self.with_teacher:
                doc = self.store.document(i)
                layout = doc.layout
                dense = np.zeros((layout.num_positions + 1, ALPHABET_SIZE), dtype=np.float32)
                densify(layout, doc.values, dense[:-1])
                probs.append(dense)
            else:
                layout = stream_layout(self.trie, self.store.document_tokens(i))
            symbols = layout.symbols.astype(np.int64)
            target = np.empty_like(symbols)
            target[:-1] = symbols[1:]
            target[-1] = PAD
            mask = np.ones(len(symbols), dtype=bool)
            mask[-1] = False
            assert symbols[-1] == EOS
            inputs.append(symbols)
            targets.append(target)
            masks.append(mask)
            buffered += len(symbols)
            while buffered >= T:
                yield self._emit(inputs, targets, masks, probs, T)
                buffered -= T
        if buffered:
            yield self._emit(inputs, targets, masks, probs, buffered)

    def _emit(self, inputs, targets, masks, probs, n):
        """Take the first n buffered positions (padding to seq_len) and leave the rest."""
        T = self.seq_len
        out = {
            "input_ids": _take(inputs, n, T, PAD),
            "target_ids": _take(targets, n, T, PAD),
            "loss_mask": _take(masks, n, T, False),
        }
        if self.with_teacher:
            out["target_probs"] = _take(probs, n, T, 0.0)
        return {k: torch.from_numpy(v) for k, v in out.items()}


def _take(parts: list[np.ndarray], n: int, total: int, fill) -> np.ndarray:
    """Pop the first n rows of the concatenation of ``parts`` (in place) into a ``total``-row array."""
    first = parts[0]
    out = np.empty((total,) + first.shape[1:], dtype=first.dtype)
    out[n:] = fill
    at = 0
    while at < n:
        part = parts[0]
        k = min(len(part), n - at)
        out[at : at + k] = part[:k]
        at += k
        if k == len(part):
            parts.pop(0)
        else:
            parts[0] = part[k:]
    return out
