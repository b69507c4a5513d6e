"""The trained student an export reads: a checkpoint directory itself, or the newest finished
checkpoint of a training output directory; the student in it (whatever its architecture,
:mod:`students.models.architectures`), its ``run_info.json`` and the context it was trained on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import UserError
from students.models.architectures import architecture_of_config
from students.training.checkpoints import TRAINER_STATE, latest_checkpoint, read_json, require_complete


@dataclass(frozen=True)
class ChosenCheckpoint:
    path: Path
    step: int
    unfinished: list[Path]  # newer checkpoints passed over: they have no trainer_state.json (a run stopped mid-save)


def choose_checkpoint(path: Path) -> ChosenCheckpoint:
    """A checkpoint directory itself, or the newest finished checkpoint of a training output directory."""
    path = Path(path)
    if (path / TRAINER_STATE).is_file():
        return ChosenCheckpoint(path, require_complete(path).step, [])
    started = sorted(p for p in (path / "checkpoints").glob("step-*") if p.is_dir()) if path.is_dir() else []
    found = latest_checkpoint(path) if path.is_dir() else None
    unfinished = [p for p in started if not (p / TRAINER_STATE).is_file() and (found is None or p.name > found.name)]
    if found is not None:
        return ChosenCheckpoint(found, require_complete(found).step, unfinished)
    if unfinished:
        raise UserError(f"{path} has no finished checkpoint ({unfinished[-1].name} has no {TRAINER_STATE})")
    raise UserError(f"{path} is neither a training checkpoint nor an output directory with checkpoints")


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint directory itself, or the newest finished checkpoint of a training output directory."""
    return choose_checkpoint(path).path


def load_student(checkpoint: Path):
    """The student saved in a trainer checkpoint (config.json + model.safetensors), in eval mode."""
    config_file, weights_file = checkpoint / "config.json", checkpoint / "model.safetensors"
    for needed in (config_file, weights_file):
        if not needed.is_file():
            raise UserError(f"checkpoint {checkpoint} lacks {needed.name}")
    saved = read_json(config_file)
    return architecture_of_config(saved, config_file).load(checkpoint, saved)


def read_run_info(checkpoint: Path) -> dict[str, Any]:
    path = checkpoint / "run_info.json"
    return read_json(path) if path.is_file() else {}


def trained_context(model, info: dict[str, Any]) -> int:
    """Symbols per training sequence: the most positions the student has seen."""
    seq_len = info.get("config", {}).get("seq_len")
    return min(int(seq_len), model.config.max_position_embeddings) if seq_len else model.config.max_position_embeddings
