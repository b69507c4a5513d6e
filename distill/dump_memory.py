"""The dump's peak memory as a formula of its settings (see the README: dump memory).

Nothing in the dump grows with the corpus or with a group's logits: the teacher's hidden states
live for one forward batch (``--batch-tokens``), float32 logits exist for ``--head-rows`` rows at
a time (the LM head and the conversion run in row chunks), and what waits for a document to be
complete is its converted values (about 400 per Llama-3 token), for at most one group
(``--group-tokens``) plus the longest document that is longer than a group.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

# float64 value + int16 support symbol per converted value, ~400 values per token (~90 per text byte)
PENDING_BYTES_PER_TOKEN = 400 * 10
LOGIT_CHUNKS_IN_FLIGHT = 3  # CPU: one being computed, two queued for the converting thread


@dataclass(frozen=True)
class MemoryTerm:
    name: str
    bytes: int
    flag: str  # the setting that scales it
    on_device: bool  # False: host memory even when the teacher runs on a GPU


def memory_terms(
    teacher, *, batch_tokens: int, max_length: int, head_rows: int, group_tokens: int, device_conversion: bool
) -> list[MemoryTerm]:
    """Estimated peak bytes of each part of the dump, with the flag that scales it."""
    model, config = teacher.model, teacher.model.config
    hidden = config.hidden_size
    vocab = teacher.head.out_features
    dtype_bytes = torch.finfo(teacher.dtype).bits // 8
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) + teacher.head.weight.numel() * 4
    activations = batch_tokens * (4 * hidden + 2 * getattr(config, "intermediate_size", 4 * hidden)) * dtype_bytes
    heads = 1 if teacher.device.type == "cuda" else config.num_attention_heads  # CPU attention keeps its scores
    attention = batch_tokens * max_length * heads * dtype_bytes
    if device_conversion:
        from distill.convert_torch import MAX_ELEMENTS, row_chunk

        logits = head_rows * vocab * 4 + 4 * row_chunk(teacher.device) * vocab * 8 + 5 * MAX_ELEMENTS * 8
    else:
        logits = LOGIT_CHUNKS_IN_FLIGHT * head_rows * vocab * 4
    return [
        MemoryTerm("weights", weights, "--dtype", True),
        MemoryTerm("forward", activations + attention, "--batch-tokens", True),
        MemoryTerm("logits", logits, "--head-rows", True),
        MemoryTerm("pending values", group_tokens * PENDING_BYTES_PER_TOKEN, "--group-tokens", False),
    ]


def capacity(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def describe(terms: list[MemoryTerm], device: torch.device) -> str:
    parts = " + ".join(f"{t.name} {_gb(t.bytes)}" + (f" ({t.flag})" if t.flag != "--dtype" else "") for t in terms)
    where = f"{_gb(sum(t.bytes for t in terms if t.on_device))} on {device}"
    if device.type == "cuda":
        where += f", {_gb(sum(t.bytes for t in terms if not t.on_device))} on the host"
    return f"dump memory estimate: {parts}; {where} (of {_gb(capacity(device))})"


def over_budget(terms: list[MemoryTerm], device: torch.device) -> str | None:
    """Why the settings cannot fit ``device`` (naming the flag to lower), or None."""
    on_device = [t for t in terms if t.on_device or device.type != "cuda"]
    need, have = sum(t.bytes for t in on_device), capacity(device)
    if need <= have:
        return None
    largest = max((t for t in on_device if t.flag != "--dtype"), key=lambda t: t.bytes)
    return (
        f"the dump needs about {_gb(need)} on {device}, which has {_gb(have)}: {largest.name} take "
        f"{_gb(largest.bytes)}; lower {largest.flag}"
    )


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"
