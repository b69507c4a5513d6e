"""A synthetic teacher for smoke tests and demos: no logit store needed.

The "teacher" is a fixed random bigram model over the 260-symbol alphabet (some transitions
have probability exactly 0, ``<pad>`` never follows anything). :class:`BigramStreamDataset`
yields the same dicts as ``logit_store.dataset.PackedStreamDataset``, so the trainer runs on it
unchanged; ``SYNTHETIC_SOURCE`` plugs it into :func:`students.trainer.train`. The store "paths"
only pick the sample: a different name gives different sequences from the same teacher.
"""

from __future__ import annotations

import zlib
from typing import Any

import torch
from torch.utils.data import IterableDataset

from distill.alphabet import ALPHABET_SIZE, BOS, PAD
from students.trainer import DataSource


def bigram_teacher(seed: int = 1234, sharpness: float = 3.0) -> torch.Tensor:
    """(260, 260) row-stochastic matrix: P[a, b] = p(next = b | current = a)."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(ALPHABET_SIZE, ALPHABET_SIZE, generator=generator) * sharpness
    zeros = torch.rand(ALPHABET_SIZE, ALPHABET_SIZE, generator=generator) < 0.5
    logits[zeros] = float("-inf")
    logits[:, PAD] = float("-inf")
    logits[:, BOS] = float("-inf")
    logits[torch.arange(ALPHABET_SIZE), torch.randint(0, 256, (ALPHABET_SIZE,), generator=generator)] = 0.0
    return torch.softmax(logits, dim=-1)


class BigramStreamDataset(IterableDataset):
    """``num_sequences`` sequences of ``seq_len`` symbols sampled from :func:`bigram_teacher`."""

    def __init__(
        self,
        paths: list[str],
        seq_len: int,
        *,
        with_teacher: bool = True,
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        num_sequences: int = 32,
    ):
        self.seq_len, self.with_teacher, self.shuffle, self.seed = seq_len, with_teacher, shuffle, seed
        self.rank, self.world_size, self.num_sequences = rank, world_size, num_sequences
        self.sample_seed = zlib.crc32("|".join(map(str, paths)).encode())
        self.teacher = bigram_teacher()
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _sequence(self, index: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.sample_seed * 1_000_003 + index)
        symbols = [BOS]
        for _ in range(self.seq_len):
            symbols.append(int(torch.multinomial(self.teacher[symbols[-1]], 1, generator=generator)))
        stream = torch.tensor(symbols)
        item: dict[str, Any] = {
            "input_ids": stream[:-1],
            "target_ids": stream[1:],
            "loss_mask": torch.ones(self.seq_len, dtype=torch.bool),
        }
        item["loss_mask"][-1] = False  # one padded position, like the end of a pack
        item["target_ids"] = item["target_ids"].clone()
        item["target_ids"][-1] = PAD
        if self.with_teacher:
            item["target_probs"] = self.teacher[stream[:-1]].float()
        return item

    def __iter__(self):
        order = torch.arange(self.num_sequences)
        if self.shuffle:
            order = order[torch.randperm(self.num_sequences, generator=torch.Generator().manual_seed(self.seed + self.epoch))]
        for index in order[self.rank :: self.world_size].tolist():
            yield self._sequence(index)


SYNTHETIC_SOURCE = DataSource(
    build=BigramStreamDataset,
    describe=lambda paths: {"teacher": "synthetic bigram (students.synthetic)", "corpus": "synthetic"},
)
