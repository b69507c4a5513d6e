"""``bytedistill score``: the command line over :func:`students.score.score`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

MODES = ["stream", "plain", "plain-renormalised"]


@dataclass
class ScoreConfig:
    model: str = field(metadata={"help": "exported model folder", "positional": True})
    sources: list[str] = field(
        metadata={
            "help": "text files (.txt/.md: one document each), .jsonl files or logit store folders",
            "positional": True,
        }
    )
    mode: str = field(
        default="stream",
        metadata={
            "help": "stream: the training stream with the teacher's <eot> marks; plain: bytes only; "
            "plain-renormalised: bytes only, P over bytes + <eos>",
            "choices": MODES,
        },
    )
    context: int | None = field(
        default=None, metadata={"help": "window length in symbols (default and maximum: the trained context)"}
    )
    stride: int | None = field(
        default=None,
        metadata={"help": "window step (default: the context, as train evaluates; smaller: more context per position)"},
    )
    packed: bool = field(
        default=True,
        metadata={"help": "documents back to back as train evaluates (false: each document on its own, as lm-eval)"},
    )
    batch_size: int = field(default=8, metadata={"help": "windows per forward pass"})
    text_field: str = field(default="text", metadata={"help": "field of each .jsonl record holding the text"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})


def score(config: ScoreConfig) -> int:
    """Bits per byte of an exported student on text, .jsonl or logit stores."""
    from students.score import ScoreOptions
    from students.score import score as score_sources

    options = ScoreOptions(
        mode=config.mode,
        context=config.context,
        stride=config.stride,
        packed=config.packed,
        batch_size=config.batch_size,
        text_field=config.text_field,
        progress=config.progress,
    )
    results = score_sources(Path(config.model), [Path(s) for s in config.sources], options)
    print(f"{'source':<32} {'documents':>9} {'bytes':>12} {'student BPB':>11} {'teacher BPB':>11}")
    for r in results:
        teacher = f"{r.teacher_bpb:.4f}" if r.teacher_bpb is not None else "-"
        print(f"{r.name:<32} {r.documents:>9,} {r.bytes:>12,} {r.student_bpb:>11.4f} {teacher:>11}")
    return 0
