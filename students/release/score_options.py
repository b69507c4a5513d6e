"""What ``score`` scores and how (:class:`ScoreOptions`, the ``score`` flags); scoring itself is
:mod:`students.release.score`.

Importing it loads no torch: ``bytedistill score --help`` builds its parser from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from configs.ranges import COUNT, at_least

MODES = ("stream", "plain", "plain-renormalised")


@dataclass
class ScoreOptions:
    mode: str = field(
        default="stream",
        metadata={
            "help": "stream: the student's training stream, with the teacher's token ends (the fused stream's "
            "flagged bytes, or an <eot> student's <eot> marks); plain: bytes only; "
            "plain-renormalised: bytes only, P over bytes + <eos>",
            "choices": list(MODES),
        },
    )
    context: int | None = field(
        default=None,
        metadata={"help": "window length in symbols (default and maximum: the trained context)", "range": at_least(2)},
    )
    stride: int | None = field(
        default=None,
        metadata={
            "help": "window step (default: the context, as train evaluates; smaller: more context per position)",
            "range": COUNT,
        },
    )
    packed: bool = field(
        default=True,
        metadata={
            "help": "each source's documents back to back, as train evaluates a store, in windows from the "
            "source's start (false: each document on its own, as lm-eval)"
        },
    )
    batch_size: int = field(default=8, metadata={"help": "windows per forward pass", "range": COUNT})
    text_field: str = field(default="text", metadata={"help": "field of each .jsonl record holding the text"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})
