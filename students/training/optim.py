"""The optimiser and its learning-rate schedule.

AdamW (betas 0.9, 0.95; weight decay on matrices only). Learning rate: a linear warm-up over
``warmup_steps`` times a cosine from ``lr`` to ``min_lr`` over the run's progress (0..1), a
function of the step and the progress only, so that a resumed run needs no scheduler state. The
cosine follows the run's length by construction (it ends where the run does); the warm-up follows
it too unless given (:func:`warmup_steps`), and one that the run would never leave, or that
takes most of it, is warned about in one line when training starts (:func:`check_schedule`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from configs.ranges import NON_NEGATIVE, POSITIVE

if TYPE_CHECKING:  # torch is imported where it runs: `bytedistill train --help` loads none
    import torch


@dataclass
class OptimConfig:
    """The optimiser and schedule as training sets them (``--lr`` … ``--grad-clip``)."""

    lr: float = field(default=1e-3, metadata={"help": "peak learning rate", "range": POSITIVE})
    min_lr: float = field(
        default=1e-4, metadata={"help": "learning rate at the end of the cosine decay", "range": NON_NEGATIVE}
    )
    warmup_steps: int | None = field(
        default=None,
        metadata={
            "help": "linear warm-up steps (default: a twentieth of --max-steps, at least 1; 100 with only "
            "--max-train-bytes)",
            "range": NON_NEGATIVE,
        },
    )
    weight_decay: float = field(
        default=0.1, metadata={"help": "AdamW weight decay (matrices only)", "range": NON_NEGATIVE}
    )
    grad_clip: float = field(
        default=1.0, metadata={"help": "clip the gradient norm to this (0: off)", "range": NON_NEGATIVE}
    )


WARMUP_FRACTION = 0.05  # of --max-steps, when --warmup-steps is not given
WARMUP_WITHOUT_STEPS = 100  # when the run's length is given in bytes only
LONG_WARMUP = 0.5  # a warm-up longer than this share of the run is warned about


def warmup_steps(optim: OptimConfig, max_steps: int | None) -> int:
    """The warm-up's length: as given, else :data:`WARMUP_FRACTION` of the run's steps (at least 1)."""
    if optim.warmup_steps is not None:
        return optim.warmup_steps
    if max_steps:
        return max(1, round(WARMUP_FRACTION * max_steps))
    return WARMUP_WITHOUT_STEPS


def check_schedule(optim: OptimConfig, max_steps: int | None) -> str | None:
    """A one-line warning for a warm-up the run never leaves (longer than ``--max-steps``) or one
    that takes more than half of it; None for a schedule that fits."""
    given = optim.warmup_steps
    if given is None or not max_steps:
        return None
    if given > max_steps:
        return (
            f"warning: --warmup-steps {given} is more than --max-steps {max_steps}: the learning rate never reaches "
            f"--lr {optim.lr:g} (it ends at {max_steps / given:.0%} of it); give fewer warm-up steps, or leave the "
            "flag out (a twentieth of the run)"
        )
    if given > LONG_WARMUP * max_steps:
        return (
            f"warning: --warmup-steps {given} is {given / max_steps:.0%} of --max-steps {max_steps}: "
            f"the learning rate reaches --lr {optim.lr:g} only at step {given}"
        )
    return None


def learning_rate(optim: OptimConfig, step: int, progress: float, max_steps: int | None = None) -> float:
    """Linear warm-up over :func:`warmup_steps` times a cosine from ``lr`` to ``min_lr`` over progress 0..1."""
    warmup_length = warmup_steps(optim, max_steps)
    warmup = min(1.0, step / warmup_length) if warmup_length > 0 else 1.0
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return warmup * (optim.min_lr + (optim.lr - optim.min_lr) * cosine)


def adamw(model: torch.nn.Module, optim: OptimConfig) -> torch.optim.Optimizer:
    """AdamW over ``model``'s parameters, decaying the matrices (2 or more dimensions) only."""
    import torch

    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=optim.lr, betas=(0.9, 0.95), eps=1e-8)
