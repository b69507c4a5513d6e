"""A toy architecture, added the way any architecture is: this one module and one line in the
registry (:data:`students.models.architectures.ARCHITECTURES`, which tests/test_architectures.py sets).

The toy is a bigram model (each symbol's embedding, straight to the head): the next symbol depends
on the current one only, so it needs no cache to generate.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from bytestream.alphabet import ALPHABET_SIZE, BOS, EOS, PAD
from students.models.architecture import Architecture, load_weights
from students.models.cost import StreamRates, StudentCost, split_parameters


class ToyConfig(PretrainedConfig):
    model_type = "bytedistill_toy_bigram"

    def __init__(self, hidden_size: int = 16, max_position_embeddings: int = 2048, reserved_symbols=(), **kwargs):
        self.reserved_symbols = list(reserved_symbols)
        self.vocab_size, self.hidden_size = ALPHABET_SIZE + len(self.reserved_symbols), hidden_size
        self.max_position_embeddings = max_position_embeddings
        for name, value in (("bos_token_id", BOS), ("eos_token_id", EOS), ("pad_token_id", PAD)):
            kwargs.setdefault(name, value)
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)


class ToyBigram(PreTrainedModel, GenerationMixin):
    config_class = ToyConfig

    def __init__(self, config: ToyConfig):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.head = torch.nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # nothing to cache: the next symbol depends on the current one only

    def get_input_embeddings(self):
        return self.embed

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs) -> CausalLMOutputWithPast:
        logits = self.head(self.embed(input_ids))
        loss = None
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        return CausalLMOutputWithPast(loss=loss, logits=logits)


@dataclass(frozen=True)
class ToyCost(StudentCost):
    """One embedding lookup and one matrix product per symbol; nothing read from earlier symbols."""

    def train_flops_per_symbol(self, rates: StreamRates, seq_len: int) -> float:
        return 3 * self.symbol_flops

    def generate_flops_per_symbol(self, rates: StreamRates, context: int) -> float:
        return self.symbol_flops

    def global_steps_per_byte(self, rates: StreamRates) -> float:
        return rates.symbols_per_byte


class ToyArchitecture(Architecture):
    name = "toy"
    model_type = ToyConfig.model_type
    summary = "a bigram model (tests only)"
    card_name = "toy bigram architecture"
    card_loading = "None  # the toy loads with bytedistill only"
    card_code = "The toy model loads with bytedistill only."

    def build(self, shape, *, seq_len: int, seed: int, reserved: tuple[str, ...] = ()) -> ToyBigram:
        torch.manual_seed(seed)
        config = ToyConfig(
            hidden_size=shape.hidden_size or 16, max_position_embeddings=seq_len, reserved_symbols=reserved
        )
        return ToyBigram(config)

    def load(self, checkpoint: Path, saved_config: dict[str, Any]) -> ToyBigram:
        model = ToyBigram(ToyConfig.from_dict(saved_config))
        load_weights(model, Path(checkpoint) / "model.safetensors", self.name)
        return model.eval()

    def register_auto_classes(self) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        AutoConfig.register(ToyConfig.model_type, ToyConfig, exist_ok=True)
        AutoModelForCausalLM.register(ToyConfig, ToyBigram, exist_ok=True)

    def card_sizes(self, config) -> str:
        return f"one embedding {config.hidden_size} wide"

    def cost(self, model) -> ToyCost:
        width = model.config.hidden_size
        return ToyCost(
            self.name,
            *split_parameters(model, ("no global model",)),
            symbol_flops=2 * width * model.config.vocab_size,
            patch_flops=0.0,
            global_width=0,
            global_layers=0,
            kv_width=0,
            local_width=0,
            local_layers=0,
            local_window=0,
        )


TOY = ToyArchitecture()
