"""A synthetic teacher for smoke tests and demos: no logit store needed.

The "teacher" is a fixed random bigram model over the stream's alphabet (260 symbols, or the fused
stream's 515; some transitions have probability exactly 0, ``<pad>`` and ``<bos>`` never follow
anything). :class:`BigramStreamDataset`
yields the same dicts as ``students.training.store_windows.PackedStreamDataset``, so the trainer runs on it
unchanged (and resumes it the same way); ``SYNTHETIC_SOURCE`` plugs it into :func:`students.training.trainer.train`.
The store "paths" only pick the sample: a different name gives different sequences from the same teacher.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

from bytestream.stream_kind import StreamKind
from students.training.batch_source import DataSource
from students.training.store_windows import SplitBatches


def bigram_teacher(seed: int = 1234, sharpness: float = 3.0, stream: StreamKind = StreamKind.EOT) -> torch.Tensor:
    """(A, A) row-stochastic matrix over ``stream``'s A symbols: P[a, b] = p(next = b | current = a)."""
    size = stream.alphabet_size
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(size, size, generator=generator) * sharpness
    zeros = torch.rand(size, size, generator=generator) < 0.5
    logits[zeros] = float("-inf")
    logits[:, stream.pad] = float("-inf")
    logits[:, stream.bos] = float("-inf")
    logits[torch.arange(size), torch.randint(0, 256, (size,), generator=generator)] = 0.0
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
        stream: StreamKind = StreamKind.EOT,
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
        self.stream, self.with_teacher, self.shuffle, self.seed = stream, with_teacher, shuffle, seed
        self.num_sequences = min(num_sequences, -(-max_symbols // seq_len)) if max_symbols > 0 else num_sequences
        self.sample_seed = zlib.crc32("|".join(map(str, paths)).encode())
        self.teacher = bigram_teacher(stream=stream)

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
        symbols = [self.stream.bos]
        for _ in range(self.seq_len):
            symbols.append(int(torch.multinomial(self.teacher[symbols[-1]], 1, generator=generator)))
        sequence = torch.tensor(symbols)
        target = sequence[1:].clone()
        target[-1] = self.stream.pad  # one padded position, like the end of a pack
        item = {"input_ids": sequence[:-1], "target_ids": target, "loss_mask": target != self.stream.pad}
        if self.with_teacher:
            item["target_probs"] = self.teacher[sequence[:-1]]
        return {key: value.numpy() for key, value in item.items()}


SYNTHETIC_SOURCE = DataSource(
    build=BigramStreamDataset,
    describe=lambda paths: {"teacher": "synthetic bigram (students.training.synthetic)", "corpus": "synthetic"},
)
