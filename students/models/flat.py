"""The flat student: a stock Llama over symbols (:mod:`students.models.llama`), exported with no code of
its own, so that ``AutoModelForCausalLM.from_pretrained(folder)`` loads it without remote code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bytestream.stream_kind import StreamKind
from students.models.architecture import Architecture, load_weights
from students.models.cost import (
    StreamRates,
    StudentCost,
    block_activation_floats,
    block_weights,
    split_parameters,
    stack_parameters,
)
from students.models.llama import build_student, shape_sizes, student_config


@dataclass(frozen=True)
class FlatCost(StudentCost):
    """The large model is the whole model: it runs once per symbol and reads every earlier one."""

    def forward_flops_per_symbol(self, keys: float) -> float:
        """Forward FLOPs per symbol when the model reads ``keys`` keys."""
        return self.symbol_flops + 4 * self.global_width * self.global_layers * keys

    def train_flops_per_symbol(self, rates: StreamRates, seq_len: int) -> float:
        return 3 * self.forward_flops_per_symbol((seq_len + 1) / 2)

    def generate_flops_per_symbol(self, rates: StreamRates, context: int) -> float:
        return self.forward_flops_per_symbol(context)

    def global_steps_per_byte(self, rates: StreamRates) -> float:
        return rates.symbols_per_byte


class FlatArchitecture(Architecture):
    name = "flat"
    model_type = "llama"
    summary = "a Llama over symbols"
    card_name = "Llama architecture"
    card_loading = "AutoModelForCausalLM.from_pretrained(repo)  # a stock Llama: no remote code"
    card_code = "The model itself loads\nwith `AutoModelForCausalLM` and no remote code."

    def build(self, shape, *, seq_len: int, seed: int, reserved: tuple[str, ...] = ()):
        model_config = student_config(
            shape.preset,
            hidden_size=shape.hidden_size,
            num_layers=shape.num_layers,
            num_heads=shape.num_heads,
            num_kv_heads=shape.num_kv_heads,
            intermediate_size=shape.intermediate_size,
            max_positions=shape.max_positions or seq_len,
            rope_theta=shape.rope_theta,
            stream=shape.stream_kind,
            reserved=reserved,
        )
        return build_student(model_config, seed=seed)

    def stream_from_stores(self, stored: StreamKind) -> StreamKind:
        """Fused stores train the tokenizer-free bytes student (their rows with the boundary summed
        out): on plain bytes it scored below the fused student placing its own flags at equal
        training FLOPs (docs/RESULTS.md, "The bytes student on plain bytes")."""
        return StreamKind.BYTES if stored is StreamKind.FUSED else stored

    def load(self, checkpoint: Path, saved_config: dict[str, Any]):
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig.from_dict(saved_config))
        tied = frozenset({"lm_head.weight"} if model.config.tie_word_embeddings else ())
        load_weights(model, Path(checkpoint) / "model.safetensors", self.name, tied)
        model.tie_weights()
        return model.eval()

    def card_sizes(self, config) -> str:
        return f"{config.num_hidden_layers} layers × {config.hidden_size} wide ({config.num_attention_heads} heads)"

    def cost(self, model) -> FlatCost:
        config = model.config
        d, layers = config.hidden_size, config.num_hidden_layers
        kv = 2 * d * config.num_key_value_heads // config.num_attention_heads
        return FlatCost(
            self.name,
            *split_parameters(model, ("model.layers.",)),
            symbol_flops=2 * (layers * block_weights(d, config.intermediate_size, kv) + d * config.vocab_size),
            patch_flops=0.0,
            global_width=d,
            global_layers=layers,
            kv_width=kv,
            local_width=0,
            local_layers=0,
            local_window=0,
        )

    def memory_floats(self, shape, *, batch_size: int, seq_len: int, alphabet: int) -> tuple[int, int]:
        """Its blocks and embedding (tied to the head); every layer keeps its activations for every symbol."""
        sizes = shape_sizes(shape)
        width, layers, mlp = sizes.hidden_size, sizes.num_layers, sizes.intermediate_size
        kv_width = 2 * width * (shape.num_kv_heads or sizes.num_heads) // sizes.num_heads
        parameters = stack_parameters(width, layers, kv_width, mlp, alphabet)
        return parameters, block_activation_floats(batch_size * seq_len, layers, width, mlp)


FLAT = FlatArchitecture()
