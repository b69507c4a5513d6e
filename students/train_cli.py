"""``bytedistill train``: a thin layer over :func:`students.trainer.train`.

Multi-GPU / multi-machine: ``accelerate launch -m students.train_cli --train-stores ... ``
(this module is also runnable on its own) or ``accelerate launch $(which bytedistill) train ...``.
"""

from __future__ import annotations

import sys

from students import trainer
from students.trainer import TrainConfig


def train(config: TrainConfig) -> int:
    """Train a byte student on logit stores.

    Trains a byte-level student on logit stores (KL to the teacher + cross-entropy).
    """
    result = trainer.train(config)
    print(f"trained to step {result.step} on {result.train_bytes:,} bytes; checkpoint {result.checkpoint}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from distill.cli import main as cli_main

    return cli_main(["train", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
