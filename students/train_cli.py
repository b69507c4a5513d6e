"""``bytedistill train``: a thin layer over :func:`students.trainer.train`.

Multi-GPU / multi-machine: ``accelerate launch -m students.train_cli --train-stores ... ``
(this module is also runnable on its own) or ``accelerate launch $(which bytedistill) train ...``.
"""

from __future__ import annotations

import argparse
import sys

from distill.config import add_config_arguments, config_from_args
from students.trainer import TrainConfig, train


def run(args: argparse.Namespace) -> int:
    config = config_from_args(TrainConfig, args)
    result = train(config)
    print(f"trained to step {result.step} on {result.train_bytes:,} bytes; checkpoint {result.checkpoint}")
    return 0


def _configure(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, TrainConfig)
    parser.set_defaults(handler=run)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a byte student on logit stores",
        description="Train a byte-level student on logit stores (KL to the teacher + cross-entropy).",
    )
    _configure(parser)


def main(argv: list[str] | None = None) -> int:
    from distill.cli import main as cli_main

    return cli_main(["train", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
