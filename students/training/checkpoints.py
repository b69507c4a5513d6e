"""Checkpoints: save everything a run needs to continue exactly, find and load them.

``checkpoints/step-00001000/`` holds the accelerate state (model.safetensors, optimizer, RNG),
config.json, run_info.json, ``data_order.json`` (the settings that decide which batch comes
when), ``data_position_rank<r>.json`` (each rank's epoch and batches consumed in it) and
trainer_state.json, written last: it marks the checkpoint complete. A checkpoint is written as
``step-00001000.partial`` and renamed when complete, so a save that fails (a full disk) leaves the
newest complete checkpoint as it was and removes its partial files. A file of a checkpoint that
does not read (truncated, not JSON) is refused in one line naming it. :class:`CheckpointConfig`
says how often training saves one and how many it keeps (``--checkpoint-every``, ``--keep-checkpoints``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bytestream.stream_kind import StreamKind
from common.errors import UserError, first_line
from common.files import read_text, write_new
from configs.ranges import NON_NEGATIVE
from students.models.architecture import STATE_ERRORS
from students.models.architectures import architecture_of_config

CHECKPOINTS = "checkpoints"
METRICS = "metrics.jsonl"
RUN_INFO = "run_info.json"
ANSWERS = "on_policy_answers.jsonl"  # an on-policy run's logging steps: loss and the answers written
DATA_ORDER = "data_order.json"
TRAINER_STATE = "trainer_state.json"
MODEL_CONFIG = "config.json"
STEP_GLOB = "step-*[0-9]"  # a checkpoint's folder; not step-….partial, one being written


@dataclass
class CheckpointConfig:
    """How often training saves a checkpoint and how many of the newest it keeps."""

    every: int = field(
        default=1000,
        metadata={
            "flag": "checkpoint_every",
            "help": "save a checkpoint every N steps (0: only at the end)",
            "range": NON_NEGATIVE,
        },
    )
    keep: int = field(
        default=3,
        metadata={
            "flag": "keep_checkpoints",
            "help": "keep only the newest N checkpoints (0: keep all)",
            "range": NON_NEGATIVE,
        },
    )


@dataclass
class TrainerState:
    step: int = 0
    train_bytes: int = 0
    last_eval: dict[str, Any] | None = None


def checkpoint_dir(output_dir: Path, step: int) -> Path:
    return output_dir / CHECKPOINTS / f"step-{step:08d}"


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete checkpoint (one with trainer_state.json) under ``output_dir``."""
    complete = sorted((output_dir / CHECKPOINTS).glob(f"{STEP_GLOB}/{TRAINER_STATE}"))
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


def require_complete(checkpoint: Path) -> TrainerState:
    """The checkpoint's trainer state: its mark of completeness, which must read."""
    values = read_json(checkpoint / TRAINER_STATE)
    try:
        return TrainerState(**values)
    except TypeError:
        raise UserError(f"{checkpoint / TRAINER_STATE} is not a trainer state: the file is damaged") from None


