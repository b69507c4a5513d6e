"""``bytedistill dump``: the command line over :func:`distill.dump.run_dump`."""

from __future__ import annotations

import argparse

from distill.config import add_config_arguments, config_from_args
from distill.dump import DumpConfig, run_dump


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "dump",
        help="run a teacher over a corpus and write a logit store",
        description=(
            "Run a teacher over a corpus and write its exact next-byte distributions into a logit "
            "store. Rerun the same command to resume a killed run; use `accelerate launch` or "
            "--num-shards/--shard-index to split the work."
        ),
    )
    add_config_arguments(parser, DumpConfig)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    summary = run_dump(config_from_args(DumpConfig, args))
    print("\n".join(summary.lines()))
    return 0
