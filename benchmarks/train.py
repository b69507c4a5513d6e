"""Benchmark of distillation's cost per training step (not a test): the same student on the same
store (benchmarks/train_data.py) trained with α = 0.9 (KL to the teacher + CE: teacher rows read,
densified, moved and scored) and with α = 0 (CE only: no teacher values read).

Both runs are started with the trainer's own ``settle`` and ``start_run`` and advanced by its ``train_step``,
one step of each in turn, so that a shared machine's changing load falls on both alike; the
figures are medians of the per-step times after a warm-up. With ``--num-workers 0`` (default)
the data path runs inside the step and is counted in full. Runs on the device accelerate picks
(the GPU when there is one; ``CUDA_VISIBLE_DEVICES= python -m benchmarks.train`` for the CPU).

    python -m benchmarks.train [--kilobytes 100] [--steps 12] [--warmup 2] [--num-workers 0] [--smoke] [--markdown]

``--smoke``: a 10 KB store, 2 steps of each after 1, tiny sequences: seconds, a check that it runs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.train_data import SMOKE_KILOBYTES, benchmark_store

ALPHAS = (0.9, 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--kilobytes", type=int, default=100, help="KB of KJV text in the store")
    parser.add_argument("--steps", type=int, default=12, help="timed steps of each run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps of each run first")
    parser.add_argument("--preset", default="tiny", help="student size preset")
    parser.add_argument("--seq-len", type=int, default=256, help="symbols per sequence")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader workers")
    parser.add_argument("--mixed-precision", default="no", choices=["no", "bf16"], help="autocast dtype")
    parser.add_argument("--smoke", action="store_true", help="toy sizes (seconds): a check that the benchmark runs")
    parser.add_argument("--markdown", action="store_true", help="write the table into docs/RESULTS.md")
    args = parser.parse_args()
    if args.smoke:
        args.kilobytes, args.steps, args.warmup, args.seq_len, args.batch_size = SMOKE_KILOBYTES, 2, 1, 64, 2
    import torch
    from accelerate import Accelerator

    from logit_store import LogitStore
    from students.models.shape import StudentShape
    from students.training.batch_source import STORE_SOURCE, BatchConfig
    from students.training.loss import LossConfig
    from students.training.trainer import LogConfig, TrainConfig, settle, start_run, train_step

    store = benchmark_store(args.kilobytes)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    times: dict[float, list[float]] = {alpha: [] for alpha in ALPHAS}
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for alpha in ALPHAS:
            config = TrainConfig(
                train_stores=[str(store)],
                output_dir=str(Path(tmp) / f"alpha-{alpha}"),
                student=StudentShape(preset=args.preset, stream=LogitStore(store).stream.value),
                batches=BatchConfig(seq_len=args.seq_len, batch_size=args.batch_size, num_workers=args.num_workers),
                max_steps=args.warmup + args.steps,
                loss=LossConfig(alpha=alpha),
                logging=LogConfig(progress=False),
                mixed_precision=args.mixed_precision,
            )
            accelerator = Accelerator(mixed_precision=args.mixed_precision)
            runs[alpha] = start_run(settle(config), STORE_SOURCE, accelerator)[0]
        for step in range(args.warmup + args.steps):
            for alpha, run in runs.items():
                start = time.perf_counter()
                train_step(run)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                if step >= args.warmup:
                    times[alpha].append(time.perf_counter() - start)
    print(
        f"device: {device}; {args.preset} preset, seq {args.seq_len} x batch {args.batch_size}, "
        f"{args.num_workers} workers, mixed precision {args.mixed_precision}, {args.steps} timed steps each"
    )
    print("alpha | median s/step | steps/s | min s/step")
    median = {alpha: statistics.median(t) for alpha, t in times.items()}
    rows = []
    for alpha, t in times.items():
        print(f"{alpha:<5} | {median[alpha]:>13.4f} | {1 / median[alpha]:>7.2f} | {min(t):.4f}")
        rows.append([f"{alpha}", f"{median[alpha]:.4f}", f"{1 / median[alpha]:.2f}", f"{min(t):.4f}"])
    print(
        f"ratio {median[0.9] / median[0.0]:.2f} (KD time per step / CE time per step, medians; goal <= 1.10 on CPU; "
        f"device {device})"
    )
    if args.markdown and not args.smoke:
        from benchmarks.results import markdown_table, write_section

        write_section("train", markdown_table(["alpha", "median s/step", "steps/s", "min s/step"], rows))


if __name__ == "__main__":
    main()
