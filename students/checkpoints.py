"""Checkpoints: save everything a run needs to continue exactly, find and load them.

``checkpoints/step-00001000/`` holds the accelerate state (model.safetensors, optimizer, RNG),
config.json, run_info.json, ``data_order.json`` (the settings that decide which batch comes
when), ``data_position_rank<r>.json`` (each rank's epoch and batches consumed in it) and
trainer_state.json, written last: it marks the checkpoint complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distill.errors import UserError

DATA_ORDER = "data_order.json"
TRAINER_STATE = "trainer_state.json"


@dataclass
class TrainerState:
    step: int = 0
    train_bytes: int = 0
    last_eval: dict[str, Any] | None = None


def checkpoint_dir(output_dir: Path, step: int) -> Path:
    return output_dir / "checkpoints" / f"step-{step:08d}"


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete checkpoint (one with trainer_state.json) under ``output_dir``."""
    complete = sorted((output_dir / "checkpoints").glob(f"step-*/{TRAINER_STATE}"))
    return complete[-1].parent if complete else None


def resolve_resume(resume: str | None, output_dir: Path) -> Path | None:
    """The checkpoint ``--resume`` names: ``latest`` (None if there is none yet) or a directory."""
    if resume is None:
        return None
    if resume == "latest":
        return latest_checkpoint(output_dir)
    path = Path(resume)
    if not (path / TRAINER_STATE).is_file():
        raise UserError(f"cannot resume: {path} is not a complete checkpoint (no {TRAINER_STATE})")
    return path


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


class _DropTiedWeightWarning(logging.Filter):
    """accelerate warns when safetensors saving drops a tensor that shares memory with another;
    for the output layer tied to the embeddings that is the intended layout (``from_pretrained``
    and ``load_student`` tie it back), so that one message is dropped, any other is kept."""

    def __init__(self, tied: set[str]):
        super().__init__()
        self.expected = f"Removed shared tensor {tied} while saving"

    def filter(self, record: logging.LogRecord) -> bool:
        return self.expected not in record.getMessage()


@contextlib.contextmanager
def _tied_weights_expected(model):
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    logger = logging.getLogger("accelerate.utils.other")
    drop = _DropTiedWeightWarning(tied)
    if tied:
        logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def save_checkpoint(
    accelerator, model, path: Path, state: TrainerState, position: dict, data_order: dict, run_info: dict
) -> None:
    """Everything needed to continue exactly; trainer_state.json goes last."""
    with _tied_weights_expected(accelerator.unwrap_model(model)):
        accelerator.save_state(str(path), safe_serialization=True)
    write_json(path / f"data_position_rank{accelerator.process_index}.json", position)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).config.to_json_file(path / "config.json")
        write_json(path / DATA_ORDER, data_order)
        write_json(path / "run_info.json", run_info)
        write_json(path / TRAINER_STATE, dataclasses.asdict(state))
    accelerator.wait_for_everyone()


def prune_checkpoints(output_dir: Path, keep: int) -> None:
    if keep <= 0:
        return
    complete = sorted(p.parent for p in (output_dir / "checkpoints").glob(f"step-*/{TRAINER_STATE}"))
    for old in complete[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(accelerator, path: Path, data_order: dict) -> tuple[TrainerState, dict[str, int]]:
    """Restore the accelerate state; return the trainer state and this rank's data position.

    Refuses a checkpoint whose data order settings differ from ``data_order``, naming them.
    """
    if not (path / DATA_ORDER).is_file():
        raise UserError(f"cannot resume {path}: it has no {DATA_ORDER} (written by an older version); start a new run")
    saved = json.loads((path / DATA_ORDER).read_text(encoding="utf-8"))
    changed = [key for key in sorted(set(saved) | set(data_order)) if saved.get(key) != data_order.get(key)]
    if changed:
        detail = ", ".join(f"{key}: checkpoint {saved.get(key)!r}, now {data_order.get(key)!r}" for key in changed)
        raise UserError(f"cannot resume {path}: the data order would change ({detail})")
    accelerator.load_state(str(path))
    state = TrainerState(**json.loads((path / TRAINER_STATE).read_text(encoding="utf-8")))
    position = json.loads((path / f"data_position_rank{accelerator.process_index}.json").read_text(encoding="utf-8"))
    return state, position


def keep_metrics_until(path: Path, step: int) -> None:
    """Drop the records of steps after ``step`` (written by a run killed before its next checkpoint)."""
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if json.loads(line)["step"] <= step]
    if len(kept) != len(lines):
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(kept), encoding="utf-8")
        tmp.replace(path)
