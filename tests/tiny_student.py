"""A tiny student for tests that train one: its configuration, on the synthetic source's store
names unless told otherwise."""

from __future__ import annotations

from pathlib import Path

from configs.fields import from_flat
from students.training.trainer import TrainConfig

TINY = {
    "preset": "tiny",
    "hidden_size": 32,
    "num_layers": 2,
    "num_heads": 2,
    "intermediate_size": 64,
    "seq_len": 16,
    "batch_size": 2,
    "progress": False,
}


def tiny_config(out: Path, **overrides) -> TrainConfig:
    """TINY trained into ``out`` on the stores ``["train"]``, with no evaluation and no
    checkpoints unless ``overrides`` say otherwise."""
    values = {**TINY, "train_stores": ["train"], "output_dir": str(out), "checkpoint_every": 0, "eval_every": 0}
    return from_flat(TrainConfig, {**values, **overrides})
