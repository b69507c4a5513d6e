"""Held-out evaluation: student and teacher bits per byte, and the KL between them.

Bits per byte (BPB) = total NLL of the stream in nats / (ln 2 × UTF-8 bytes), counting every
symbol's NLL (``<eot>``, ``<eos>`` included) but only real bytes in the denominator
(docs/DESIGN.md, "Evaluation"); in the fused stream every text byte is one symbol, whatever its
flag, and ``<eos>`` the one symbol more per document. The teacher's BPB is its NLL of the same targets from
the stored distributions; the KL is KL(teacher ‖ student) summed over the stream, per byte.

Exact for any number of processes: each rank reads its own splits of the held-out store (each
position in exactly one), ranks with fewer batches run fully masked ones so that all run the same
number of forward passes, and the sums are added once at the end. :class:`EvalConfig` says when
training evaluates and on how much of the held-out store (``--eval-every``, ``--eval-bytes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bytestream.errors import UserError
from configs.ranges import NON_NEGATIVE
from students.training.batch_source import to_device, utf8_bytes
from students.training.loss import kl_per_position

if TYPE_CHECKING:  # torch is imported where it runs: `bytedistill train --help` loads none
    import torch

    from bytestream.stream_kind import StreamKind
    from students.training.store_windows import SplitBatches


@dataclass
class EvalConfig:
    """When training evaluates (every ``every`` steps) and on how many held-out symbols."""

    every: int = field(
        default=500,
        metadata={
            "flag": "eval_every",
            "help": "evaluate every N steps (0: only at start and end)",
            "range": NON_NEGATIVE,
        },
    )
    # stream symbols, as the help of its flag --eval-bytes says: a little more than one per byte
    # (the stream adds one <eot> per teacher token), what the store windows' max_symbols counts
    max_symbols: int = field(
        default=1_000_000,
        metadata={
            "flag": "eval_bytes",
            "help": "evaluate on the held-out documents, in store order, "
            "until their streams reach about this many symbols (0: all)",
            "range": NON_NEGATIVE,
        },
    )


@dataclass
class EvalMetrics:
    student_bpb: float
    teacher_bpb: float
    kl_per_byte: float  # KL(teacher ‖ student) summed over the stream, in bits per UTF-8 byte
    eval_bytes: int


def evaluate(model, accelerator, dataset: SplitBatches, seq_len: int) -> EvalMetrics:
    """Student and teacher BPB and KL per byte over every position of ``dataset``."""
    import torch

    with torch.no_grad():
        return _evaluate(model, accelerator, dataset, seq_len)


def _evaluate(model, accelerator, dataset: SplitBatches, seq_len: int) -> EvalMetrics:
    import torch

    was_training = model.training
    model.eval()
    device = accelerator.device
    rounds = int(accelerator.reduce(torch.tensor(dataset.num_batches(), device=device), reduction="max"))
    sums = {name: torch.zeros((), dtype=torch.float64, device=device) for name in ("student", "teacher", "kl", "bytes")}
    batches = iter(dataset.loader())
    for _ in range(rounds):
        batch = to_device(next(batches, None) or masked_batch(seq_len, dataset.stream), device)
        for name, value in _batch_sums(model, batch, dataset.stream).items():
            sums[name] += value
    model.train(was_training)
    totals = {name: float(value) for name, value in accelerator.reduce(sums, reduction="sum").items()}
    if totals["bytes"] == 0:
        raise UserError("the evaluation store yields no UTF-8 bytes")
    scale = math.log(2) * totals["bytes"]
    return EvalMetrics(totals["student"] / scale, totals["teacher"] / scale, totals["kl"] / scale, int(totals["bytes"]))


def _batch_sums(model, batch: dict[str, torch.Tensor], stream: StreamKind) -> dict[str, torch.Tensor]:
    """Student NLL, teacher NLL, KL (nats) and UTF-8 bytes over the batch's target positions."""
    import torch

    logprobs = torch.log_softmax(model(input_ids=batch["input_ids"], use_cache=False).logits.float(), -1)
    mask = batch["loss_mask"].bool()
    targets = batch["target_ids"].long().unsqueeze(-1)
    probs = batch["target_probs"]
    student_nll = -logprobs.gather(-1, targets).squeeze(-1)
    teacher_nll = -probs.gather(-1, targets).squeeze(-1).double().log()
    kl = kl_per_position(probs, logprobs)
    return {
        "student": student_nll[mask].double().sum(),
        "teacher": teacher_nll[mask].sum(),
        "kl": kl[mask].double().sum(),
        "bytes": utf8_bytes(batch, stream).double(),
    }


def masked_batch(seq_len: int, stream: StreamKind) -> dict[str, torch.Tensor]:
    """One window of ``stream``'s padding with no target: a forward pass that counts nothing."""
    import torch

    return {
        "input_ids": torch.full((1, seq_len), stream.pad, dtype=torch.int64),
        "target_ids": torch.full((1, seq_len), stream.pad, dtype=torch.int64),
        "loss_mask": torch.zeros((1, seq_len), dtype=torch.bool),
        "target_probs": torch.zeros((1, seq_len, stream.alphabet_size), dtype=torch.float32),
    }
