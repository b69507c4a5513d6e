"""The loss on the student's own sequences (docs/DESIGN.md, "On-policy distillation"): the
generalized Jensen–Shannon divergence of TRL's GKD between the teacher's exact distribution p and
the student's q at every counted position, over the whole alphabet (dense; symbols off the
teacher's support have p = 0):

- β = 0: KL(p ‖ q), the forward KL (the offline loss at T = 1);
- β = 1: the reverse KL(q ‖ p), taken on the teacher's support S:
  KL(q_S ‖ p) − log q(S), with q_S = q / q(S) the student's distribution given that the next symbol
  lies in S. The plain KL(q ‖ p) is infinite as soon as q puts any mass off S (where p is exactly
  0, not small); this is its finite split into the reverse KL of the conditional and the forward KL
  of the event "in S" (which the teacher gives probability 1). It is 0 exactly when q = p, equals
  KL(q ‖ p) whenever q(S) = 1, and pushes every bit of mass off S back onto it.
- 0 < β < 1: with the mixture m = β p + (1 − β) q, β · KL(p ‖ m) + (1 − β) · KL(q ‖ m), finite
  everywhere (m ≥ (1 − β) q covers the student's mass off S).

:func:`mixed_loss` is a batch's loss when some of its sequences are the student's: the offline
loss (:func:`students.training.loss.distill_loss`) on the others, this one on those, each summed
over its counted positions and divided once by all of them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from students.training.loss import LossConfig, LossOutput, counted_targets, distill_loss


def generalized_jsd(teacher_probs: torch.Tensor, student_logprobs: torch.Tensor, beta: float) -> torch.Tensor:
    """The divergence above at every position (..., A) -> (...), in the student's dtype."""
    p = teacher_probs.to(student_logprobs.dtype)
    on_support = p > 0
    log_p = torch.log(torch.where(on_support, p, 1.0))  # 0 off the support, never read there
    if beta == 0.0:
        return (torch.xlogy(p, p) - p * student_logprobs).sum(-1)
    if beta == 1.0:
        log_mass = torch.logsumexp(student_logprobs.masked_fill(~on_support, -math.inf), dim=-1, keepdim=True)
        conditional = torch.where(on_support, student_logprobs - log_mass, 0.0)
        reverse = torch.where(on_support, conditional.exp() * (conditional - log_p), 0.0).sum(-1)
        return reverse - log_mass.squeeze(-1)
    log_m = torch.logaddexp(
        student_logprobs + math.log(1.0 - beta),
        torch.where(on_support, log_p + math.log(beta), -math.inf),
    )
    kl_teacher = torch.where(on_support, p * (log_p - log_m), 0.0).sum(-1)
    kl_student = (student_logprobs.exp() * (student_logprobs - log_m)).sum(-1)
    return beta * kl_teacher + (1.0 - beta) * kl_student


def mixed_loss(
    logits: torch.Tensor, batch: dict[str, torch.Tensor], loss: LossConfig, beta: float
) -> tuple[LossOutput, torch.Tensor]:
    """The batch's loss, and the mean on-policy divergence per counted position of the student's
    sequences (``batch["on_policy_rows"]``, their teacher in ``batch["on_policy_probs"]``)."""
    rows = batch["on_policy_rows"].bool()
    offline = ~rows
    probs = batch.get("target_probs")
    out = distill_loss(
        logits[offline],
        batch["target_ids"][offline],
        counted_targets(batch, loss.loss_on)[offline],
        probs[offline] if probs is not None else None,
        alpha=loss.alpha,
        temperature=loss.temperature,
    )
    student = F.log_softmax(logits[rows].float(), dim=-1)
    mask = batch["loss_mask"][rows].bool()
    per_position = generalized_jsd(batch["on_policy_probs"], student, beta)
    on_sum = torch.where(mask, per_position, 0.0).sum()
    on_count = mask.sum()
    counted = (out.num_targets + on_count).clamp_min(1).to(out.total.dtype)
    total = (out.total * out.num_targets + on_sum) / counted
    divergence = on_sum.detach() / on_count.clamp_min(1)
    return LossOutput(total=total, kl=out.kl, ce=out.ce, num_targets=out.num_targets + on_count), divergence
