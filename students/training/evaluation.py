"""Held-out evaluation: student and teacher bits per byte, and the KL between them.

Bits per byte (BPB) = total NLL of the stream in nats / (ln 2 × UTF-8 bytes), counting every
symbol's NLL (``<eot>``, ``<eos>`` included) but only real bytes in the denominator
(docs/DESIGN.md, "Evaluation"); in the fused stream every text byte is one symbol, whatever its
flag, and ``<eos>`` the one symbol more per document. The teacher's BPB is its NLL of the same targets from
the stored distributions; the KL is KL(teacher ‖ student) summed over the stream, per byte. On
conversations (a store with roles) the student's and teacher's BPB are also reported over the
assistant's targets alone: their NLL (the end-of-turn symbol closing each answer included) per
byte of the assistant's text (``assistant_student_bpb``, ``assistant_teacher_bpb``).

Exact for any number of processes: each rank reads its own splits of the held-out store (each
position in exactly one), ranks with fewer batches run fully masked ones so that all run the same
number of forward passes, and the sums are added once at the end. :class:`EvalConfig` says when
training evaluates and on how much of the held-out store (``--eval-every``, ``--eval-bytes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from common.errors import UserError
from configs.ranges import NON_NEGATIVE
from students.training.batch_source import to_device, utf8_bytes
from students.training.loss import counted_targets, kl_per_position

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


@dataclass
class ChatEvalMetrics(EvalMetrics):
    """On conversations, also the figures over the assistant's targets only: their NLL (the end of
    each turn included) per byte of the assistant's text."""

    assistant_student_bpb: float = math.nan
    assistant_teacher_bpb: float = math.nan
    assistant_bytes: int = 0


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
    names = ("student", "teacher", "kl", "bytes", *(CHAT_SUMS if getattr(dataset, "has_roles", False) else ()))
    sums = {name: torch.zeros((), dtype=torch.float64, device=device) for name in names}
    batches = iter(dataset.loader())
    for _ in range(rounds):
        batch = next(batches, None) or masked_batch(
            seq_len, dataset.stream, _alphabet(dataset), "assistant_bytes" in sums
        )
        for name, value in _batch_sums(model, to_device(batch, device), dataset.stream).items():
            sums[name] += value
    model.train(was_training)
    totals = {name: float(value) for name, value in accelerator.reduce(sums, reduction="sum").items()}
    if totals["bytes"] == 0:
        raise UserError("the evaluation store yields no UTF-8 bytes")
    scale = math.log(2) * totals["bytes"]
    figures = (totals["student"] / scale, totals["teacher"] / scale, totals["kl"] / scale, int(totals["bytes"]))
    if "assistant_bytes" not in totals:
        return EvalMetrics(*figures)
    chat_scale = math.log(2) * totals["assistant_bytes"] if totals["assistant_bytes"] else math.nan
    return ChatEvalMetrics(
        *figures,
        totals["assistant_student"] / chat_scale,
        totals["assistant_teacher"] / chat_scale,
        int(totals["assistant_bytes"]),
    )


CHAT_SUMS = ("assistant_student", "assistant_teacher", "assistant_bytes")


def _alphabet(dataset: SplitBatches) -> int:
    """The width of the dataset's teacher rows: the stream's alphabet and any reserved symbols."""
    return getattr(dataset, "alphabet_size", dataset.stream.alphabet_size)


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
    sums = {
        "student": student_nll[mask].double().sum(),
        "teacher": teacher_nll[mask].sum(),
        "kl": kl[mask].double().sum(),
        "bytes": utf8_bytes(batch, stream).double(),
    }
    if "roles" in batch:
        assistant = counted_targets(batch, "assistant")
        sums["assistant_student"] = student_nll[assistant].double().sum()
        sums["assistant_teacher"] = teacher_nll[assistant].sum()
        sums["assistant_bytes"] = (assistant & (batch["target_ids"] < stream.text_symbols)).sum().double()
    return sums


def masked_batch(
    seq_len: int, stream: StreamKind, alphabet_size: int | None = None, roles: bool = False
) -> dict[str, torch.Tensor]:
    """One window of ``stream``'s padding with no target: a forward pass that counts nothing
    (teacher rows ``alphabet_size`` wide, the stream's alphabet by default; with ``roles``, all 0)."""
    import torch

    batch = {
        "input_ids": torch.full((1, seq_len), stream.pad, dtype=torch.int64),
        "target_ids": torch.full((1, seq_len), stream.pad, dtype=torch.int64),
        "loss_mask": torch.zeros((1, seq_len), dtype=torch.bool),
        "target_probs": torch.zeros((1, seq_len, alphabet_size or stream.alphabet_size), dtype=torch.float32),
    }
    if roles:
        batch["roles"] = torch.zeros((1, seq_len), dtype=torch.uint8)
    return batch
