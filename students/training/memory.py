"""Training's peak memory as a formula of its settings, checked before anything is built or written.

The terms, for one process: the student's weights, gradients and AdamW's two moments (float32:
16 bytes a parameter); one micro-batch's activations kept for the backward pass (float32; each
architecture counts its parameters and these floats, :meth:`~students.models.architecture.Architecture.memory_floats`:
per position and layer at least the block's normed inputs, projections and MLP products,
:func:`students.models.cost.block_activation_floats`); the output layer's
logits, log-probabilities and their gradients (3 floats a symbol and alphabet symbol); and the batches: the training batch's teacher distributions (float16, a row per
symbol) for the batch in use and those the loader's workers prepare, besides the held-out batch
(float32). The estimate is a floor (the allocator, the libraries and the store readers add to it),
so it refuses only what cannot fit: a size that would take more than the machine's memory (the
GPU's for the model's terms when one is used) is refused in one line naming the setting to lower
(:func:`over_budget`), where building the model would end in an allocator's traceback or the
kernel's out-of-memory killer.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from students.models.architectures import architecture_named

STATE_BYTES_PER_PARAMETER = 16  # float32 weights, gradients and AdamW's two moments
ACTIVATION_BYTES_PER_FLOAT = 4  # float32
LOGIT_FLOATS = 3  # logits, log-probabilities, gradients
PREFETCHED_BATCHES = 2  # batches each loader worker prepares ahead
# the settings that size the terms, in the order they are named when several could be lowered
SIZE_SETTINGS = (
    ("batches", "seq_len"),
    ("batches", "batch_size"),
    ("student", "num_layers"),
    ("student", "hidden_size"),
    ("student", "intermediate_size"),
    ("student", "num_heads"),
    ("student", "local_hidden_size"),
    ("student", "local_layers"),
    ("batches", "num_workers"),
)
GROUP = {name: group for group, name in SIZE_SETTINGS}


@dataclass(frozen=True)
class Term:
    name: str
    bytes: int
    on_device: bool  # False: host memory even when training on a GPU


def memory_terms(config, alphabet: int) -> list[Term]:
    """The estimate's terms for a :class:`~students.training.train_config.TrainConfig` whose student
    reads ``alphabet`` symbols (its stream's and the reserved ones)."""
    shape, batches = config.student, config.batches
    parameters, activation_floats = architecture_named(shape.architecture).memory_floats(
        shape, batch_size=batches.batch_size, seq_len=batches.seq_len, alphabet=alphabet
    )
    row = batches.batch_size * batches.seq_len * alphabet
    return [
        Term("weights, gradients and optimizer state", parameters * STATE_BYTES_PER_PARAMETER, True),
        Term("activations", activation_floats * ACTIVATION_BYTES_PER_FLOAT, True),
        Term("logits", row * LOGIT_FLOATS * 4, True),
        Term("batches", row * 2 * (1 + PREFETCHED_BATCHES * batches.num_workers) + row * 4, False),
    ]


def capacities() -> tuple[str, int, int | None]:
    """Where the model trains, its memory, and the host's when that is another (a GPU's)."""
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    import torch

    if torch.cuda.is_available():
        return "cuda", torch.cuda.mem_get_info()[1], host
    return "cpu", host, None


def _shortfall(terms: list[Term], device_bytes: int, host_bytes: int | None) -> int:
    """Bytes beyond what fits (0: it fits), the device and the host each against their own memory."""
    if host_bytes is None:
        return max(0, sum(t.bytes for t in terms) - device_bytes)
    on_device = sum(t.bytes for t in terms if t.on_device)
    on_host = sum(t.bytes for t in terms if not t.on_device)
    return max(0, on_device - device_bytes) + max(0, on_host - host_bytes)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def over_budget(config, alphabet: int, capacity: tuple[str, int, int | None] | None = None) -> str | None:
    """Why ``config`` cannot train in this machine's memory, naming the setting whose default would
    free the most, or else the preset (its weights alone too large) or the batch, or None.
    ``capacity``: (device, its bytes, the host's bytes where the device is a GPU), this machine's by default."""
    device, device_bytes, host_bytes = capacity or capacities()
    terms = memory_terms(config, alphabet)
    short = _shortfall(terms, device_bytes, host_bytes)
    if not short:
        return None
    best, best_short = None, short
    for group, name in SIZE_SETTINGS:
        owner = getattr(config, group)
        default = next(f for f in dataclasses.fields(owner) if f.name == name).default
        if getattr(owner, name) == default:
            continue
        lowered = dataclasses.replace(config, **{group: dataclasses.replace(owner, **{name: default})})
        if (now := _shortfall(memory_terms(lowered, alphabet), device_bytes, host_bytes)) < best_short:
            best, best_short = name, now
    if best:
        lower = f"lower {_flag(best)} ({getattr(getattr(config, GROUP[best]), best)})"
    elif terms[0].bytes > device_bytes:  # the weights alone do not fit, whatever the batch
        lower = f"choose a smaller --preset than {config.student.preset}"
    else:
        lower = f"lower --batch-size ({config.batches.batch_size}) or --seq-len ({config.batches.seq_len})"
    parts = ", ".join(f"{t.name} {_size(t.bytes)}" for t in terms)
    where = f"{device} has {_size(device_bytes)}" + (f", the host {_size(host_bytes)}" if host_bytes else "")
    return f"training needs at least {_size(sum(t.bytes for t in terms))} ({parts}); {where}: {lower}"


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n < 1e12 else f"{n:.3g} bytes"
