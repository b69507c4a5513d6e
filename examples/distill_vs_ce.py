"""Does distillation pay? The same byte student trained twice on the same bytes: distilled from
the SmolLM2-135M teacher's exact byte distributions (alpha = 0.95 by default) and with
cross-entropy only (alpha = 0), evaluated on held-out books at regular byte counts.

Train text: the books of Genesis and Exodus (KJV), or with ``--train-chapters N`` only the first N
chapters of Genesis (the data-limited regime: many epochs over little text); held out: Ruth,
Esther and Jonah. Prints a table of held-out BPB against training bytes, how many bytes the
distilled student needs to reach the CE-only student's final and best BPB, and saves a plot.
Stores and runs are cached under ``--workdir``, so a rerun continues where it stopped, and a
variant (``--alpha``, ``--temperature``) retrains only the distilled student.

    python -m examples.distill_vs_ce [--workdir runs/distill_vs_ce] [--steps 600] [--preset small]
                                    [--train-chapters N] [--alpha 0.95] [--temperature 1]
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

from benchmarks.common import smollm2_gguf
from bytedistill.cli import main as bytedistill
from examples.quickstart import flags, write_kjv_corpus
from logit_store import LogitStore

TRAIN_BOOKS = ["Genesis", "Exodus"]
HELDOUT_BOOKS = ["Ruth", "Esther", "Jonah"]


def dump(work: Path, teacher: str, name: str, books: list[str], max_chapters: int) -> Path:
    corpus = work / "corpus" / name
    write_kjv_corpus(corpus, books, max_chapters=max_chapters)
    store = work / "store" / name
    options = flags(
        teacher=teacher, corpus=corpus / "kjv.jsonl", output=store, max_length=1024, stride=256, batch_tokens=4096
    )
    if bytedistill(["dump", *options]) != 0:
        raise SystemExit(f"dump of {name} failed")
    return store


def train(work: Path, train_store: Path, name: str, alpha: float, temperature: float, args) -> list[dict]:
    out = work / "runs" / name
    options = flags(
        train_stores=train_store,
        eval_store=work / "store/heldout",
        output_dir=out,
        stream="fused",  # the fused student, as the recorded rows
        preset=args.preset,
        seq_len=256,
        batch_size=args.batch_size,
        max_steps=args.steps,
        warmup_steps=50,
        lr=2e-3,
        min_lr=2e-4,
        alpha=alpha,
        temperature=temperature,
        eval_every=args.eval_every,
        eval_bytes=0,
        checkpoint_every=args.eval_every,
        keep_checkpoints=1,
        resume="latest",
        seed=0,
    )
    if bytedistill(["train", *options]) != 0:
        raise SystemExit(f"training {name} failed")
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def bytes_to_reach(curve: list[dict], target: float) -> float | None:
    """Training bytes at which the curve first reaches ``target`` BPB (linear interpolation)."""
    for before, after in itertools.pairwise(curve):
        if after["student_bpb"] <= target:
            span = before["student_bpb"] - after["student_bpb"]
            frac = (before["student_bpb"] - target) / span if span > 0 else 1.0
            return before["train_bytes"] + frac * (after["train_bytes"] - before["train_bytes"])
    return None


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument(
        "--workdir", type=Path, default=Path("runs/distill_vs_ce"), help="stores, runs and the plot go here"
    )
    parser.add_argument("--preset", default="small", help="student size preset (small: 5.2M parameters)")
    parser.add_argument("--steps", type=int, default=600, help="optimizer steps per run")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences of 256 symbols per step")
    parser.add_argument("--eval-every", type=int, default=50, help="evaluate on the held-out books every N steps")
    parser.add_argument(
        "--train-chapters",
        type=int,
        default=0,
        help="train on only the first N chapters of Genesis (0: all of Genesis and Exodus); "
        "fewer chapters = more epochs over the same text, the data-limited regime",
    )
    parser.add_argument("--alpha", type=float, default=0.95, help="KL weight of the distilled run (the baseline has 0)")
    parser.add_argument("--temperature", type=float, default=1.0, help="distillation temperature of the distilled run")
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="PNG path, the table goes next to it as .txt (default: WORKDIR/distill_vs_ce-<run>.png)",
    )
    args = parser.parse_args()

    work = args.workdir
    teacher = str(smollm2_gguf())
    if args.train_chapters:
        train_name, train_books, chapters = f"train-genesis{args.train_chapters}", ["Genesis"], args.train_chapters
    else:
        train_name, train_books, chapters = "train", TRAIN_BOOKS, 10_000
    train_store = dump(work, teacher, train_name, train_books, chapters)
    dump(work, teacher, "heldout", HELDOUT_BOOKS, 10_000)
    run = f"{train_name}-{args.preset}-{args.steps}steps" + ("" if args.batch_size == 16 else f"-bs{args.batch_size}")
    variant = "" if (args.alpha, args.temperature) == (0.95, 1.0) else f"-a{args.alpha:g}-T{args.temperature:g}"
    distilled = train(work, train_store, f"{run}/distilled{variant}", args.alpha, args.temperature, args)
    baseline = train(work, train_store, f"{run}/ce_only", 0.0, 1.0, args)
    text_bytes = LogitStore(train_store).stats()["text_bytes"]
    label = f"distilled (alpha {args.alpha:g}, T {args.temperature:g})"
    report(distilled, baseline, text_bytes, label, args.plot or work / f"distill_vs_ce-{run}{variant}.png")


def report(distilled: list[dict], baseline: list[dict], text_bytes: int, label: str, plot: Path) -> None:
    """Print the table and the summary, and save them (``.txt``) and the plot (``.png``)."""
    teacher_bpb = distilled[-1]["teacher_bpb"]
    lines = [
        f"held-out BPB (Ruth, Esther, Jonah); teacher SmolLM2-135M: {teacher_bpb:.3f}; train text {text_bytes:,} bytes",
        f"{label} vs. cross-entropy only (alpha 0)",
        f"{'step':>6}{'train bytes':>14}{'epochs':>8}{'distilled':>12}{'CE only':>12}{'KL (distilled)':>16}",
    ]
    for d, b in zip(distilled, baseline):
        lines.append(
            f"{d['step']:>6}{d['train_bytes']:>14,}{d['train_bytes'] / text_bytes:>8.1f}"
            f"{d['student_bpb']:>12.3f}{b['student_bpb']:>12.3f}{d['kl_per_byte']:>16.3f}"
        )
    total = baseline[-1]["train_bytes"]
    best = min(baseline, key=lambda c: c["student_bpb"])
    for what, target in (("final", baseline[-1]["student_bpb"]), (f"best (step {best['step']})", best["student_bpb"])):
        needed = bytes_to_reach(distilled, target)
        if needed is None:
            lines.append(f"the distilled student never reaches the CE-only {what} BPB {target:.3f}")
        else:
            lines.append(
                f"distilled reaches the CE-only {what} BPB {target:.3f} after {needed:,.0f} of {total:,} bytes: "
                f"ratio {needed / total:.2f} (goal <= 0.33)"
            )
    lines.append(
        f"final BPB: distilled {distilled[-1]['student_bpb']:.3f}, CE only {baseline[-1]['student_bpb']:.3f}; "
        f"best: distilled {min(c['student_bpb'] for c in distilled):.3f}, CE only {best['student_bpb']:.3f}"
    )
    save_plot(distilled, baseline, teacher_bpb, text_bytes, label, plot)
    plot.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))
    print(f"plot: {plot}; table: {plot.with_suffix('.txt')}")


def save_plot(distilled, baseline, teacher_bpb: float, text_bytes: int, label: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for curve, name in ((distilled, label), (baseline, "cross-entropy only")):
        ax.plot(
            [c["train_bytes"] / 1e6 for c in curve], [c["student_bpb"] for c in curve], marker="o", ms=3, label=name
        )
    ax.axhline(teacher_bpb, color="gray", linestyle="--", label=f"teacher SmolLM2-135M ({teacher_bpb:.2f})")
    ax.set_xlabel("training bytes (millions)")
    ax.set_ylabel("held-out bits per byte")
    ax.set_ylim(0, min(8.5, max(c["student_bpb"] for c in distilled + baseline) + 0.2))
    ax.set_title(f"Byte student, {text_bytes / 1e3:.0f} KB of KJV text: distillation vs. cross-entropy")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


if __name__ == "__main__":
    main()
