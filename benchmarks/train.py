"""Benchmark of distillation's cost per training step (not a test): the same student on the same
store (benchmarks/train_data.py) trained with α = 0.9 (KL to the teacher + CE: teacher rows read,
moved and scored) and with α = 0 (CE only: no teacher values read).

Time per step = (time of a long run − time of a short run) / (difference in steps), so start-up,
the first evaluation and the final checkpoint cancel. Runs on the device accelerate picks (the
GPU when there is one; ``CUDA_VISIBLE_DEVICES= python -m benchmarks.train`` for the CPU).

    python -m benchmarks.train [--kilobytes 100] [--steps 5 20] [--num-workers 1]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks.train_data import benchmark_store


def seconds(store: Path, out: Path, alpha: float, steps: int, args: argparse.Namespace) -> float:
    from students.trainer import TrainConfig, train

    config = TrainConfig(
        train_stores=[str(store)], output_dir=str(out), preset="tiny", seq_len=args.seq_len, batch_size=args.batch_size,
        max_steps=steps, alpha=alpha, num_workers=args.num_workers, eval_every=0, checkpoint_every=0,
        log_every=10**9, progress=False, mixed_precision=args.mixed_precision,
    )  # fmt: skip
    start = time.perf_counter()
    train(config)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kilobytes", type=int, default=100, help="KB of KJV text in the store")
    parser.add_argument("--steps", type=int, nargs=2, default=[5, 20], help="short and long run, in steps")
    parser.add_argument("--seq-len", type=int, default=256, help="symbols per sequence")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    parser.add_argument("--num-workers", type=int, default=1, help="DataLoader workers")
    parser.add_argument("--mixed-precision", default="no", choices=["no", "bf16"], help="autocast dtype")
    args = parser.parse_args()
    import torch

    store = benchmark_store(args.kilobytes)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    short, long = args.steps
    per_step = {}
    print(f"device: {device}; tiny preset, seq {args.seq_len} x batch {args.batch_size}, {args.num_workers} workers, "
          f"mixed precision {args.mixed_precision}")  # fmt: skip
    print("alpha | s/step | steps/s")
    with tempfile.TemporaryDirectory() as tmp:
        for alpha in (0.9, 0.0):
            times = [seconds(store, Path(tmp) / f"a{alpha}-{steps}", alpha, steps, args) for steps in (short, long)]
            per_step[alpha] = (times[1] - times[0]) / (long - short)
            print(f"{alpha:<5} | {per_step[alpha]:.4f} | {1 / per_step[alpha]:.2f}")
    ratio = per_step[0.9] / per_step[0.0]
    print(f"ratio {ratio:.2f} (KD time per step / CE time per step; goal <= 1.10 on CPU; device {device}; "
          "timed on a shared, loaded machine)")


if __name__ == "__main__":
    main()
