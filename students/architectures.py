"""The two student architectures, chosen at training time (``train --architecture``): ``flat``, a
stock Llama over symbols (:mod:`students.model`, no remote code), and ``patched``, the
``<eot>``-patched hierarchical student (:mod:`students.patched_model`). Both take the same size
presets by name; this module builds either from the training config, tells a checkpoint's
architecture from its ``config.json`` (``model_type``) and refuses to mix them.

Importing it registers the patched student with ``AutoConfig`` / ``AutoModelForCausalLM``, so the
library loads exported patched folders with its own class and no remote code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoConfig, AutoModelForCausalLM

from distill.errors import UserError
from students.model import PRESETS, build_student, student_config
from students.patched_model import PatchedStudent, PatchedStudentConfig

ARCHITECTURES = ("flat", "patched")
MODEL_TYPES = {"llama": "flat", PatchedStudentConfig.model_type: "patched"}
MODELING_FILE = "modeling_bytedistill_patched.py"

AutoConfig.register(PatchedStudentConfig.model_type, PatchedStudentConfig, exist_ok=True)
AutoModelForCausalLM.register(PatchedStudentConfig, PatchedStudent, exist_ok=True)


@dataclass(frozen=True)
class LocalPreset:
    hidden_size: int
    num_heads: int
    intermediate_size: int
    layers: int  # encoder layers = decoder layers
    window: int


# The global model of each preset is the flat preset of the same name; the local model is small.
LOCAL_PRESETS: dict[str, LocalPreset] = {
    "tiny": LocalPreset(hidden_size=64, num_heads=2, intermediate_size=192, layers=1, window=64),
    "small": LocalPreset(hidden_size=128, num_heads=4, intermediate_size=384, layers=1, window=64),
    "base": LocalPreset(hidden_size=192, num_heads=4, intermediate_size=512, layers=2, window=64),
    "medium": LocalPreset(hidden_size=256, num_heads=4, intermediate_size=768, layers=2, window=128),
    "large": LocalPreset(hidden_size=384, num_heads=6, intermediate_size=1024, layers=2, window=128),
    "xl": LocalPreset(hidden_size=512, num_heads=8, intermediate_size=1536, layers=2, window=128),
}


def patched_config(
    preset: str = "small",
    *,
    hidden_size: int | None = None,
    num_layers: int | None = None,
    num_heads: int | None = None,
    intermediate_size: int | None = None,
    local_hidden_size: int | None = None,
    local_heads: int | None = None,
    local_layers: int | None = None,
    local_window: int | None = None,
    max_positions: int = 2048,
    rope_theta: float = 10000.0,
) -> PatchedStudentConfig:
    """A :class:`PatchedStudentConfig` for the named preset: ``hidden_size`` … ``intermediate_size``
    size the global model, ``local_*`` the local encoder and decoder."""
    if preset not in PRESETS:
        raise UserError(f"unknown student preset {preset!r}; choose one of {', '.join(PRESETS)}")
    base, local = PRESETS[preset], LOCAL_PRESETS[preset]
    local_hidden = local_hidden_size or local.hidden_size
    try:
        return PatchedStudentConfig(
            local_hidden_size=local_hidden,
            local_heads=local_heads or local.num_heads,
            local_intermediate_size=3 * local_hidden if local_hidden_size else local.intermediate_size,
            encoder_layers=local.layers if local_layers is None else local_layers,
            decoder_layers=local.layers if local_layers is None else local_layers,
            local_window=local_window or local.window,
            global_hidden_size=hidden_size or base.hidden_size,
            global_layers=num_layers or base.num_layers,
            global_heads=num_heads or base.num_heads,
            global_intermediate_size=intermediate_size or base.intermediate_size,
            max_position_embeddings=max_positions,
            rope_theta=rope_theta,
        )
    except ValueError as exc:
        raise UserError(f"patched student: {exc}") from exc


def build_from_train_config(config) -> object:
    """A freshly initialised student of ``config.architecture`` (seeded by ``config.seed``)."""
    sizes = {
        "hidden_size": config.hidden_size,
        "num_layers": config.num_layers,
        "num_heads": config.num_heads,
        "intermediate_size": config.intermediate_size,
        "max_positions": config.max_positions or config.seq_len,
        "rope_theta": config.rope_theta,
    }
    if config.architecture == "flat":
        model_config = student_config(config.preset, num_kv_heads=config.num_kv_heads, **sizes)
        return build_student(model_config, seed=config.seed)
    if config.num_kv_heads is not None:
        raise UserError("--num-kv-heads applies to the flat student only")
    model_config = patched_config(
        config.preset,
        local_hidden_size=config.local_hidden_size,
        local_layers=config.local_layers,
        local_window=config.local_window,
        **sizes,
    )
    import torch

    torch.manual_seed(config.seed)
    return PatchedStudent(model_config)


def architecture_of(config_file: Path) -> str:
    """``flat`` or ``patched``: what a checkpoint's or folder's ``config.json`` holds."""
    model_type = json.loads(Path(config_file).read_text(encoding="utf-8")).get("model_type")
    if model_type not in MODEL_TYPES:
        raise UserError(f"{config_file} holds a {model_type!r} model, not a bytedistill student")
    return MODEL_TYPES[model_type]


def require_architecture(checkpoint: Path, architecture: str) -> None:
    """Refuse to resume ``checkpoint`` as another architecture than the one it was trained as."""
    saved = architecture_of(Path(checkpoint) / "config.json")
    if saved != architecture:
        raise UserError(
            f"cannot resume {checkpoint}: it is a {saved} student, and this run is --architecture {architecture}"
        )


def load_patched(checkpoint: Path) -> PatchedStudent:
    """The patched student saved in a trainer checkpoint, in eval mode; weights must match exactly."""
    from safetensors.torch import load_file

    weights_file = Path(checkpoint) / "model.safetensors"
    if not weights_file.is_file():
        raise UserError(f"checkpoint {checkpoint} lacks {weights_file.name}")
    model = PatchedStudent(PatchedStudentConfig.from_json_file(str(Path(checkpoint) / "config.json")))
    missing, unexpected = model.load_state_dict(load_file(str(weights_file)), strict=False)
    if missing or unexpected:
        raise UserError(
            f"{weights_file} does not match its config (a patched student): missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}"
        )
    return model.eval()
