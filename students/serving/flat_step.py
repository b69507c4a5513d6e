"""The flat student's decode step for the engine: a stock ``transformers`` Llama run one symbol per
row, each row at its own position, over key/value caches allocated once for every slot.

The prompt runs through the model's own forward (one call, its cache copied into the slot), so a
row starts exactly where ``generate`` starts. A step then runs the Llama's own modules (norms,
projections, rotary embedding, MLP) around one attention over the slot's cache: each row writes
its new key and value at its own position and reads the first ``used`` entries (a power of two
at least as large as every active row's length, at least ``MIN_USED``), masked past its own
length, so a compiled step compiles once per bucket and reads at most twice the entries in use.
A token model (a Llama over a teacher's vocabulary) runs through the same step.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

MIN_USED = 64


def bucket(length: int, capacity: int) -> int:
    """Cache entries a step reads for rows of at most ``length`` entries: a power of two, at least
    ``MIN_USED``, at most ``capacity``."""
    return min(capacity, max(MIN_USED, 1 << max(length - 1, 0).bit_length()))


def model_cache(output):
    """The cache a forward returned (``cache`` in recent ``transformers``, ``past_key_values`` before)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


class FlatStepper:
    """Caches (layers × slots × key/value heads × context × head size) and the step over them."""

    def __init__(self, model, slots: int, device: torch.device):
        config = model.config
        self.model, self.slots, self.device = model, slots, device
        self.capacity = config.max_position_embeddings
        self.vocab_size = config.vocab_size
        attention = model.model.layers[0].self_attn
        heads, width = config.num_key_value_heads, attention.head_dim
        dtype = next(model.parameters()).dtype
        shape = (slots, heads, self.capacity, width)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in model.model.layers]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in model.model.layers]
        self.rows = torch.arange(slots, device=device)

    def static_tensors(self) -> list[torch.Tensor]:
        return [*self.keys, *self.values]

    def view(self, width: int) -> FlatStepper:
        """The same stepper over the first ``width`` slots (views: writes reach this one's caches)."""
        view = copy.copy(self)
        view.slots = width
        view.keys = [tensor[:width] for tensor in self.keys]
        view.values = [tensor[:width] for tensor in self.values]
        view.rows = self.rows[:width]
        return view

    @torch.no_grad()
    def prefill(self, slot: int, symbols: list[int]) -> torch.Tensor:
        """Run ``symbols`` as row ``slot``'s context with the model's own forward; its last logits (V,)."""
        ids = torch.tensor([symbols], device=self.device)
        output = self.model(input_ids=ids, use_cache=True)
        cache = model_cache(output)
        for index, layer in enumerate(cache.layers):
            self.keys[index][slot, :, : len(symbols)] = layer.keys[0]
            self.values[index][slot, :, : len(symbols)] = layer.values[0]
        return output.logits[0, -1]

    def step(self, symbols: torch.Tensor, positions: torch.Tensor, used: int) -> torch.Tensor:
        """Logits (B, V) after one more symbol per row (``symbols`` (B,) at ``positions`` (B,)),
        each row's key and value written at its position, attention over the first ``used`` entries."""
        model = self.model.model
        x = model.embed_tokens(symbols).unsqueeze(1)  # (B, 1, d)
        cos, sin = model.rotary_emb(x, positions.unsqueeze(-1))
        mask = (torch.arange(used, device=x.device) <= positions.unsqueeze(-1)).view(len(symbols), 1, 1, used)
        for index, layer in enumerate(model.layers):
            x = self._layer(layer, x, cos, sin, mask, positions, index, used)
        return self.model.lm_head(model.norm(x))[:, 0]

    def _layer(self, layer, x, cos, sin, mask, positions, index: int, used: int) -> torch.Tensor:
        attention = layer.self_attn
        b = x.shape[0]
        h = layer.input_layernorm(x)
        q = attention.q_proj(h).view(b, 1, -1, attention.head_dim).transpose(1, 2)
        k = attention.k_proj(h).view(b, 1, -1, attention.head_dim).transpose(1, 2)
        v = attention.v_proj(h).view(b, 1, -1, attention.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        keys, values = self.keys[index], self.values[index]
        keys[self.rows, :, positions] = k[:, :, 0]
        values[self.rows, :, positions] = v[:, :, 0]
        k_all = repeat_kv(keys[:, :, :used], attention.num_key_value_groups)
        v_all = repeat_kv(values[:, :, :used], attention.num_key_value_groups)
        y = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, scale=attention.scaling)
        x = x + attention.o_proj(y.transpose(1, 2).reshape(b, 1, -1))
        return x + layer.mlp(layer.post_attention_layernorm(x))
