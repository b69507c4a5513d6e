"""The settings of on-policy training (docs/DESIGN.md, "On-policy distillation"): the share λ of
each batch's sequences the student writes itself, the divergence it learns from on them (β), how it
samples, how much it writes, and the teacher that scores what it wrote.

Importing it loads no torch: ``bytedistill train --help`` builds its parser from this class.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bytestream.stream_kind import StreamKind
from common.errors import UserError
from configs.ranges import COUNT, FRACTION, POSITIVE

TEACHER_DEVICES = "auto (the training device), cpu, cuda or cuda:N"


@dataclass
class OnPolicyConfig:
    """λ, β, the sampling temperature, the answer length and the scoring teacher."""

    share: float = field(
        default=0.0,
        metadata={
            "flag": "on_policy",
            "help": "share (lambda) of each batch's sequences the student writes itself, continuing a prompt from "
            "the training data, scored exactly by --teacher; 0 = offline training only",
            "range": FRACTION,
        },
    )
    beta: float = field(
        default=0.0,
        metadata={
            "flag": "on_policy_beta",
            "help": "divergence on the student's own sequences: 0 = forward KL(teacher||student), 1 = reverse "
            "KL(student||teacher), in between the generalized Jensen-Shannon divergence with this mixture weight",
            "range": FRACTION,
        },
    )
    temperature: float = field(
        default=1.0,
        metadata={
            "flag": "on_policy_temperature",
            "help": "sampling temperature of the student's answers",
            "range": POSITIVE,
        },
    )
    max_bytes: int = field(
        default=64,
        metadata={
            "flag": "on_policy_bytes",
            "help": "text bytes the student writes per answer (at most)",
            "range": COUNT,
        },
    )
    teacher: str | None = field(
        default=None,
        metadata={
            "help": "the teacher that scores the student's answers (folder, Hub id or .gguf file): the training "
            "stores' own teacher; needed with --on-policy"
        },
    )
    teacher_device: str = field(
        default="auto",
        metadata={"help": f"where --teacher runs: {TEACHER_DEVICES}; bfloat16 on a GPU, float32 on the CPU"},
    )

    @property
    def enabled(self) -> bool:
        return self.share > 0


def prompt_budget(config: OnPolicyConfig, seq_len: int, stream: StreamKind) -> int:
    """The most prompt bytes a sequence of ``seq_len`` inputs holds with a whole answer after it: a
    byte takes at most two symbols in the ``<eot>`` stream (itself and an ``<eot>``), one in the fused
    and bytes streams, and ``<bos>`` starts the sequence."""
    if stream.eot is None:
        return seq_len - 1 - config.max_bytes
    return (seq_len - 1) // 2 - config.max_bytes


def check_on_policy(config: OnPolicyConfig, seq_len: int, stream: StreamKind, chat: bool) -> None:
    """Refuse, in one line, settings on-policy training cannot run with (``chat``: on a store of
    conversations, whose answers end with a special, one symbol more)."""
    if not config.enabled:
        return
    if not config.teacher:
        raise UserError("--on-policy needs --teacher: the teacher of the training stores, which scores the answers")
    if prompt_budget(config, seq_len, stream) - chat < 1:
        need = config.max_bytes + 2 + chat if stream.eot is None else 2 * config.max_bytes + 3 + 2 * chat
        raise UserError(
            f"--on-policy-bytes {config.max_bytes} does not fit a --seq-len {seq_len} sequence of the {stream.shown} "
            f"stream with a prompt: give --seq-len at least {need} or fewer --on-policy-bytes"
        )
