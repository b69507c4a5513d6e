"""Start a new run from a trained student's weights (``train --init-from PATH``).

``PATH`` is a training output directory (its newest finished checkpoint), a checkpoint folder, or an
exported model folder (``config.json`` + ``model.safetensors``). Only the weights are taken: the
optimiser, the schedule, the step and byte counters and the data position start fresh, as in any
new run. The run's student settings must describe ``PATH``'s model: its architecture and stream are
checked before anything is written (:func:`check_source`), its sizes when the run's model is built
(:func:`load_initial_weights`), and a difference is refused in one line naming it. The run records
the folder it started from in ``run_info.json`` (``init_from``); a resumed run continues from its
own checkpoint, and a resume that names another ``--init-from`` than the one its run started from
is refused (:func:`require_same_start`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bytestream.stream_kind import StreamKind
from common.errors import UserError
from students.models.architectures import architecture_of_config
from students.training.checkpoints import (
    CHECKPOINTS,
    MODEL_CONFIG,
    RUN_INFO,
    TRAINER_STATE,
    latest_checkpoint,
    read_json,
    require_complete,
)

WEIGHTS = "model.safetensors"
# config.json keys that name how a folder was written, not the model: an export adds or changes them
NOT_THE_MODEL = {"transformers_version", "auto_map", "architectures", "torch_dtype", "dtype", "_name_or_path"}


def source_folder(path: str) -> Path:
    """The folder whose weights ``--init-from`` names: a checkpoint, the newest finished checkpoint
    of a training output directory, or an exported model folder."""
    given = Path(path)
    if (given / TRAINER_STATE).is_file():
        require_complete(given)
        return given
    if given.is_dir() and (given / CHECKPOINTS).is_dir():
        newest = latest_checkpoint(given)
        if newest is None:
            raise UserError(f"--init-from {path}: the training output directory has no finished checkpoint")
        return newest
    if (given / MODEL_CONFIG).is_file() and (given / WEIGHTS).is_file():
        return given
    raise UserError(
        f"--init-from {path} is neither a training output directory, a checkpoint nor an exported model folder "
        f"({MODEL_CONFIG} + {WEIGHTS})"
    )


def saved_config(source: Path) -> dict[str, Any]:
    saved = read_json(source / MODEL_CONFIG)
    if not isinstance(saved, dict):
        raise UserError(f"{source / MODEL_CONFIG} is not a model configuration: the file is damaged")
    return saved


def check_source(source: Path, architecture: str, stream: StreamKind, output_dir: Path) -> None:
    """Refuse, before the run writes anything, a source of another architecture or stream than the
    run's student, or one inside the run's own ``output_dir`` (a new run there replaces it)."""
    if output_dir.resolve() in source.resolve().parents:
        raise UserError(f"--init-from {source} is inside --output-dir {output_dir}: give the new run another directory")
    saved = saved_config(source)
    found = architecture_of_config(saved, source / MODEL_CONFIG).name
    if found != architecture:
        raise UserError(
            f"--init-from {source} holds a {found} student, and this run is --architecture {architecture}: "
            f"give --architecture {found} and its sizes"
        )
    saved_stream = StreamKind.of_config(saved)
    if saved_stream is not stream:
        raise UserError(
            f"--init-from {source} holds a student of the {saved_stream.shown} stream, and this run reads the "
            f"{stream.shown} stream (--stream {stream.value}, or its training stores'): train it on stores of its stream"
        )


def load_initial_weights(model, source: Path) -> None:
    """Copy ``source``'s weights into ``model`` (freshly built from the run's settings), refusing a
    model of other settings (sizes, heads, positions, alphabet) in one line naming them."""
    saved = saved_config(source)
    now = json.loads(model.config.to_json_string())
    changed = [
        key for key in sorted(set(saved) | set(now)) if key not in NOT_THE_MODEL and saved.get(key) != now.get(key)
    ]
    if changed:
        detail = ", ".join(f"{key}: {saved.get(key)!r} there, {now.get(key)!r} here" for key in changed[:6])
        raise UserError(
            f"--init-from {source} holds another model than this run's student settings ({detail}): "
            "give the flags it was trained with (--preset, sizes, --max-positions or --seq-len)"
        )
    loaded = architecture_of_config(saved, source / MODEL_CONFIG).load(source, saved)
    model.load_state_dict(loaded.state_dict())


def start_record(source: Path) -> dict[str, Any]:
    """What ``run_info.json`` records of the start: the folder and, for a checkpoint, its step."""
    step = require_complete(source).step if (source / TRAINER_STATE).is_file() else None
    return {"path": str(source.resolve()), "step": step}


def recorded_start(checkpoint: Path) -> dict[str, Any] | None:
    """The start a checkpoint's run recorded (None: it started from fresh weights)."""
    path = checkpoint / RUN_INFO
    return read_json(path).get("init_from") if path.is_file() else None


def require_same_start(checkpoint: Path, source: Path) -> None:
    """``--resume`` with ``--init-from``: the checkpoint's run must have started from ``source``;
    otherwise which weights the run goes on from would be ambiguous."""
    recorded = recorded_start(checkpoint)
    if recorded is None or recorded.get("path") != str(source.resolve()):
        started = f"from {recorded.get('path')}" if recorded else "from fresh weights"
        raise UserError(
            f"--resume {checkpoint} continues a run that started {started}, not --init-from {source}: "
            "drop --init-from to continue it, or give --overwrite (or another --output-dir) to start a new run from it"
        )
