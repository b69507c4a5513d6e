"""What a student costs: parameters (global / local), FLOPs per stream symbol, large-model steps
and KV-cache bytes, for the flat Llama and the patched student alike, so that runs are compared
at equal compute (docs/DESIGN.md, "The patched student"). The formulas below are the common ones;
each architecture's module builds its :class:`StudentCost` and says how its large model's work
grows with the stream.

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
from typing import ClassVar

BYTES_PER_VALUE = 4  # float32 caches


@dataclass(frozen=True)
class StreamRates:
    """The data's shape: stream symbols and patches (``<eot>`` + ``<bos>``) per UTF-8 byte."""

    symbols_per_byte: float
    patches_per_byte: float

    @property
    def patches_per_symbol(self) -> float:
        return self.patches_per_byte / self.symbols_per_byte


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
    """What one student costs; each architecture's subclass (:meth:`students.models.architecture.Architecture.cost`)
    says how its large model's work grows with the stream."""

    architecture: str  # the architecture's name
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

    # whether the large model runs once per patch (else once per symbol, with no local layers)
    per_patch: ClassVar[bool] = False

    @property
    def parameters(self) -> int:
        return self.global_parameters + self.local_parameters

    def train_flops_per_symbol(self, rates: StreamRates, seq_len: int) -> float:
        """Training FLOPs (3 × forward) per symbol of windows of ``seq_len`` symbols."""
        raise NotImplementedError

    def generate_flops_per_symbol(self, rates: StreamRates, context: int) -> float:
        """Forward FLOPs of one generated symbol after ``context`` symbols (caches on)."""
        raise NotImplementedError

    def global_steps_per_byte(self, rates: StreamRates) -> float:
        """Sequential steps of the large model per text byte."""
        raise NotImplementedError

    def kv_bytes_per_byte(self, rates: StreamRates) -> float:
        """KV-cache bytes that each text byte of context adds (the patched local caches are fixed)."""
        return self.global_steps_per_byte(rates) * self.global_layers * self.kv_width * BYTES_PER_VALUE

    def local_cache_bytes(self) -> int:
        """The patched student's local caches: fixed, whatever the context."""
        return 2 * self.local_width * self.local_layers * self.local_window * BYTES_PER_VALUE


def block_weights(width: int, inner: int, kv_width: int) -> int:
    """Matrix weights of one pre-norm attention + SwiGLU block."""
    return 2 * width * width + width * kv_width + 3 * width * inner


# floats one position keeps for the backward pass in a block, at least: the block's normed inputs and
# projections (per unit of width) and its MLP's gate, up and their product (per unit of MLP width);
# the attention's own, which fused kernels do not keep, are left out
ACTIVATION_FLOATS_PER_WIDTH = 6
ACTIVATION_FLOATS_PER_MLP = 3


def stack_parameters(width: int, layers: int, kv_width: int, inner: int, alphabet: int) -> int:
    """Matrix weights of ``layers`` blocks and an embedding of ``alphabet`` symbols (0: none)."""
    return layers * block_weights(width, inner, kv_width) + alphabet * width


def block_activation_floats(positions: int, layers: int, width: int, inner: int) -> int:
    """Floats that ``positions`` positions keep for the backward pass in ``layers`` blocks."""
    return positions * layers * (ACTIVATION_FLOATS_PER_WIDTH * width + ACTIVATION_FLOATS_PER_MLP * inner)


def split_parameters(model, global_parts: tuple[str, ...]) -> tuple[int, int]:
    """(global, local) trainable parameters of ``model``, tied ones counted once: the global ones are
    those whose names start with one of ``global_parts``."""
    counts = [0, 0]
    for name, parameter in model.named_parameters():
        counts[0 if name.startswith(global_parts) else 1] += parameter.numel()
    return counts[0], counts[1]


def summary_line(cost: StudentCost, rates: StreamRates | None, seq_len: int, stream: str | None = None) -> str:
    """One line for ``train``: the architecture (on ``stream``, as shown: the stream ``--stream auto``
    resolved to), its parameters and its training FLOPs per symbol."""
    patched = cost.per_patch  # a student whose large model runs per symbol has no local layers, reads no patches
    split = f" (global {cost.global_parameters:,}, local {cost.local_parameters:,})" if patched else ""
    on = f" on the {stream} stream" if stream else ""
    parts = [f"student: {cost.architecture}{on}, {cost.parameters:,} parameters{split}"]
    if rates is None and patched:
        parts.append("training FLOPs per stream symbol unknown (the data gives no patch rate)")
    else:
        flops = f"training FLOPs per stream symbol {cost.train_flops_per_symbol(rates, seq_len):.3g}"
        shown = [f"{rates.patches_per_symbol:.3f} patches per symbol"] if patched else []
        shown += [f"{rates.symbols_per_byte:.3f} symbols per byte"] if rates is not None else []
        parts.append(flops + (f" ({', '.join(shown)})" if shown else ""))
    return "; ".join(parts)
