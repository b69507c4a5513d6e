"""Flat vs patched byte students at equal training compute: one run, one table, one plot.

The same train and held-out stores (the real SmolLM2-135M teacher on KJV: chapters of Genesis to
train on, Ruth and Jonah held out), the same optimiser, schedule, α and training symbols for every
student; flat students (a Llama over symbols) and patched students (a global model over the
teacher's tokens between a small local byte encoder and decoder) of a few sizes chosen so that the
two families overlap in training FLOPs per symbol. Per student: parameters, training FLOPs per
text byte, held-out BPB, large-model steps per text byte, KV-cache bytes per text byte of
context, generation FLOPs per byte, and measured generation speed (batch 1 and batch 8, caches
on). Then a line starting ``summary`` with three ratios: large-model steps (patched / flat), BPB
at equal training FLOPs (patched - flat), generation speed at equal or better BPB (patched /
flat, batch 8). Stores and runs are cached under ``--workdir``: a rerun only measures again, and
``--only NAME …`` trains just those students (several such processes train in parallel; on a
shared CPU one thread each, ``OMP_NUM_THREADS=1``, is the fastest).

    OMP_NUM_THREADS=1 python -m benchmarks.patched [--workdir runs/patched] [--steps 64] [--batch-size 4]
    python -m benchmarks.patched --device cuda --workdir runs/patched-gpu --steps 2000 --batch-size 32 \\
        --seq-len 512 --sizes-scale 2     # the prepared GPU line
    python -m benchmarks.patched --smoke  # seconds: a check that the benchmark runs

``--smoke``: the tiny random teacher of ``benchmarks/smoke.py`` (SmolLM2's tokenizer) on 2 chapters
each, three students of width 16 to 32 trained 2 steps, short generations, in a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import smollm2_gguf
from bytedistill.cli import main as bytedistill
from examples.quickstart import flags, write_kjv_corpus

GOAL_STEPS, GOAL_SPEED, GOAL_KV = 1 / 3.5, 2.5, 1 / 3


@dataclass(frozen=True)
class Size:
    name: str
    architecture: str
    hidden: int  # the large model: the whole flat student, the patched student's global model
    layers: int
    heads: int
    local_hidden: int = 0  # patched only
    local_layers: int = 0
    local_window: int = 0

    def train_flags(self, scale: int) -> dict:
        sizes = {
            "architecture": self.architecture,
            "preset": "tiny",
            "hidden_size": self.hidden * scale,
            "num_layers": self.layers,
            "num_heads": self.heads * scale,
            "intermediate_size": 3 * self.hidden * scale,
        }
        if self.architecture == "patched":
            sizes |= {
                "local_hidden_size": self.local_hidden * scale,
                "local_layers": self.local_layers,
                "local_window": self.local_window,
            }
        return sizes


# the two families overlap in training FLOPs per symbol (printed in the table)
SIZES = [
    Size("flat-128x4", "flat", 128, 4, 4),
    Size("flat-192x4", "flat", 192, 4, 6),
    Size("flat-256x4", "flat", 256, 4, 4),
    Size("patched-256x4", "patched", 256, 4, 4, local_hidden=64, local_layers=1, local_window=64),
    Size("patched-384x4", "patched", 384, 4, 6, local_hidden=64, local_layers=1, local_window=64),
    Size("patched-512x4", "patched", 512, 4, 8, local_hidden=64, local_layers=1, local_window=64),
]
SMOKE_SIZES = [
    Size("flat-16x1", "flat", 16, 1, 1),
    Size("flat-32x1", "flat", 32, 1, 2),
    Size("patched-32x1", "patched", 32, 1, 2, local_hidden=16, local_layers=1, local_window=64),
]
# the smallest of each family: its per-step time is the overhead of a generation step
OVERHEAD = [
    Size("flat-32x1", "flat", 32, 1, 1),
    Size("patched-32x1", "patched", 32, 1, 1, local_hidden=16, local_layers=1, local_window=64),
]


@dataclass(frozen=True)
class Recipe:
    """The teacher, the stores' KJV chapters and the students of one comparison."""

    teacher: str
    teacher_name: str
    train: tuple[list[str], int]  # books, chapters
    heldout: tuple[list[str], int]
    sizes: list[Size]


def real_recipe() -> Recipe:
    return Recipe(str(smollm2_gguf()), "SmolLM2-135M", (["Genesis"], 24), (["Ruth", "Jonah"], 8), SIZES)


def smoke_recipe() -> Recipe:
    from benchmarks.smoke import TEACHER_NAME, tiny_teacher

    return Recipe(str(tiny_teacher()), TEACHER_NAME, (["Genesis"], 2), (["Ruth", "Jonah"], 2), SMOKE_SIZES)


