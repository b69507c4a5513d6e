"""``bytedistill train``: a thin layer over :func:`students.training.trainer.train`.

Multi-GPU / multi-machine: ``accelerate launch -m bytedistill train --train-stores ...``.
"""

from __future__ import annotations

from students.training.train_config import TrainConfig


def train(config: TrainConfig) -> int:
    """Train a byte student on logit stores.

    Trains a byte-level student on logit stores (KL to the teacher + cross-entropy).
    """
    from students.training import trainer

    result = trainer.train(config)
    print(f"trained to step {result.step} on {result.train_bytes:,} bytes; checkpoint {result.checkpoint}")
    return 0
