"""Seconds per training step by torch thread count, on the machine as it is now (loaded or not).

    python -m benchmarks.train_threads [--steps 5] [--rounds 2] [--smoke] [--markdown]

The quickstart's student (tiny preset, seq 256 × batch 16, random batches; forward, backward and
an AdamW step, where torch's intra-op threads do their work) in one process, the thread counts
interleaved over ``--rounds`` so that every setting sees the same load: 1 thread, one per CPU this
process may use (torch's own default here), and bytedistill's default (``common.threads``: the
CPUs other running tasks leave free). Prints the median seconds per step and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks.results import markdown_table, write_section
from common.threads import available_cpus, default_threads
from students.models.llama import build_student, student_config


def step_seconds(model, optimizer, batch: torch.Tensor, threads: int, steps: int) -> list[float]:
    torch.set_num_threads(threads)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="steps per setting and round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the settings")
    parser.add_argument("--smoke", action="store_true", help="toy sizes (seconds): a check that the benchmark runs")
    parser.add_argument("--markdown", action="store_true", help="write the table into docs/RESULTS.md")
    args = parser.parse_args()
    seq_len, batch_size = (64, 2) if args.smoke else (256, 16)
    if args.smoke:
        args.steps, args.rounds = 1, 1
    model = build_student(student_config("tiny", max_positions=seq_len), seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = torch.randint(0, 256, (batch_size, seq_len))
    cpus = available_cpus()
    chosen, why = default_threads()
    settings = {
        "1 thread": 1,
        f"{cpus} threads (one per CPU: torch's default)": cpus,
        f"bytedistill's default ({chosen}: {why})": chosen,
    }
    times: dict[str, list[float]] = {name: [] for name in settings}
    loads = []
    step_seconds(model, optimizer, batch, 1, 1)  # warm-up
    for _ in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for name, threads in settings.items():
            times[name] += step_seconds(model, optimizer, batch, threads, args.steps)
    print(
        f"{args.rounds} rounds × {args.steps} steps per setting; load average {', '.join(f'{x:.1f}' for x in loads)} "
        f"on {cpus} CPUs"
    )
    median = {name: statistics.median(values) for name, values in times.items()}
    table = markdown_table(["torch threads", "median seconds per step"], [[n, f"{median[n]:.3f}"] for n in settings])
    print(table)
    if args.markdown and not args.smoke:
        write_section("train_threads", table)
    one, per_cpu, ours = (median[name] for name in settings)
    print(f"summary: one per CPU / 1 thread = {per_cpu / one:.2f}; bytedistill's default / 1 thread = {ours / one:.2f}")


if __name__ == "__main__":
    main()
