"""``bytedistill score``: the command line over :func:`students.release.score.score`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from students.release.score_options import ScoreOptions


@dataclass(kw_only=True)
class ScoreConfig(ScoreOptions):
    """The library's options (their flags) and what to score."""

    model: str = field(metadata={"help": "exported model folder", "positional": True})
    sources: list[str] = field(
        metadata={
            "help": "text files (.txt/.md: one document each), .jsonl/.jsonl.zst/.parquet files, logit store folders "
            "or stores on the Hub (hf://datasets/OWNER/NAME[@REVISION])",
            "positional": True,
        }
    )


def score(config: ScoreConfig) -> int:
    """Bits per byte of an exported student on text, record files or logit stores."""
    from logit_store.hub import local_store
    from students.release.score import score as score_sources

    results = score_sources(Path(config.model), [local_store(s) for s in config.sources], config)
    print(f"{'source':<32} {'documents':>9} {'bytes':>12} {'student BPB':>11} {'teacher BPB':>11}")
    for r in results:
        teacher = f"{r.teacher_bpb:.4f}" if r.teacher_bpb is not None else "-"
        print(f"{r.name:<32} {r.documents:>9,} {r.bytes:>12,} {r.student_bpb:>11.4f} {teacher:>11}")
    return 0
