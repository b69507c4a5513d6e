"""A synthetic teacher for smoke tests and demos: no logit store needed.

The "teacher" is a fixed random bigram model over the 260-symbol alphabet (some transitions
have probability exactly 0, ``<pad>`` never follows anything). :class:`BigramStreamDataset`
yields the same dicts as ``students.training.store_windows.PackedStreamDataset``, so the trainer runs on it
unchanged (and resumes it the same way); ``SYNTHETIC_SOURCE`` plugs it into :func:`students.training.trainer.train`.
The store "paths" only pick the sample: a different name gives different sequences from the same teacher.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

from bytestream.alphabet import ALPHABET_SIZE, BOS, PAD
from students.training.batch_source import DataSource
from students.training.store_windows import SplitBatches


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


class BigramStreamDataset(SplitBatches):
    """``num_sequences`` sequences of ``seq_len`` symbols sampled from :func:`bigram_teacher`,
    dealt round-robin to the splits (``max_symbols`` > 0 keeps the first that many symbols' worth)."""

    def __init__(
        self,
        paths: list[str],
        seq_len: int,
        batch_size: int = 1,
        *,
        with_teacher: bool = True,
        teacher_dtype: str = "float32",
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 0,
        max_symbols: int = 0,
        num_sequences: int = 32,
    ):
        super().__init__(seq_len, batch_size, rank, world_size, num_workers, teacher_dtype)
        self.with_teacher, self.shuffle, self.seed = with_teacher, shuffle, seed
        self.num_sequences = min(num_sequences, -(-max_symbols // seq_len)) if max_symbols > 0 else num_sequences
        self.sample_seed = zlib.crc32("|".join(map(str, paths)).encode())
        self.teacher = bigram_teacher()

    def order_settings(self) -> dict:
        return {
            **super().order_settings(),
            "shuffle": self.shuffle,
            "seed": self.seed,
            "sample": self.sample_seed,
            "num_sequences": self.num_sequences,
        }

    def _split(self, split: int) -> list[int]:
        order = torch.arange(self.num_sequences)
        if self.shuffle:
            order = order[
                torch.randperm(self.num_sequences, generator=torch.Generator().manual_seed(self.seed + self.epoch))
            ]
        return order[split :: self.num_splits].tolist()

    def num_windows(self, split: int) -> int:
        return len(self._split(split))

    def window_segments(self, split: int, start: int):
        for index in self._split(split)[start:]:
            yield [self._sequence(index)]

    def _sequence(self, index: int) -> dict[str, np.ndarray]:
        generator = torch.Generator().manual_seed(self.sample_seed * 1_000_003 + index)
        symbols = [BOS]
        for _ in range(self.seq_len):
            symbols.append(int(torch.multinomial(self.teacher[symbols[-1]], 1, generator=generator)))
        stream = torch.tensor(symbols)
        target = stream[1:].clone()
        target[-1] = PAD  # one padded position, like the end of a pack
        item = {"input_ids": stream[:-1], "target_ids": target, "loss_mask": target != PAD}
        if self.with_teacher:
            item["target_probs"] = self.teacher[stream[:-1]]
        return {key: value.numpy() for key, value in item.items()}


SYNTHETIC_SOURCE = DataSource(
    build=BigramStreamDataset,
    describe=lambda paths: {"teacher": "synthetic bigram (students.training.synthetic)", "corpus": "synthetic"},
)
