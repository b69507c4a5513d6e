"""What a student costs: parameters (global / local), FLOPs per stream symbol, large-model steps
and KV-cache bytes, for the flat Llama and the patched student alike, so that runs are compared
at equal compute (docs/DESIGN.md, "The patched student").

FLOPs count multiply-adds twice and only matrix products: per position and layer
``2 · (weights of the layer)`` plus attention ``4 · width · keys read`` (scores and the weighted
sum), plus the output head; embeddings are lookups and norms are ignored. Training is three
forward passes' worth (forward + backward). The patched student's global model runs once per
closed patch, so its share of a symbol's cost is scaled by the patches per symbol of the data.

Keys read: a causal window of ``T`` positions reads ``(T + 1) / 2`` keys on average; a local
window ``W`` caps that at ``W``; at generation with a context of ``C`` symbols the flat student
reads ``C``, the patched one ``min(C, W)`` locally and ``C × patches per symbol`` globally.
"""

from __future__ import annotations

from dataclasses import dataclass

from bytestream.alphabet import BOS, EOT

BYTES_PER_VALUE = 4  # float32 caches


@dataclass(frozen=True)
class StreamRates:
    """The data's shape: stream symbols and patches (``<eot>`` + ``<bos>``) per UTF-8 byte."""

    symbols_per_byte: float
    patches_per_byte: float

    @property
    def patches_per_symbol(self) -> float:
        return self.patches_per_byte / self.symbols_per_byte


def rates_of_stream(symbols, text_bytes: int) -> StreamRates:
    """Rates counted on a stream (a sequence of symbol ids) holding ``text_bytes`` bytes."""
    symbols = list(symbols)
    patches = sum(1 for s in symbols if s in (EOT, BOS))
    return StreamRates(len(symbols) / text_bytes, patches / text_bytes)


def rates_of_stores(paths) -> dict[str, float] | None:
    """The stores' :class:`StreamRates` as a dict: each document's stream is ``<bos>``, its bytes, one
    ``<eot>`` per teacher token and ``<eos>``."""
    from logit_store.multi import as_store

    stats = as_store([str(p) for p in paths]).stats()
    if not stats["text_bytes"]:
        return None
    symbols = stats["positions"] + stats["documents"]
    patches = stats["tokens"] + stats["documents"]
    return {"symbols_per_byte": symbols / stats["text_bytes"], "patches_per_byte": patches / stats["text_bytes"]}


@dataclass(frozen=True)
class StudentCost:
    architecture: str  # "flat" or "patched"
    global_parameters: int  # the large model: every layer of a flat student
    local_parameters: int  # embeddings, encoder, decoder, head (a flat student's embeddings and head)
    symbol_flops: float  # forward FLOPs per symbol, without the global model's per-patch part
    patch_flops: float  # forward FLOPs per global step, without attention (0 for flat)
    global_width: int  # width and layers of the large model (for its attention and cache)
    global_layers: int
    kv_width: int  # keys + values kept per position and layer of the large model
    local_width: int  # width and layers that run per symbol with a local window (0 for flat)
    local_layers: int
    local_window: int

    @property
    def parameters(self) -> int:
        return self.global_parameters + self.local_parameters

    def forward_flops_per_symbol(self, rates: StreamRates, keys_global: float, keys_local: float) -> float:
        """Forward FLOPs per symbol when the large model reads ``keys_global`` keys and local layers ``keys_local``."""
        attention_local = 4 * self.local_width * self.local_layers * keys_local
        attention_global = 4 * self.global_width * self.global_layers * keys_global
        if self.architecture == "flat":
            return self.symbol_flops + attention_global
        steps = rates.patches_per_symbol
        return self.symbol_flops + attention_local + steps * (self.patch_flops + attention_global)

    def train_flops_per_symbol(self, rates: StreamRates, seq_len: int) -> float:
        """Training FLOPs (3 × forward) per symbol of windows of ``seq_len`` symbols."""
        if self.architecture == "flat":
            return 3 * self.forward_flops_per_symbol(rates, (seq_len + 1) / 2, 0)
        patches = seq_len * rates.patches_per_symbol + 1
        local = sum(min(i + 1, self.local_window) for i in range(seq_len)) / seq_len
        return 3 * self.forward_flops_per_symbol(rates, (patches + 1) / 2, local)

    def generate_flops_per_symbol(self, rates: StreamRates, context: int) -> float:
        """Forward FLOPs of one generated symbol after ``context`` symbols (caches on)."""
        if self.architecture == "flat":
            return self.forward_flops_per_symbol(rates, context, 0)
        return self.forward_flops_per_symbol(rates, context * rates.patches_per_symbol, min(context, self.local_window))

    def global_steps_per_byte(self, rates: StreamRates) -> float:
        """Sequential steps of the large model per text byte."""
        return rates.symbols_per_byte if self.architecture == "flat" else rates.patches_per_byte

    def kv_bytes_per_byte(self, rates: StreamRates) -> float:
        """KV-cache bytes that each text byte of context adds (the patched local caches are fixed)."""
        return self.global_steps_per_byte(rates) * self.global_layers * self.kv_width * BYTES_PER_VALUE

    def local_cache_bytes(self) -> int:
        """The patched student's local caches: fixed, whatever the context."""
        return 2 * self.local_width * self.local_layers * self.local_window * BYTES_PER_VALUE


