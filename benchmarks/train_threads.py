"""Training speed by torch thread count, on the machine as it is now (loaded or not).

    python -m benchmarks.train_threads [TRAIN_STORE] [--steps 30] [--rounds 1]

Trains the quickstart's student (tiny preset, seq 256 × batch 16) for ``--steps`` steps in a fresh
process per setting: ``OMP_NUM_THREADS=1``, ``OMP_NUM_THREADS=<CPUs>`` (torch's own default here)
and unset (bytedistill's default: the CPUs other running tasks leave free), the settings
interleaved over ``--rounds``; prints each run's wall seconds (process start included) and
the load average when it started.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from distill.threads import available_cpus

TRAIN = "import sys; from distill.cli import main; sys.exit(main(sys.argv[1:]))"


def run(store: Path, steps: int, threads: str | None) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "TORCH_NUM_THREADS")}
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    with tempfile.TemporaryDirectory() as out:
        args = ["train", "--train-stores", str(store), "--output-dir", out, "--preset", "tiny", "--seq-len", "256"]
        args += ["--batch-size", "16", "--max-steps", str(steps), "--eval-every", "0", "--checkpoint-every", "0"]
        args += ["--log-every", "1", "--progress", "false"]
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", TRAIN, *args], env=env, check=True, capture_output=True)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store", nargs="?", type=Path, default=Path("runs/quickstart/store/train"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    cpus = available_cpus()
    settings = {
        "OMP_NUM_THREADS=1": "1",
        f"OMP_NUM_THREADS={cpus} (torch's default)": str(cpus),
        "unset (bytedistill's default)": None,
    }
    seconds: dict[str, list[float]] = {name: [] for name in settings}
    loads: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(args.rounds):
        for name, threads in settings.items():
            loads[name].append(os.getloadavg()[0])
            seconds[name].append(run(args.store, args.steps, threads))
    print(f"{args.steps} training steps per run, {cpus} CPUs available, wall seconds per run (process start included)")
    print("| threads | seconds | load average at start |")
    print("|---|---|---|")
    for name in settings:
        print(
            f"| {name} | {' / '.join(f'{s:.0f}' for s in seconds[name])} | {' / '.join(f'{x:.1f}' for x in loads[name])} |"
        )
    best = {name: min(values) for name, values in seconds.items()}
    names = list(settings)
    print(
        f"summary: {names[1]} / {names[0]} = {best[names[1]] / best[names[0]]:.2f}; "
        f"{names[2]} / {names[0]} = {best[names[2]] / best[names[0]]:.2f}"
    )


if __name__ == "__main__":
    main()
