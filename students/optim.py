"""The optimiser and its learning-rate schedule.

AdamW (betas 0.9, 0.95; weight decay on matrices only). Learning rate: a linear warm-up over
``warmup_steps`` times a cosine from ``lr`` to ``min_lr`` over the run's progress (0..1), a
function of the step and the progress only, so that a resumed run needs no scheduler state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bytestream.ranges import NON_NEGATIVE, POSITIVE

if TYPE_CHECKING:  # torch is imported where it runs: `bytedistill train --help` loads none
    import torch


@dataclass
class OptimConfig:
    """The optimiser and schedule as training sets them (``--lr`` … ``--grad-clip``)."""

    lr: float = field(default=1e-3, metadata={"help": "peak learning rate", "range": POSITIVE})
    min_lr: float = field(
        default=1e-4, metadata={"help": "learning rate at the end of the cosine decay", "range": NON_NEGATIVE}
    )
    warmup_steps: int = field(default=100, metadata={"help": "linear warm-up steps", "range": NON_NEGATIVE})
    weight_decay: float = field(
        default=0.1, metadata={"help": "AdamW weight decay (matrices only)", "range": NON_NEGATIVE}
    )
    grad_clip: float = field(
        default=1.0, metadata={"help": "clip the gradient norm to this (0: off)", "range": NON_NEGATIVE}
    )


def learning_rate(optim: OptimConfig, step: int, progress: float) -> float:
    """Linear warm-up over ``warmup_steps`` times a cosine from ``lr`` to ``min_lr`` over progress 0..1."""
    warmup = min(1.0, step / optim.warmup_steps) if optim.warmup_steps > 0 else 1.0
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return warmup * (optim.min_lr + (optim.lr - optim.min_lr) * cosine)


def adamw(model: torch.nn.Module, optim: OptimConfig) -> torch.optim.Optimizer:
    """AdamW over ``model``'s parameters, decaying the matrices (2 or more dimensions) only."""
    import torch

    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=optim.lr, betas=(0.9, 0.95), eps=1e-8)
