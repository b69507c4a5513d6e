"""The two student architectures, chosen at training time (``train --architecture``): ``flat``, a
stock Llama over symbols (:mod:`students.model`, no remote code), and ``patched``, the
``<eot>``-patched hierarchical student (:mod:`students.patched_model`). Both take the same size
presets by name; this module declares the student's shape as training sets it
(:class:`StudentShape`, the ``train`` flags ``--architecture`` … ``--local-window``), builds
either from it, tells a checkpoint's architecture from its ``config.json`` (``model_type``) and
refuses to mix them.

Importing it registers the patched student with ``AutoConfig`` / ``AutoModelForCausalLM``, so the
library loads exported patched folders with its own class and no remote code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers import AutoConfig, AutoModelForCausalLM

from bytestream.alphabet import BOS
from bytestream.errors import UserError, first_line
from students.checkpoints import STATE_ERRORS, read_json
from students.model import PRESETS, build_student, student_config
from students.patched_model import PatchedStudent, PatchedStudentConfig
from students.shape import ARCHITECTURES, StudentShape  # noqa: F401 (re-exported)

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


def build_student_of_shape(shape: StudentShape, *, seq_len: int, seed: int) -> object:
    """A freshly initialised student of ``shape``, seeded by ``seed``; its positions are
    ``shape.max_positions``, else ``seq_len``."""
    sizes = {
        "hidden_size": shape.hidden_size,
        "num_layers": shape.num_layers,
        "num_heads": shape.num_heads,
        "intermediate_size": shape.intermediate_size,
        "max_positions": shape.max_positions or seq_len,
        "rope_theta": shape.rope_theta,
    }
    if shape.architecture == "flat":
        model_config = student_config(shape.preset, num_kv_heads=shape.num_kv_heads, **sizes)
        return build_student(model_config, seed=seed)
    if shape.num_kv_heads is not None:
        raise UserError("--num-kv-heads applies to the flat student only")
    model_config = patched_config(
        shape.preset,
        local_hidden_size=shape.local_hidden_size,
        local_layers=shape.local_layers,
        local_window=shape.local_window,
        **sizes,
    )
    import torch

    torch.manual_seed(seed)
    return PatchedStudent(model_config)


def architecture_of(config_file: Path) -> str:
    """``flat`` or ``patched``: what a checkpoint's or folder's ``config.json`` holds."""
    saved = read_json(Path(config_file))
    model_type = saved.get("model_type") if isinstance(saved, dict) else None
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
    weights_file = Path(checkpoint) / "model.safetensors"
    if not weights_file.is_file():
        raise UserError(f"checkpoint {checkpoint} lacks {weights_file.name}")
    model = PatchedStudent(PatchedStudentConfig.from_json_file(str(Path(checkpoint) / "config.json")))
    load_weights(model, weights_file, "patched")
    return model.eval()


def load_weights(model, weights_file: Path, architecture: str, tied: frozenset[str] = frozenset()) -> None:
    """Load a checkpoint's safetensors into ``model``; a damaged file or weights that do not match the
    config exactly (``tied``: names the model fills itself) is a UserError naming the file."""
    from safetensors.torch import load_file

    try:
        weights = load_file(str(weights_file))
    except STATE_ERRORS as exc:
        raise UserError(f"{weights_file} does not read ({first_line(exc)}): the file is damaged") from None
    problem = f"{weights_file} does not match its config (a {architecture} student)"
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as exc:  # a tensor of another shape
        raise UserError(f"{problem}: {str(exc).strip().splitlines()[-1].strip()}") from exc
    if set(missing) - tied or unexpected:
        raise UserError(f"{problem}: missing {missing[:3]}, unexpected {unexpected[:3]}")


def architecture_of_model(model) -> str:
    return MODEL_TYPES[model.config.model_type]


def prepare_export(model, output: Path) -> None:
    """Ship a patched student's modeling file and point ``config.json`` at it (flat: nothing)."""
    if architecture_of_model(model) != "patched":
        return
    import shutil

    from students import patched_model

    shutil.copyfile(patched_model.__file__, Path(output) / MODELING_FILE)
    model.config.auto_map = patched_auto_map()


def patched_auto_map() -> dict[str, str]:
    """The ``auto_map`` of an exported patched student's ``config.json``: its shipped modeling file.
    This library never runs that file; it loads the folder with its own registered class."""
    module = MODELING_FILE.removesuffix(".py")
    return {
        "AutoConfig": f"{module}.{PatchedStudentConfig.__name__}",
        "AutoModelForCausalLM": f"{module}.{PatchedStudent.__name__}",
    }


def card_section(model, info: dict) -> str:
    """The model card's "Architecture" section: sizes, FLOPs and large-model steps per byte, measured speed."""
    import torch

    from students.cost import StreamRates, student_cost
    from students.speed import generation_speed

    cost = student_cost(model)
    rates = info.get("data", {}).get("rates")
    context = model.config.max_position_embeddings
    if architecture_of_model(model) == "patched":
        c = model.config
        sizes = (
            f"global {c.global_layers} layers × {c.global_hidden_size} wide ({c.global_heads} heads); "
            f"local encoder {c.encoder_layers} and decoder {c.decoder_layers} layers × {c.local_hidden_size} wide, "
            f"window {c.local_window} symbols; patches pooled by {c.patch_pooling}"
        )
    else:
        c = model.config
        sizes = f"{c.num_hidden_layers} layers × {c.hidden_size} wide ({c.num_attention_heads} heads)"
    rows = [
        ("architecture", architecture_of_model(model)),
        ("sizes", sizes),
        ("parameters", f"{cost.parameters:,} (global {cost.global_parameters:,}, local {cost.local_parameters:,})"),
    ]
    if rates:
        r = StreamRates(**rates)
        rows += [
            ("training FLOPs per text byte", f"{cost.train_flops_per_symbol(r, context) * r.symbols_per_byte:.3g}"),
            (
                f"generation FLOPs per text byte (context {context})",
                f"{cost.generate_flops_per_symbol(r, context) * r.symbols_per_byte:.3g}",
            ),
            ("large-model steps per text byte", f"{cost.global_steps_per_byte(r):.3f}"),
            ("KV-cache bytes per text byte of context", f"{cost.kv_bytes_per_byte(r):,.0f}"),
        ]
    speed = generation_speed(model, torch.full((1, 1), BOS), new_symbols=min(128, context - 1))
    threads = torch.get_num_threads()
    cpu = f"CPU with {threads} thread{'' if threads == 1 else 's'}"
    rows.append(
        (
            "generation speed (measured at export)",
            f"{speed.symbols_per_s:,.0f} symbols/s, batch 1, {cpu}, caches on",
        )
    )
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    return f"## Architecture\n\n| | |\n|---|---|\n{table}\n\n"