def dump_store(work: Path, name: str, books: list[str], chapters: int, teacher: str, stream: str = "eot") -> Path:
    """A logit store of ``stream`` over the first ``chapters`` chapters of ``books`` (dump resumes: a
    rerun reuses it)."""
    from logit_store import LogitStore
    from logit_store.file_names import MANIFEST

    store = work / "store" / name
    corpus = work / "corpus" / name
    write_kjv_corpus(corpus, books, max_chapters=chapters)
    if (store / MANIFEST).is_file():
        done = LogitStore(store)
        if not done.unfinished_writers and len(done) == chapters_in(corpus / "kjv.jsonl"):
            return store  # complete: skip loading the teacher
    options = flags(
        teacher=teacher,
        corpus=corpus / "kjv.jsonl",
        output=store,
        max_length=512,
        stride=256,
        batch_tokens=4096,
        stream=stream,
    )
    if bytedistill(["dump", *options]) != 0:
        raise SystemExit(f"dump of {name} failed")
    return store


def chapters_in(corpus: Path) -> int:
    return sum(1 for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip())


def train(work: Path, size: Size, args, stores: tuple[Path, Path], run_name: str | None = None, **extra) -> Path:
    """Train (or resume) one student with the shared recipe (``extra``: ``train`` flags added or
    overridden); returns its output directory."""
    out = work / "runs" / f"{run_name or size.name}-{args.steps}x{args.batch_size}x{args.seq_len}"
    recipe = {
        "train_stores": stores[0],
        "eval_store": stores[1],
        "output_dir": out,
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "max_steps": args.steps,
        "warmup_steps": max(args.steps // 10, 1),
        "lr": 3e-3,
        "min_lr": 3e-4,
        "alpha": 0.9,
        "eval_every": 0,
        "eval_bytes": 0,
        "checkpoint_every": 0,
        "keep_checkpoints": 1,
        "resume": "latest",
        "progress": "false",
        "seed": 0,
    }
    options = flags(**recipe | size.train_flags(args.sizes_scale) | extra)
    start = time.perf_counter()
    if bytedistill(["train", *options]) != 0:
        raise SystemExit(f"training {size.name} failed")
    print(f"{size.name}: trained in {time.perf_counter() - start:.0f} s", flush=True)
    return out


def prompts(heldout: Path, batch: int, length: int) -> torch.Tensor:
    """``batch`` prompts of ``length`` symbols: the starts of the held-out documents' streams."""
    from logit_store import LogitStore

    store = LogitStore(heldout)
    rows = [store.document(i % len(store)).layout.symbols[:length] for i in range(batch)]
    return torch.tensor(np.stack(rows).astype(np.int64))


def step_time(model, device: str, prompt: torch.Tensor, new_symbols: int) -> float:
    """Seconds per generated symbol (caches on)."""
    from students.models.speed import generation_speed

    speed = generation_speed(model.to(device), prompt.to(device), new_symbols)
    return speed.seconds / speed.new_symbols


@dataclass
class Row:
    size: Size
    parameters: str
    train_flops_per_byte: float
    bpb: float
    teacher_bpb: float
    steps_per_byte: float
    kv_per_byte: float
    generate_flops_per_byte: float
    speed_b1: float  # bytes/s
    speed_b8: float
    local_cache: int  # bytes, fixed


def measure(run: Path, size: Size, rates, args, heldout: Path) -> Row:
    from students.models.architectures import student_cost
    from students.models.speed import generation_speed
    from students.release.trained_student import load_student, resolve_checkpoint

    model = load_student(resolve_checkpoint(run)).to(args.device)
    cost = student_cost(model)
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    speeds = {}
    for batch in (1, 8):
        prompt = prompts(heldout, batch, args.prompt_symbols).to(args.device)
        new_symbols = math.ceil(args.new_bytes * rates.symbols_per_byte)
        speeds[batch] = generation_speed(model, prompt, new_symbols).bytes_per_s
    return Row(
        size,
        f"{cost.parameters / 1e6:.2f}M ({cost.global_parameters / 1e6:.2f}M global)",
        cost.train_flops_per_symbol(rates, args.seq_len) * rates.symbols_per_byte,
        last["student_bpb"],
        last["teacher_bpb"],
        cost.global_steps_per_byte(rates),
        cost.kv_bytes_per_byte(rates),
        cost.generate_flops_per_symbol(rates, args.seq_len) * rates.symbols_per_byte,
        speeds[1],
        speeds[8],
        cost.local_cache_bytes(),
    )


def overhead(args, rates, heldout: Path) -> dict[str, float]:
    """Milliseconds per generation step of the smallest student of each family (batch 1, untrained)."""
    from students.models.architectures import architecture_named
    from students.models.shape import StudentShape

    out = {}
    for size in OVERHEAD:
        shape = StudentShape(**size.train_flags(1), stream="eot")  # the stores dump_store makes
        model = architecture_named(size.architecture).build(shape, seq_len=args.seq_len, seed=0)
        prompt = prompts(heldout, 1, args.prompt_symbols)
        out[size.architecture] = 1000 * step_time(model, args.device, prompt, 256)
    return out


# ------------------------------------------------------------------------------ report


def interpolate(x: float, xs: list[float], ys: list[float]) -> tuple[float, bool]:
    """``y`` at ``x`` on the piecewise-linear curve through (log x, y); ``False`` when extrapolated."""
    order = np.argsort(xs)
    lx, ly = np.log(np.asarray(xs)[order]), np.asarray(ys)[order]
    inside = lx[0] <= math.log(x) <= lx[-1]
    if inside:
        return float(np.interp(math.log(x), lx, ly)), True
    i = (0, 1) if math.log(x) < lx[0] else (-2, -1)
    slope = (ly[i[1]] - ly[i[0]]) / (lx[i[1]] - lx[i[0]])
    return float(ly[i[0]] + slope * (math.log(x) - lx[i[0]])), False


def report(rows: list[Row], overheads: dict[str, float], rates, args, recipe: Recipe, plot: Path) -> list[str]:
    flat = [r for r in rows if r.size.architecture == "flat"]
    patched = [r for r in rows if r.size.architecture == "patched"]
    lines = [
        (
            f"held-out BPB on {', '.join(recipe.heldout[0])} "
            f"(teacher {recipe.teacher_name}: {rows[0].teacher_bpb:.3f}); "
            f"train: {recipe.train[1]} chapters of {', '.join(recipe.train[0])}, "
            f"{args.steps} steps x {args.batch_size} x {args.seq_len} symbols, "
            f"alpha 0.9, same schedule; data: {rates.symbols_per_byte:.3f} symbols and {rates.patches_per_byte:.3f} "
            f"patches per text byte"
        ),
        (
            f"generation: {args.new_bytes} new bytes after {args.prompt_symbols}-symbol prompts, greedy, caches on, "
            f"{args.device} with {torch.get_num_threads()} threads; per-step overhead (smallest model of each family, "
            f"batch 1): flat {overheads['flat']:.1f} ms, patched {overheads['patched']:.1f} ms"
        ),
        (
            f"{'student':<16}{'parameters':>24}{'train FLOPs/B':>15}{'BPB':>8}{'steps/B':>9}{'KV B/B':>9}"
            f"{'gen FLOPs/B':>13}{'B/s b1':>9}{'B/s b8':>9}"
        ),
    ]
    for r in rows:
        lines.append(
            f"{r.size.name:<16}{r.parameters:>24}{r.train_flops_per_byte:>15.3g}{r.bpb:>8.3f}{r.steps_per_byte:>9.3f}"
            f"{r.kv_per_byte:>9,.0f}{r.generate_flops_per_byte:>13.3g}{r.speed_b1:>9,.0f}{r.speed_b8:>9,.0f}"
        )
    local = sorted({r.local_cache for r in patched})
    lines.append(
        f"(generation FLOPs at a {args.seq_len}-symbol context; KV B/B counts what each byte of context adds, "
        f"the patched local caches hold a fixed {', '.join(f'{n:,}' for n in local)} bytes whatever the context)"
    )
    steps_ratio = max(p.steps_per_byte for p in patched) / min(f.steps_per_byte for f in flat)
    differences = []
    for p in patched:
        at, inside = interpolate(p.train_flops_per_byte, [f.train_flops_per_byte for f in flat], [f.bpb for f in flat])
        differences.append(p.bpb - at)
        lines.append(
            f"{p.size.name}: BPB {p.bpb:.3f} vs flat {at:.3f} at its training FLOPs "
            f"({'interpolated' if inside else 'extrapolated'}): difference {p.bpb - at:+.3f}"
        )
    speed_ratio, kv_ratio, basis = speed_comparison(flat, patched)
    lines.append(basis)
    lines.append(
        f"summary: large-model steps per byte patched/flat {steps_ratio:.3f} (goal <= {GOAL_STEPS:.3f}); "
        f"BPB patched - flat at equal training FLOPs {', '.join(f'{d:+.3f}' for d in differences)} (goal <= 0); "
        f"generation bytes/s patched/flat at batch 8 {speed_ratio:.2f} (goal >= {GOAL_SPEED}), "
        f"KV bytes per byte {kv_ratio:.3f} (goal <= {GOAL_KV:.3f})"
    )
    save_plot(rows, plot, recipe.teacher_name)
    plot.with_suffix(".txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return lines


def speed_comparison(flat: list[Row], patched: list[Row]) -> tuple[float, float, str]:
    """Batch-8 speed and KV ratios of a patched student over a flat one of equal or worse BPB
    (the fastest such pair); without one, over the flat student of the nearest parameter count."""
    pairs = [(p, f) for p in patched for f in flat if p.bpb <= f.bpb]
    if pairs:
        p, f = max(pairs, key=lambda pf: pf[0].speed_b8 / pf[1].speed_b8)
        basis = f"speed at equal or better BPB: {p.size.name} ({p.bpb:.3f}) vs {f.size.name} ({f.bpb:.3f})"
    else:
        p = min(patched, key=lambda r: r.bpb)

        def count(r: Row) -> float:
            return float(r.parameters.split("M")[0])

        f = min(flat, key=lambda r: abs(math.log(count(r) / count(p))))
        basis = (
            f"no patched student reaches a flat student's BPB here: speed of the best patched, {p.size.name} "
            f"({p.bpb:.3f}), vs the flat student nearest in parameters, {f.size.name} ({f.bpb:.3f})"
        )
    basis += f": batch 8 {p.speed_b8:,.0f} vs {f.speed_b8:,.0f} B/s, batch 1 {p.speed_b1:,.0f} vs {f.speed_b1:,.0f} B/s"
    return p.speed_b8 / f.speed_b8, p.kv_per_byte / f.kv_per_byte, basis


def save_plot(rows: list[Row], path: Path, teacher_name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for architecture, marker in (("flat", "o"), ("patched", "s")):
        family = [r for r in rows if r.size.architecture == architecture]
        for axis, x in ((left, [r.speed_b8 for r in family]), (right, [r.generate_flops_per_byte for r in family])):
            axis.plot(x, [r.bpb for r in family], marker=marker, label=architecture)
            for r, xi in zip(family, x):
                axis.annotate(r.size.name, (xi, r.bpb), textcoords="offset points", xytext=(4, 4), fontsize=7)
    left.set_xlabel("generation bytes/s, batch 8 (measured, CPU)")
    right.set_xlabel("generation FLOPs per byte")
    right.set_xscale("log")
    left.set_ylabel("held-out BPB")
    left.legend()
    fig.suptitle(f"flat vs patched byte students ({teacher_name} teacher, KJV)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--workdir", type=Path, default=Path("runs/patched"), help="stores, runs and the plot go here")
    parser.add_argument("--steps", type=int, default=64, help="optimizer steps per student")
    parser.add_argument("--batch-size", type=int, default=4, help="sequences per step")
    parser.add_argument("--seq-len", type=int, default=256, help="symbols per sequence")
    parser.add_argument("--sizes-scale", type=int, default=1, help="multiply every width by this (GPU runs)")
    parser.add_argument("--new-bytes", type=int, default=512, help="bytes to generate per row when timing")
    parser.add_argument("--prompt-symbols", type=int, default=32, help="prompt length when timing")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (training and timing)")
    parser.add_argument(
        "--only", nargs="*", default=None, help="train only these students (by name) and stop: runs in parallel"
    )
    parser.add_argument("--plot", type=Path, default=None, help="PNG path (default: WORKDIR/patched.png)")
    parser.add_argument("--smoke", action="store_true", help="toy sizes in a temporary folder (seconds): a check")
    args = parser.parse_args()
    if not args.smoke:
        compare(args, real_recipe())
        return
    args.steps, args.batch_size, args.seq_len, args.sizes_scale, args.device = 2, 2, 64, 1, "cpu"
    args.new_bytes, args.prompt_symbols, args.only = 32, 8, None
    with tempfile.TemporaryDirectory() as tmp:
        args.workdir, args.plot = Path(tmp), None
        compare(args, smoke_recipe())


def compare(args, recipe: Recipe) -> None:
    """Dump the stores, train the students (or only ``args.only``), measure them and print the report."""
    if args.device == "cpu":
        os.environ["ACCELERATE_USE_CPU"] = "1"  # train on the CPU too

    from students.models.cost import StreamRates, rates_of_stores

    work = args.workdir
    stores = tuple(
        dump_store(work, name, *books, recipe.teacher)
        for name, books in (("train", recipe.train), ("heldout", recipe.heldout))
    )
    rates = StreamRates(**rates_of_stores([stores[0]]))
    if args.only is not None:
        for size in recipe.sizes:
            if size.name in args.only:
                train(work, size, args, stores)
        return
    runs = [(size, train(work, size, args, stores)) for size in recipe.sizes]
    torch.manual_seed(0)
    overheads = overhead(args, rates, stores[1])
    rows = [measure(run, size, rates, args, stores[1]) for size, run in runs]
    print("\n".join(report(rows, overheads, rates, args, recipe, args.plot or work / "patched.png")))


if __name__ == "__main__":
    main()
