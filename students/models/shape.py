"""The student's shape as training sets it (:class:`StudentShape`, the ``train`` flags
``--stream`` … ``--local-window``): the stream it reads, an architecture, a size preset (:data:`students.models.llama.PRESETS`)
and any sizes that override it. Each architecture of :mod:`students.models.architectures` builds a student from it.

Importing it loads no torch: ``bytedistill train --help`` builds its parser from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bytestream.stream_kind import AUTO_STREAM, StreamKind
from configs.ranges import COUNT, POSITIVE
from students.models.architectures import ARCHITECTURES, DEFAULT
from students.models.llama import DEFAULT_PRESET, PRESETS

# Parameters of each preset (flat / patched), as `--help` prints them; tests/test_student_model.py
# builds every preset and checks these figures, and the README lists their training FLOPs per byte.
PRESET_HELP = (
    f"student size preset (default {DEFAULT_PRESET}: the best size at every budget of the budget benchmark), "
    "parameters flat / patched on the fused stream (the default; an <eot> student's "
    "embeddings and head have 255 fewer rows): micro 0.247M / 0.278M, tiny 0.919M / 1.04M, small 5.25M / 5.74M, "
    "base 27.5M / 29.4M, medium 116M / 120M, large 407M / 415M, xl 1.03B / 1.04B "
    "(training FLOPs per byte: README, 'Students and presets')"
)


@dataclass
class StudentShape:
    """The student to train: the stream it reads, its architecture, a size preset and any sizes that
    override it."""

    stream: str = field(
        default=AUTO_STREAM,
        metadata={
            "help": "the stream the student reads, from stores of its stream: eot (bytes and an <eot> after "
            "each teacher token), fused (one symbol per byte that says whether the token ends with it), "
            "bytes (the text bytes alone, read from fused stores with each byte's two flags summed: a flat "
            "student that needs no tokenizer) or auto: the stream of the run it resumes or the student it starts "
            "from, else the training stores' (a flat student reads fused stores, dump's default, as bytes)",
            "choices": [AUTO_STREAM, *(kind.value for kind in StreamKind)],
        },
    )

    architecture: str = field(
        default=DEFAULT.name,
        metadata={
            "help": "; ".join(f"{a.name}: {a.summary}" for a in ARCHITECTURES.values()),
            "choices": list(ARCHITECTURES),
        },
    )
    preset: str = field(default=DEFAULT_PRESET, metadata={"help": PRESET_HELP, "choices": list(PRESETS)})
    hidden_size: int | None = field(
        default=None, metadata={"help": "override the preset's hidden size", "range": COUNT}
    )
    num_layers: int | None = field(
        default=None, metadata={"help": "override the preset's number of layers", "range": COUNT}
    )
    num_heads: int | None = field(
        default=None, metadata={"help": "override the preset's attention heads", "range": COUNT}
    )
    num_kv_heads: int | None = field(
        default=None, metadata={"help": "key/value heads (grouped-query attention)", "range": COUNT}
    )
    intermediate_size: int | None = field(
        default=None, metadata={"help": "override the preset's MLP width", "range": COUNT}
    )
    max_positions: int | None = field(
        default=None, metadata={"help": "model's maximum positions (default: seq_len)", "range": COUNT}
    )
    rope_theta: float = field(default=10000.0, metadata={"help": "rotary embedding base", "range": POSITIVE})
    local_hidden_size: int | None = field(
        default=None, metadata={"help": "patched: the local layers' width", "range": COUNT}
    )
    local_layers: int | None = field(
        default=None, metadata={"help": "patched: local encoder (= decoder) layers", "range": COUNT}
    )
    local_window: int | None = field(
        default=None, metadata={"help": "patched: symbols a local layer attends to", "range": COUNT}
    )

    @property
    def stream_kind(self) -> StreamKind:
        """The stream, once ``auto`` is resolved (:func:`students.training.trainer.train` resolves it
        from the training stores before anything reads it)."""
        if self.stream == AUTO_STREAM:
            raise ValueError("the student's stream is 'auto': resolve it from the training stores first")
        return StreamKind(self.stream)
