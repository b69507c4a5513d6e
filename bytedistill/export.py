"""``bytedistill export``: the command line over :func:`students.release.export.export_student`."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from students.release.card import LICENSE


@dataclass
class ExportConfig:
    checkpoint: str = field(
        metadata={"help": "training checkpoint, or a training output dir (its newest checkpoint)", "positional": True}
    )
    output: str = field(metadata={"help": "folder to write the Hugging Face model to", "positional": True})
    teacher_tokenizer: str | None = field(
        default=None,
        metadata={
            "help": "the teacher's tokenizer (tokenizer.json, model folder or .gguf) shipped for <eot> placement "
            "(default: the teacher the training store names); a bytes student needs none (its chat template "
            "comes from the training store)"
        },
    )
    repo_id: str | None = field(
        default=None, metadata={"help": "Hub repo id to name in the model card's usage snippet"}
    )
    license: str = field(default=LICENSE, metadata={"help": "license for the model card metadata"})
    teacher: str | None = field(
        default=None, metadata={"help": "teacher name for the card (default: from the logit store)"}
    )
    data: str | None = field(
        default=None, metadata={"help": "training data description for the card (default: from the store)"}
    )


def export(config: ExportConfig) -> int:
    """Write a trained student as a Hugging Face model folder."""
    from students.release.export import export_student
    from students.release.trained_student import choose_checkpoint

    chosen = choose_checkpoint(Path(config.checkpoint))
    if chosen.unfinished:
        print(
            f"warning: the newest checkpoint {chosen.unfinished[-1]} is unfinished (no trainer_state.json): "
            f"exporting the previous one, step {chosen.step}",
            file=sys.stderr,
        )
    out = export_student(
        chosen.path,
        Path(config.output),
        teacher_tokenizer=config.teacher_tokenizer,
        repo_id=config.repo_id,
        license=config.license,
        teacher=config.teacher,
        data=config.data,
    )
    print(f"exported step {chosen.step} ({chosen.path}) to {out}")
    return 0
