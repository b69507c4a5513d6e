"""Measured generation speed: ``model.generate`` with caches on, greedy, a fixed number of new
symbols per row (``<bos>``, ``<eos>`` and ``<pad>`` suppressed so that every row runs to the end), and
the text bytes among them (a fused stream's every symbol is one; an ``<eot>`` is none)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from bytestream.stream_kind import StreamKind


@dataclass(frozen=True)
class Speed:
    batch: int
    new_symbols: int  # per row
    new_bytes: int  # over all rows
    seconds: float

    @property
    def bytes_per_s(self) -> float:
        return self.new_bytes / self.seconds

    @property
    def symbols_per_s(self) -> float:
        return self.batch * self.new_symbols / self.seconds


@torch.no_grad()
def generation_speed(model, prompts: torch.Tensor, new_symbols: int) -> Speed:
    """Time ``new_symbols`` greedy symbols after each row of ``prompts`` (B, T), caches on."""
    model.eval()
    stream = StreamKind.of_config(model.config)
    start = time.perf_counter()
    output = model.generate(
        input_ids=prompts,
        attention_mask=torch.ones_like(prompts),
        max_new_tokens=new_symbols,
        min_new_tokens=new_symbols,
        do_sample=False,
        use_cache=True,
        suppress_tokens=[stream.bos, stream.eos, stream.pad],
        eos_token_id=None,
        pad_token_id=stream.pad,
    )
    seconds = time.perf_counter() - start
    new = output[:, prompts.shape[1] :]
    return Speed(prompts.shape[0], new.shape[1], int((new < stream.text_symbols).sum()), seconds)
