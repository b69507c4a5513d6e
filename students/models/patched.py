"""The patched student: the hierarchical model, patched by the teacher's tokens, of :mod:`students.models.patched_model`
(docs/DESIGN.md, "The patched student"). Its global model of each size preset is the flat preset
of the same name; the local encoder and decoder are small (:data:`LOCAL_PRESETS`).

An export ships the model's file as ``modeling_bytedistill_patched.py`` and points ``config.json``
at it, for ``trust_remote_code=True``; this library registers its own class with
``AutoModelForCausalLM`` instead and never runs that file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bytestream.stream_kind import StreamKind
from common.errors import UserError
from students.models.architecture import Architecture, load_weights
from students.models.cost import (
    StreamRates,
    StudentCost,
    block_activation_floats,
    block_weights,
    split_parameters,
    stack_parameters,
)
from students.models.llama import DEFAULT_PRESET, PRESETS, reserved_fields, shape_sizes

if TYPE_CHECKING:  # torch is imported where it runs: `bytedistill train --help` loads none
    from students.models.patched_model import PatchedStudentConfig

MODELING_FILE = "modeling_bytedistill_patched.py"
PATCHES_PER_SYMBOL = 0.2  # global steps per symbol assumed by the memory estimate (a teacher token: about 4-5 symbols)


@dataclass(frozen=True)
class LocalPreset:
    hidden_size: int
    num_heads: int
    intermediate_size: int
    layers: int  # encoder layers = decoder layers
    window: int


# The global model of each preset is the flat preset of the same name; the local model is small.
LOCAL_PRESETS: dict[str, LocalPreset] = {
    "micro": LocalPreset(hidden_size=32, num_heads=1, intermediate_size=96, layers=1, window=64),
    "tiny": LocalPreset(hidden_size=64, num_heads=2, intermediate_size=192, layers=1, window=64),
    "small": LocalPreset(hidden_size=128, num_heads=4, intermediate_size=384, layers=1, window=64),
    "base": LocalPreset(hidden_size=192, num_heads=4, intermediate_size=512, layers=2, window=64),
    "medium": LocalPreset(hidden_size=256, num_heads=4, intermediate_size=768, layers=2, window=128),
    "large": LocalPreset(hidden_size=384, num_heads=6, intermediate_size=1024, layers=2, window=128),
    "xl": LocalPreset(hidden_size=512, num_heads=8, intermediate_size=1536, layers=2, window=128),
}


def patched_config(
    preset: str = DEFAULT_PRESET,
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
    stream: StreamKind = StreamKind.EOT,
    reserved: tuple[str, ...] = (),
) -> PatchedStudentConfig:
    """A :class:`PatchedStudentConfig` for the named preset over ``stream``: ``hidden_size`` …
    ``intermediate_size`` size the global model, ``local_*`` the local encoder and decoder."""
    from students.models.patched_model import PatchedStudentConfig

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
            byte_stream=stream.value,
            **reserved_fields(stream, reserved),
        )
    except ValueError as exc:
        raise UserError(f"patched student: {exc}") from exc


@dataclass(frozen=True)
class PatchedCost(StudentCost):
    """The global model runs once per closed patch, the local layers once per symbol in a window."""

    per_patch = True

    def forward_flops_per_symbol(self, rates: StreamRates, keys_global: float, keys_local: float) -> float:
        """Forward FLOPs per symbol when the large model reads ``keys_global`` keys and local layers ``keys_local``."""
        attention_local = 4 * self.local_width * self.local_layers * keys_local
        attention_global = 4 * self.global_width * self.global_layers * keys_global
        steps = rates.patches_per_symbol
        return self.symbol_flops + attention_local + steps * (self.patch_flops + attention_global)

    def train_flops_per_symbol(self, rates: StreamRates, seq_len: int) -> float:
        patches = seq_len * rates.patches_per_symbol + 1
        local = sum(min(i + 1, self.local_window) for i in range(seq_len)) / seq_len
        return 3 * self.forward_flops_per_symbol(rates, (patches + 1) / 2, local)

    def generate_flops_per_symbol(self, rates: StreamRates, context: int) -> float:
        return self.forward_flops_per_symbol(rates, context * rates.patches_per_symbol, min(context, self.local_window))

    def global_steps_per_byte(self, rates: StreamRates) -> float:
        return rates.patches_per_byte


class PatchedArchitecture(Architecture):
    name = "patched"
    model_type = "bytedistill_patched"  # PatchedStudentConfig.model_type (tests/test_architectures.py)
    summary = "a global model over the teacher's tokens with a local byte encoder and decoder"
    card_name = (
        "patched hierarchical architecture: a global model over the teacher's tokens between a local byte "
        "encoder and decoder"
    )
    card_loading = "AutoModelForCausalLM.from_pretrained(repo, trust_remote_code=True)  # the patched student"
    card_code = (
        f"The model (`{MODELING_FILE}`, importing only `torch`\nand `transformers`) "
        "loads with `AutoModelForCausalLM` and `trust_remote_code=True` too."
    )

    def build(self, shape, *, seq_len: int, seed: int, reserved: tuple[str, ...] = ()):
        import torch

        from students.models.patched_model import PatchedStudent

        if shape.num_kv_heads is not None:
            raise UserError("--num-kv-heads applies to the flat student only")
        model_config = patched_config(
            shape.preset,
            hidden_size=shape.hidden_size,
            num_layers=shape.num_layers,
            num_heads=shape.num_heads,
            intermediate_size=shape.intermediate_size,
            local_hidden_size=shape.local_hidden_size,
            local_layers=shape.local_layers,
            local_window=shape.local_window,
            max_positions=shape.max_positions or seq_len,
            rope_theta=shape.rope_theta,
            stream=shape.stream_kind,
            reserved=reserved,
        )
        torch.manual_seed(seed)
        return PatchedStudent(model_config)

    def refuse_stream(self, stream: StreamKind) -> None:
        """The bytes stream holds no token end to close a patch at."""
        if stream is StreamKind.BYTES:
            raise UserError(
                "the patched student closes its patches at the teacher's token ends, which the bytes stream does "
                "not hold: train a flat student (--architecture flat) on it, or give --stream fused"
            )

    def load(self, checkpoint: Path, saved_config: dict[str, Any]):
        from students.models.patched_model import PatchedStudent, PatchedStudentConfig

        model = PatchedStudent(PatchedStudentConfig.from_json_file(str(Path(checkpoint) / "config.json")))
        load_weights(model, Path(checkpoint) / "model.safetensors", self.name)
        return model.eval()

    def register_auto_classes(self) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        from students.models.patched_model import PatchedStudent, PatchedStudentConfig

        AutoConfig.register(PatchedStudentConfig.model_type, PatchedStudentConfig, exist_ok=True)
        AutoModelForCausalLM.register(PatchedStudentConfig, PatchedStudent, exist_ok=True)

    def auto_map(self) -> dict[str, str]:
        """The exported ``config.json``'s ``auto_map``: its shipped modeling file (for ``trust_remote_code=True``)."""
        module = MODELING_FILE.removesuffix(".py")
        return {
            "AutoConfig": f"{module}.PatchedStudentConfig",
            "AutoModelForCausalLM": f"{module}.PatchedStudent",
        }

    def export_files(self, model, folder: Path) -> None:
        """Ship the modeling file and point ``config.json`` at it."""
        import shutil

        from students.models import patched_model

        shutil.copyfile(patched_model.__file__, Path(folder) / MODELING_FILE)
        model.config.auto_map = self.auto_map()

    def card_sizes(self, config) -> str:
        c = config
        return (
            f"global {c.global_layers} layers × {c.global_hidden_size} wide ({c.global_heads} heads); "
            f"local encoder {c.encoder_layers} and decoder {c.decoder_layers} layers × {c.local_hidden_size} wide, "
            f"window {c.local_window} symbols; patches pooled by {c.patch_pooling}"
        )

    def cost(self, model) -> PatchedCost:
        config = model.config
        dl, dg, vocab = config.local_hidden_size, config.global_hidden_size, config.vocab_size
        local_layers = config.encoder_layers + config.decoder_layers
        local_block = block_weights(dl, config.local_intermediate_size, 2 * dl)
        global_block = block_weights(dg, config.global_intermediate_size, 2 * dg)
        return PatchedCost(
            self.name,
            *split_parameters(model, ("global_", "patch_")),
            symbol_flops=2 * (local_layers * local_block + dg * dl + dl * vocab),  # + down-projection and head
            patch_flops=2 * (config.global_layers * global_block + dl * dg),  # + up-projection
            global_width=dg,
            global_layers=config.global_layers,
            kv_width=2 * dg,
            local_width=dl,
            local_layers=local_layers,
            local_window=config.local_window,
        )

    def memory_floats(self, shape, *, batch_size: int, seq_len: int, alphabet: int) -> tuple[int, int]:
        """The global blocks, the local encoder's and decoder's, the embedding, head and the projections
        between the two widths; the global layers keep activations once a patch, the local ones every symbol."""
        sizes, local = shape_sizes(shape), LOCAL_PRESETS[shape.preset]
        width, layers, mlp = sizes.hidden_size, sizes.num_layers, sizes.intermediate_size
        local_width = shape.local_hidden_size or local.hidden_size
        local_layers = 2 * (local.layers if shape.local_layers is None else shape.local_layers)
        local_mlp = 3 * local_width if shape.local_hidden_size else local.intermediate_size
        parameters = (
            stack_parameters(width, layers, 2 * width, mlp, 0)
            + stack_parameters(local_width, local_layers, 2 * local_width, local_mlp, alphabet)
            + 2 * width * local_width
        )
        symbols = batch_size * seq_len
        patches = max(1, int(symbols * PATCHES_PER_SYMBOL))
        activations = block_activation_floats(patches, layers, width, mlp) + block_activation_floats(
            symbols, local_layers, local_width, local_mlp
        )
        return parameters, activations


PATCHED = PatchedArchitecture()
