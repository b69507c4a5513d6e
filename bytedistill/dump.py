"""``bytedistill dump``: the command line over :func:`distill.dump.run.run_dump` (imported when it runs: ``--help`` loads no torch)."""

from __future__ import annotations

from distill.dump.config import DumpConfig


def dump(config: DumpConfig) -> int:
    """Run a teacher over a corpus and write a logit store.

    Writes the teacher's exact next-byte distributions into a logit store. Rerun the same command
    to resume a killed run; use `accelerate launch` or --num-shards/--shard-index to split the work.
    """
    from distill.dump.run import run_dump

    summary = run_dump(config)
    print("\n".join(summary.lines()))
    return 0
