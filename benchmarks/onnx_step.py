"""The flat student's decode step on ONNX Runtime: the existing engine that ``benchmarks/serve.py``
measures beside the project's own.

A stock ``transformers`` Llama (a flat student, or a token model) is exported once
(``torch.onnx.export``, the dynamo exporter) as one decode step: one symbol per row at its
position, attention over the keys and values of the positions before it (each layer's cache an
input of its own, laid out positions first so that the first ``n`` positions are one contiguous
block) and the row's own new key and value. The step returns the logits and the new keys and
values, which the loop writes into its caches. Rows, like the engine's, each have their own
position; batch and cache length are dynamic axes, so one exported graph serves every step.
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from students.serving.flat_step import model_cache


class ExportedStep(torch.nn.Module):
    """The decode step as exported: ``(ids (B,), positions (B,), keys_0, values_0, …)``, each cache
    ``(T, B, key/value heads, head size)`` holding positions ``0 … T-1`` (entries at or after a
    row's position are masked), to ``(logits (B, V), new keys (L, B, H, D), new values (L, B, H, D))``."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, *caches: torch.Tensor):
        inner = self.model.model
        x = inner.embed_tokens(ids).unsqueeze(1)  # (B, 1, d)
        cos, sin = inner.rotary_emb(x, positions.unsqueeze(-1))
        entries = caches[0].shape[0]
        past = torch.arange(entries, device=ids.device) < positions.unsqueeze(-1)  # (B, T)
        new_keys, new_values = [], []
        for index, layer in enumerate(inner.layers):
            keys, values = caches[2 * index], caches[2 * index + 1]
            x, k, v = self._layer(layer, x, cos, sin, keys, values, past)
            new_keys.append(k)
            new_values.append(v)
        logits = self.model.lm_head(inner.norm(x))[:, 0]
        return logits, torch.stack(new_keys), torch.stack(new_values)

    @staticmethod
    def _layer(layer, x, cos, sin, keys, values, past):
        attention = layer.self_attn
        b, width = x.shape[0], attention.head_dim
        h = layer.input_layernorm(x)
        q = attention.q_proj(h).view(b, 1, -1, width).transpose(1, 2)
        k = attention.k_proj(h).view(b, 1, -1, width).transpose(1, 2)
        v = attention.v_proj(h).view(b, 1, -1, width).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = k[:, :, 0], v[:, :, 0]  # (B, H_kv, D)
        groups = attention.num_key_value_groups
        q = q[:, :, 0].reshape(b, k.shape[1], groups, width)  # (B, H_kv, G, D)
        before = torch.einsum("bkgd,tbkd->bkgt", q, keys) * attention.scaling
        before = before.masked_fill(~past[:, None, None], float("-inf"))
        own = (q * k[:, :, None]).sum(-1, keepdim=True) * attention.scaling
        weights = torch.cat([before, own], -1).softmax(-1)
        y = torch.einsum("bkgt,tbkd->bkgd", weights[..., :-1], values) + weights[..., -1:] * v[:, :, None]
        x = x + attention.o_proj(y.reshape(b, 1, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x, k, v


def cache_entry(config) -> tuple[int, int]:
    """(key/value heads, head size) of one cache position of a Llama of ``config``."""
    width = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_key_value_heads, width


def export_step(model, path: Path) -> Path:
    """Export ``model``'s decode step to ``path`` (ONNX), batch and cache length dynamic."""
    layers = model.config.num_hidden_layers
    batch, entries = 2, 4
    caches = [torch.zeros(entries, batch, *cache_entry(model.config)) for _ in range(2 * layers)]
    example = (torch.zeros(batch, dtype=torch.long), torch.full((batch,), entries), *caches)
    names = [f"{kind}_{i}" for i in range(layers) for kind in ("keys", "values")]
    dynamic = {"ids": {0: "batch"}, "positions": {0: "batch"}}
    dynamic["caches"] = tuple({0: "entries", 1: "batch"} for _ in names)
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)  # the exporter's notes (optional packages it skips)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", FutureWarning)
            program = torch.onnx.export(
                ExportedStep(model).eval(),
                example,
                dynamo=True,
                input_names=["ids", "positions", *names],
                output_names=["logits", "new_keys", "new_values"],
                dynamic_shapes=dynamic,
                verbose=False,
            )
    finally:
        exporter_log.setLevel(level)
    program.save(str(path))
    return path


class OnnxDecoder:
    """Greedy decoding (or a replay of given symbols) of an exported step on one ONNX Runtime
    session, the caches NumPy arrays allocated once."""

    def __init__(self, model, path: Path, batch: int, threads: int = 1):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.model, self.batch = model, batch
        config = model.config
        shape = (config.max_position_embeddings, batch, *cache_entry(config))
        self.caches = [np.zeros(shape, np.float32) for _ in range(2 * config.num_hidden_layers)]
        self.names = [i.name for i in self.session.get_inputs()][2:]
        self.rows = np.arange(batch)

    @torch.no_grad()
    def prefill(self, prompts: torch.Tensor) -> np.ndarray:
        """Run the prompts (B, P) through the model's own forward, their keys/values into the caches; the last logits."""
        output = self.model(input_ids=prompts, use_cache=True)
        cache = model_cache(output)
        length = prompts.shape[1]
        for index, layer in enumerate(cache.layers):
            self.caches[2 * index][:length] = layer.keys.permute(2, 0, 1, 3).numpy()
            self.caches[2 * index + 1][:length] = layer.values.permute(2, 0, 1, 3).numpy()
        return output.logits[:, -1].numpy()

    def step(self, ids: np.ndarray, positions: np.ndarray, entries: int) -> np.ndarray:
        """One symbol per row at ``positions`` over the first ``entries`` cache positions; the logits."""
        feeds = {"ids": ids, "positions": positions}
        feeds.update((name, cache[:entries]) for name, cache in zip(self.names, self.caches))
        logits, new_keys, new_values = self.session.run(None, feeds)
        for index in range(len(self.caches) // 2):
            self.caches[2 * index][positions, self.rows] = new_keys[index]
            self.caches[2 * index + 1][positions, self.rows] = new_values[index]
        return logits

    def replay(self, prompts: torch.Tensor, targets: torch.Tensor, new: int) -> float:
        """Seconds to prefill ``prompts`` and decode ``new`` symbols per row, choosing greedily but
        taking each row's symbol from ``targets`` (B, N), as the engine's replay does."""
        start = time.perf_counter()
        logits = self.prefill(prompts)
        forced = targets.numpy()
        length = prompts.shape[1]
        ids = forced[:, 0]
        for step in range(1, new):
            positions = np.full(self.batch, length + step - 1, dtype=np.int64)
            logits = self.step(ids, positions, length + step - 1)
            logits.argmax(-1)  # the greedy choice a decode makes, replaced by the replayed symbol
            ids = forced[:, step]
        return time.perf_counter() - start
