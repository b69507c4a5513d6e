"""The default student: a plain ``transformers`` Llama over the stream's alphabet (docs/DESIGN.md,
"Loss"): the 260 symbols of the ``<eot>`` stream, or the 515 of the fused one.

Nothing custom: the config is a stock :class:`~transformers.LlamaConfig`, so
``AutoModelForCausalLM.from_pretrained(folder)`` loads an exported student without
``trust_remote_code``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bytestream.stream_kind import StreamKind
from common.errors import UserError

if TYPE_CHECKING:  # transformers is imported where it runs: `bytedistill train --help` loads none
    from transformers import LlamaConfig, LlamaForCausalLM


@dataclass(frozen=True)
class SizePreset:
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int


# Rough parameter counts are for the default 2048 positions and tied embeddings.
PRESETS: dict[str, SizePreset] = {
    "micro": SizePreset(hidden_size=64, num_layers=4, num_heads=2, intermediate_size=192),  # ~0.25M
    "tiny": SizePreset(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=384),  # ~0.8M
    "small": SizePreset(hidden_size=256, num_layers=6, num_heads=8, intermediate_size=768),  # ~4.8M
    "base": SizePreset(hidden_size=512, num_layers=8, num_heads=8, intermediate_size=1536),  # ~25M
    "medium": SizePreset(hidden_size=768, num_layers=14, num_heads=12, intermediate_size=2560),  # ~100M
    "large": SizePreset(hidden_size=1280, num_layers=20, num_heads=20, intermediate_size=3584),  # ~400M
    "xl": SizePreset(hidden_size=2048, num_layers=20, num_heads=16, intermediate_size=5632),  # ~1B
}
# the best size at every budget of benchmarks/budget.py for a CPU-sized run (README, "Students and presets")
DEFAULT_PRESET = "micro"


def shape_sizes(shape) -> SizePreset:
    """The sizes of a :class:`~students.models.shape.StudentShape`: its preset's, with any it overrides."""
    base = PRESETS[shape.preset]
    return SizePreset(
        hidden_size=shape.hidden_size or base.hidden_size,
        num_layers=shape.num_layers or base.num_layers,
        num_heads=shape.num_heads or base.num_heads,
        intermediate_size=shape.intermediate_size or base.intermediate_size,
    )


def student_config(
    preset: str = DEFAULT_PRESET,
    *,
    hidden_size: int | None = None,
    num_layers: int | None = None,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_positions: int = 2048,
    rope_theta: float = 10000.0,
    tie_embeddings: bool = True,
    stream: StreamKind = StreamKind.EOT,
    reserved: tuple[str, ...] = (),
) -> LlamaConfig:
    """A :class:`LlamaConfig` for the named preset over ``stream``'s alphabet, with any field
    overridden. A fused student's config also says ``byte_stream="fused"``
    (:meth:`StreamKind.of_config`); an ``<eot>`` one is the stock config it always was."""
    from transformers import LlamaConfig

    if preset not in PRESETS:
        raise UserError(f"unknown student preset {preset!r}; choose one of {', '.join(PRESETS)}")
    base = PRESETS[preset]
    hidden = hidden_size or base.hidden_size
    heads = num_heads or base.num_heads
    if hidden % heads:
        raise UserError(f"student hidden size {hidden} is not divisible by its {heads} attention heads")
    kv_heads = num_kv_heads or heads
    if heads % kv_heads:
        raise UserError(f"student attention heads {heads} are not divisible by {kv_heads} key/value heads")
    return LlamaConfig(
        **reserved_fields(stream, reserved),
        hidden_size=hidden,
        num_hidden_layers=num_layers or base.num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate_size or base.intermediate_size,
        max_position_embeddings=max_positions,
        rope_theta=rope_theta,
        bos_token_id=stream.bos,
        eos_token_id=stream.eos,
        pad_token_id=stream.pad,
        tie_word_embeddings=tie_embeddings,
        **({} if stream is StreamKind.EOT else {"byte_stream": stream.value}),
    )


def reserved_fields(stream: StreamKind, reserved: tuple[str, ...] = ()) -> dict:
    """A student config's ``vocab_size`` (the stream's alphabet, then one symbol per reserved text:
    the teacher's chat specials) and, when there are reserved symbols, their texts in order
    (``reserved_symbols``; a plain student's config has no such key)."""
    fields = {"vocab_size": stream.alphabet_size + len(reserved)}
    if reserved:
        fields["reserved_symbols"] = list(reserved)
    return fields


def build_student(config: LlamaConfig, seed: int | None = None) -> LlamaForCausalLM:
    """A freshly initialised student (deterministic when ``seed`` is given)."""
    from transformers import LlamaForCausalLM

    if seed is not None:
        import torch

        torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def count_parameters(model) -> int:
    """Distinct trainable parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
