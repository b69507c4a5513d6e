"""The distillation loss (docs/DESIGN.md, "Loss").

Per target position::

    α · T² · KL(teacher_T ‖ student_T)  +  (1 − α) · CE(student, next symbol)

over the full distribution over the stream's alphabet (never top-k). With temperature T the student is
``log_softmax(logits / T)`` and the teacher is ``p^(1/T)`` renormalised; positions where the
teacher gives a symbol probability 0 contribute 0 to the KL. Only positions in ``loss_mask``
count, and the sums are divided once by the number of those positions; in stores of
conversations ``--loss-on assistant`` counts only the assistant's targets (:func:`counted_targets`).
:class:`LossConfig` holds α, T and which targets count as training sets them (``--alpha``,
``--temperature``, ``--loss-on``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from common.errors import UserError
from configs.ranges import FRACTION, POSITIVE

if TYPE_CHECKING:  # torch is imported where it runs: `bytedistill train --help` loads none
    import torch


ASSISTANT = 3  # the role of the assistant's targets in a store of conversations (0 template, 1 system, 2 user)
LOSS_ON = ("assistant", "all")
AUTO_LOSS_ON = "auto"


@dataclass
class LossConfig:
    """α and T of the loss (the formula above)."""

    alpha: float = field(
        default=1.0,
        metadata={
            "help": "weight of KL(teacher||student); 1-alpha weighs cross-entropy; 0 = baseline",
            "range": FRACTION,
        },
    )
    temperature: float = field(default=1.0, metadata={"help": "distillation temperature", "range": POSITIVE})
    loss_on: str = field(
        default=AUTO_LOSS_ON,
        metadata={
            "help": "the targets the loss counts in stores of conversations: assistant (only the assistant's "
            "turns, its end-of-turn symbol included), all (every target), or auto: all (measured ahead of "
            "assistant on the assistant's own bytes and end-of-turn probability; a plain store has no roles: "
            "assistant is refused there)",
            "choices": [AUTO_LOSS_ON, *LOSS_ON],
        },
    )


def resolved_loss_on(loss_on: str, chat: bool) -> str:
    """``--loss-on`` once ``auto`` is resolved: all, for stores of conversations (``chat``) as for plain
    text (docs/DESIGN.md, "Conversations", says why); assistant on plain stores, which have no roles,
    is refused."""
    if loss_on == AUTO_LOSS_ON:
        return "all"
    if loss_on == "assistant" and not chat:
        raise UserError("--loss-on assistant needs stores of conversations (roles per target); these hold plain text")
    return loss_on


def counted_targets(batch: dict[str, torch.Tensor], loss_on: str) -> torch.Tensor:
    """The targets the loss counts: ``loss_mask``, and with ``loss_on`` "assistant" only those whose
    role is the assistant's (a batch without roles counts all)."""
    mask = batch["loss_mask"].bool()
    if loss_on == "assistant" and "roles" in batch:
        mask = mask & (batch["roles"] == ASSISTANT)
    return mask


@dataclass
class LossOutput:
    total: torch.Tensor  # what to back-propagate
    kl: torch.Tensor  # mean KL(teacher ‖ student) per target position (T²-scaled); nan without a teacher
    ce: torch.Tensor  # mean cross-entropy per target position, at temperature 1
    num_targets: torch.Tensor  # number of positions that counted


def soften_teacher(probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """``p^(1/T)`` renormalised over the last axis (zeros stay zero)."""
    import torch

    if temperature == 1.0:
        return probs
    powered = probs.clamp_min(0).pow(1.0 / temperature)
    return powered / powered.sum(-1, keepdim=True).clamp_min(torch.finfo(powered.dtype).tiny)


def kl_per_position(teacher_probs: torch.Tensor, student_logprobs: torch.Tensor) -> torch.Tensor:
    """Σ_v p_v (log p_v − log q_v) over the last axis; terms with p_v = 0 are 0."""
    import torch

    return (torch.xlogy(teacher_probs, teacher_probs) - teacher_probs * student_logprobs).sum(-1)


def distill_loss(
    logits: torch.Tensor,
    target_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    target_probs: torch.Tensor | None = None,
    *,
    alpha: float = 1.0,
    temperature: float = 1.0,
) -> LossOutput:
    """The loss for logits (..., V), target ids (...), mask (...), teacher probs (..., V)."""
    import torch
    import torch.nn.functional as F

    if not 0.0 <= alpha <= 1.0:
        raise UserError(f"loss weight alpha must lie in [0, 1], got {alpha}")
    if temperature <= 0:
        raise UserError(f"distillation temperature must be positive, got {temperature}")
    if alpha > 0 and target_probs is None:
        raise UserError(f"alpha={alpha} needs teacher probabilities, but the batch has none")
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    mask = loss_mask.bool()
    num_targets = mask.sum()
    denominator = num_targets.clamp_min(1).to(logits.dtype)

    logprobs = F.log_softmax(logits, dim=-1)
    token_ce = -logprobs.gather(-1, target_ids.long().unsqueeze(-1)).squeeze(-1)
    ce = torch.where(mask, token_ce, 0.0).sum() / denominator

    if target_probs is None:
        kl = torch.full((), float("nan"), dtype=logits.dtype, device=logits.device)
        return LossOutput(total=ce, kl=kl, ce=ce, num_targets=num_targets)

    if temperature == 1.0:
        student_t = logprobs
    else:
        student_t = F.log_softmax(logits / temperature, dim=-1)
    teacher_t = soften_teacher(target_probs.to(logits.dtype), temperature)
    token_kl = kl_per_position(teacher_t, student_t) * temperature**2
    kl = torch.where(mask, token_kl, 0.0).sum() / denominator
    return LossOutput(total=alpha * kl + (1.0 - alpha) * ce, kl=kl, ce=ce, num_targets=num_targets)