def _block_weights(width: int, inner: int, kv_width: int) -> int:
    """Matrix weights of one pre-norm attention + SwiGLU block."""
    return 2 * width * width + width * kv_width + 3 * width * inner


GLOBAL_PARTS = {"flat": ("model.layers.",), "patched": ("global_", "patch_")}


def split_parameters(model, architecture: str) -> tuple[int, int]:
    """(global, local) trainable parameters of ``model``, tied ones counted once."""
    counts = [0, 0]
    for name, parameter in model.named_parameters():
        counts[0 if name.startswith(GLOBAL_PARTS[architecture]) else 1] += parameter.numel()
    return counts[0], counts[1]


def student_cost(model) -> StudentCost:
    """The cost of ``model``: a flat Llama student or a patched one."""
    config = model.config
    if config.model_type == "bytedistill_patched":
        dl, dg, vocab = config.local_hidden_size, config.global_hidden_size, config.vocab_size
        local_layers = config.encoder_layers + config.decoder_layers
        local_block = _block_weights(dl, config.local_intermediate_size, 2 * dl)
        global_block = _block_weights(dg, config.global_intermediate_size, 2 * dg)
        return StudentCost(
            "patched",
            *split_parameters(model, "patched"),
            symbol_flops=2 * (local_layers * local_block + dg * dl + dl * vocab),  # + down-projection and head
            patch_flops=2 * (config.global_layers * global_block + dl * dg),  # + up-projection
            global_width=dg,
            global_layers=config.global_layers,
            kv_width=2 * dg,
            local_width=dl,
            local_layers=local_layers,
            local_window=config.local_window,
        )
    d, layers = config.hidden_size, config.num_hidden_layers
    kv = 2 * d * config.num_key_value_heads // config.num_attention_heads
    return StudentCost(
        "flat",
        *split_parameters(model, "flat"),
        symbol_flops=2 * (layers * _block_weights(d, config.intermediate_size, kv) + d * config.vocab_size),
        patch_flops=0.0,
        global_width=d,
        global_layers=layers,
        kv_width=kv,
        local_width=0,
        local_layers=0,
        local_window=0,
    )


def summary_line(cost: StudentCost, rates: StreamRates | None, seq_len: int) -> str:
    """One line for ``train``: the architecture, its parameters and its training FLOPs per symbol."""
    patched = cost.architecture != "flat"  # a flat student has no local layers and reads no patches
    split = f" (global {cost.global_parameters:,}, local {cost.local_parameters:,})" if patched else ""
    parts = [f"student: {cost.architecture}, {cost.parameters:,} parameters{split}"]
    if rates is None and patched:
        parts.append("training FLOPs per stream symbol unknown (the data gives no patch rate)")
    else:
        flops = f"training FLOPs per stream symbol {cost.train_flops_per_symbol(rates, seq_len):.3g}"
        shown = [f"{rates.patches_per_symbol:.3f} patches per symbol"] if patched else []
        shown += [f"{rates.symbols_per_byte:.3f} symbols per byte"] if rates is not None else []
        parts.append(flops + (f" ({', '.join(shown)})" if shown else ""))
    return "; ".join(parts)