def read_json(path: Path) -> Any:
    """A JSON file a run wrote; one that does not parse (truncated, edited) is a :class:`UserError` naming it."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not valid JSON ({exc}): the file is damaged") from None
    except RecursionError:
        raise UserError(f"{path} is not valid JSON (nested too deep): the file is damaged") from None


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    write_new(tmp, json.dumps(data, indent=2, sort_keys=True) + "\n")  # a link planted at the name is not followed
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
    accelerator,
    model,
    path: Path,
    state: TrainerState,
    position: dict,
    data_order: dict,
    run_info: dict,
) -> None:
    """Everything needed to continue exactly, written beside ``path`` and renamed to it when complete."""
    partial = path.with_name(path.name + ".partial")
    if accelerator.is_main_process:
        shutil.rmtree(partial, ignore_errors=True)
    accelerator.wait_for_everyone()
    try:
        with _tied_weights_expected(accelerator.unwrap_model(model)):
            accelerator.save_state(str(partial), safe_serialization=True)
        write_json(partial / f"data_position_rank{accelerator.process_index}.json", position)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            accelerator.unwrap_model(model).config.to_json_file(partial / MODEL_CONFIG)
            write_json(partial / DATA_ORDER, data_order)
            write_json(partial / RUN_INFO, run_info)
            write_json(partial / TRAINER_STATE, dataclasses.asdict(state))
    except STATE_ERRORS as exc:
        shutil.rmtree(partial, ignore_errors=True)
        newest = latest_checkpoint(path.parent.parent)
        kept = f"the newest complete checkpoint, {newest}, is kept" if newest else "no earlier checkpoint exists"
        raise UserError(f"cannot save checkpoint {path}, is the disk full? ({first_line(exc)}); {kept}") from None
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if path.exists():  # the same step saved again (a resume at its last step): the same state
            shutil.rmtree(path)
        partial.rename(path)
    accelerator.wait_for_everyone()


def prune_checkpoints(output_dir: Path, keep: int) -> None:
    if keep <= 0:
        return
    complete = sorted(p.parent for p in (output_dir / CHECKPOINTS).glob(f"{STEP_GLOB}/{TRAINER_STATE}"))
    for old in complete[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(accelerator, model, path: Path, data_order: dict) -> tuple[TrainerState, dict[str, int]]:
    """Restore the accelerate state; return the trainer state and this rank's data position.

    Refuses a checkpoint whose data order settings differ from ``data_order``, or whose model differs
    from ``model`` (another preset or size), naming them; and one whose files do not read.
    """
    if not (path / DATA_ORDER).is_file():
        raise UserError(f"cannot resume {path}: it has no {DATA_ORDER} (written by an older version); start a new run")
    saved = read_json(path / DATA_ORDER)
    changed = [key for key in sorted(set(saved) | set(data_order)) if saved.get(key) != data_order.get(key)]
    if changed:
        detail = ", ".join(f"{key}: checkpoint {saved.get(key)!r}, now {data_order.get(key)!r}" for key in changed)
        raise UserError(f"cannot resume {path}: the data order would change ({detail})")
    _require_same_model(path, accelerator.unwrap_model(model).config)
    state = require_complete(path)
    position = read_json(path / f"data_position_rank{accelerator.process_index}.json")
    try:
        accelerator.load_state(str(path))
    except STATE_ERRORS as exc:
        raise UserError(f"cannot resume {path}: its saved state does not load ({first_line(exc)})") from None
    return state, position


def _require_same_model(path: Path, config) -> None:
    """Refuse a checkpoint of another model configuration (its weights cannot load into this one)."""
    if not (path / MODEL_CONFIG).is_file():
        raise UserError(f"cannot resume {path}: it has no {MODEL_CONFIG}")
    saved, now = read_json(path / MODEL_CONFIG), json.loads(config.to_json_string())
    ignored = {"transformers_version"}
    changed = [key for key in sorted(set(saved) | set(now)) if key not in ignored and saved.get(key) != now.get(key)]
    if changed:
        detail = ", ".join(f"{key}: checkpoint {saved.get(key)!r}, now {now.get(key)!r}" for key in changed)
        raise UserError(f"cannot resume {path}: it holds another model ({detail}); give the run's own model settings")


def require_architecture(checkpoint: Path, architecture: str) -> None:
    """Refuse to resume ``checkpoint`` as another architecture than the one it was trained as."""
    config_file = Path(checkpoint) / MODEL_CONFIG
    saved = architecture_of_config(read_json(config_file), config_file).name
    if saved != architecture:
        raise UserError(
            f"cannot resume {checkpoint}: it is a {saved} student, and this run is --architecture {architecture}"
        )


def stream_of_checkpoint(checkpoint: Path) -> StreamKind:
    """The stream the student saved in ``checkpoint`` reads."""
    return StreamKind.of_config(read_json(Path(checkpoint) / MODEL_CONFIG))


def require_stream(checkpoint: Path, stream: StreamKind) -> None:
    """Refuse to resume ``checkpoint`` as a student of another stream than the one it was trained on."""
    saved = stream_of_checkpoint(checkpoint)
    if saved is not stream:
        raise UserError(
            f"cannot resume {checkpoint}: it is a student of the {saved.shown} stream, and this run reads the "
            f"{stream.shown} stream (--stream {stream.value}, or its training stores'): resume it on stores of "
            f"its stream"
        )


def keep_metrics_until(path: Path, step: int) -> None:
    """Drop the records of steps after ``step`` (written by a run killed before its next checkpoint)."""
    if not path.is_file() and not path.is_symlink():
        return
    lines = read_text(path).splitlines(keepends=True)
    kept = [line for line in lines if json.loads(line)["step"] <= step]
    if len(kept) != len(lines):
        tmp = path.with_suffix(".tmp")
        write_new(tmp, "".join(kept))
        tmp.replace(path)
