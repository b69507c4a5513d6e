"""The distillation loss: hand computation, gradients, masking, temperature."""

import math

import pytest
import torch

from bytestream.alphabet import ALPHABET_SIZE, PAD
from common.errors import UserError
from students.training.loss import distill_loss


def _hand_loss(logits, targets, mask, probs, alpha, temperature):
    """Plain Python over lists: the definition, one position at a time."""
    kl_sum = ce_sum = 0.0
    count = 0
    for row, target, keep, p in zip(logits, targets, mask, probs):
        if not keep:
            continue
        count += 1
        log_z = math.log(sum(math.exp(x) for x in row))
        ce_sum += -(row[target] - log_z)
        log_zt = math.log(sum(math.exp(x / temperature) for x in row))
        powered = [pi ** (1 / temperature) for pi in p]
        pt = [x / sum(powered) for x in powered]
        kl_sum += temperature**2 * sum(
            pi * (math.log(pi) - (x / temperature - log_zt)) for pi, x in zip(pt, row) if pi > 0
        )
    kl, ce = kl_sum / count, ce_sum / count
    return alpha * kl + (1 - alpha) * ce, kl, ce


def _example(vocab=5, positions=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(positions, vocab, generator=g, dtype=torch.float64)
    probs = torch.rand(positions, vocab, generator=g, dtype=torch.float64)
    probs[:, 1] = 0.0  # zero teacher mass contributes nothing
    probs /= probs.sum(-1, keepdim=True)
    targets = torch.randint(0, vocab, (positions,), generator=g)
    mask = torch.tensor([True, True, False, True])
    return logits, targets, mask, probs


@pytest.mark.parametrize("alpha,temperature", [(1.0, 1.0), (0.5, 1.0), (0.3, 2.0), (0.0, 0.7)])
def test_loss_matches_hand_computation(alpha, temperature):
    logits, targets, mask, probs = _example()
    out = distill_loss(logits, targets, mask, probs, alpha=alpha, temperature=temperature)
    total, kl, ce = _hand_loss(logits.tolist(), targets.tolist(), mask.tolist(), probs.tolist(), alpha, temperature)
    assert out.total.item() == pytest.approx(total, rel=1e-12)
    assert out.kl.item() == pytest.approx(kl, rel=1e-12)
    assert out.ce.item() == pytest.approx(ce, rel=1e-12)
    assert out.num_targets.item() == 3


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_gradient_matches_finite_differences(temperature):
    logits, targets, mask, probs = _example()
    logits.requires_grad_(True)
    func = lambda x: distill_loss(x, targets, mask, probs, alpha=0.6, temperature=temperature).total
    assert torch.autograd.gradcheck(func, (logits,), eps=1e-6, atol=1e-8)


def test_masked_and_padded_positions_contribute_nothing():
    logits, targets, mask, probs = _example()
    base = distill_loss(logits, targets, mask, probs, alpha=0.5)
    # garbage at the masked position (even an all-zero teacher row and a PAD target) changes nothing
    logits2, probs2, targets2 = logits.clone(), probs.clone(), targets.clone()
    logits2[2] = 1e3
    probs2[2] = 0.0
    targets2[2] = 4
    logits2.requires_grad_(True)
    out = distill_loss(logits2, targets2, mask, probs2, alpha=0.5)
    assert out.total.item() == pytest.approx(base.total.item(), rel=1e-14)
    out.total.backward()
    assert torch.all(logits2.grad[2] == 0)
    assert torch.isfinite(logits2.grad).all()


def _full_alphabet_batch(batch: int, length: int, seed: int):
    """Random float32 (logits, teacher probabilities, byte targets, all-true mask) of shape (B, T, ·)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, length, ALPHABET_SIZE, generator=g)
    probs = torch.softmax(torch.randn(batch, length, ALPHABET_SIZE, generator=g), -1)
    targets = torch.randint(0, 256, (batch, length), generator=g)
    return logits, probs, targets, torch.ones(batch, length, dtype=torch.bool)


def test_batched_full_alphabet_with_padding():
    logits, probs, targets, mask = _full_alphabet_batch(2, 6, seed=1)
    mask[1, 4:] = False
    targets[1, 4:] = PAD
    out = distill_loss(logits, targets, mask, probs, alpha=0.5)
    flat = _hand_loss(
        logits.reshape(-1, ALPHABET_SIZE).double().tolist(),
        targets.reshape(-1).tolist(),
        mask.reshape(-1).tolist(),
        probs.reshape(-1, ALPHABET_SIZE).double().tolist(),
        0.5,
        1.0,
    )
    assert out.total.item() == pytest.approx(flat[0], rel=1e-5)
    assert out.num_targets.item() == 10


def test_kl_is_zero_when_student_equals_teacher():
    g = torch.Generator().manual_seed(2)
    probs = torch.softmax(torch.randn(3, 7, generator=g, dtype=torch.float64), -1)
    out = distill_loss(probs.log(), torch.zeros(3, dtype=torch.long), torch.ones(3, dtype=torch.bool), probs)
    assert out.kl.item() == pytest.approx(0.0, abs=1e-12)


def test_baseline_needs_no_teacher_and_distillation_does():
    logits, targets, mask, _ = _example()
    out = distill_loss(logits, targets, mask, None, alpha=0.0)
    assert out.total.item() == out.ce.item() and math.isnan(out.kl.item())
    with pytest.raises(UserError, match="teacher probabilities"):
        distill_loss(logits, targets, mask, None, alpha=0.5)


def test_half_precision_logits_give_a_float32_loss():
    logits, probs, targets, mask = _full_alphabet_batch(2, 5, seed=3)
    exact = distill_loss(logits.bfloat16().float(), targets, mask, probs, alpha=0.9)
    mixed = distill_loss(logits.bfloat16(), targets, mask, probs.half(), alpha=0.9)
    assert mixed.total.dtype == mixed.kl.dtype == mixed.ce.dtype == torch.float32
    assert mixed.ce.item() == exact.ce.item()  # the bf16 logits are widened before the softmax
    assert mixed.kl.item() == pytest.approx(exact.kl.item(), rel=1e-3)  # float16 teacher rows
