"""Which student to train for a training budget: flat vs patched families, each stream, one run, one table.

The real SmolLM2-135M teacher dumps a training store of KJV books (by default all but the held-out
ones, about 4.3 MB of text) and a held-out store of books not in it (Ruth and Jonah), once per
stream, under ``--workdir`` (a rerun reuses them; a dump resumes). At each of three training
budgets in FLOPs, every student size of every family (architecture × stream, two sizes or more each)
trains for as many symbols as the budget pays for: at least ``--min-steps`` steps of ``--seq-len``
symbols, the batch as large as that allows. One learning-rate sweep (``--lrs``) per family, on its
smaller size at the smallest budget, picks the rate every budget of that family uses; nothing else
differs between families (optimiser, schedule shape, α, sequence length, evaluation).

Per run: parameters, steps × batch, training FLOPs per text byte (the model's) and in all (the
run's), passes over the training text, held-out BPB at the end, large-model steps per byte,
generation bytes/s at batch 1 and 8 (greedy, caches on, measured once per size and stream) and
the training time. Then each family's frontier (its best BPB at each budget), and a line starting
``summary``: the patched family's best minus the flat family's at each budget (and where the two
cross), and the patched student's training FLOPs per byte over the flat one's at equal parameters.

    python -m benchmarks.budget [--workdir runs/budget] [--markdown]        # hours on 2 CPUs
    python -m benchmarks.budget --streams fused      # fused only: about 2 hours on 2 CPUs
    python -m benchmarks.budget --train-books Genesis Exodus --budgets 5.2e11 1.6e12 4.7e12 \\
        --min-steps 100      # a reduced run: two books, budgets a third as large
    python -m benchmarks.budget --device cuda --workdir runs/budget-gpu --budgets 5e14 1.5e15 4.5e15 \\
        --sizes-scale 2      # the prepared GPU line
    python -m benchmarks.budget --smoke  # seconds: a check that the benchmark runs

``--dump-only`` dumps the stores and stops (a dump can run beside other work); ``--streams eot``
leaves the fused families out.
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

import torch

from benchmarks.patched import Size, dump_store, interpolate, prompts, train
from benchmarks.results import markdown_table, write_section

HELDOUT_BOOKS = ["Ruth", "Jonah"]
# training FLOPs per run: at the largest, the student cheapest per byte reads the training text at most
# about twice (its passes and the runs' times: docs/RESULTS.md, "Training budget")
BUDGETS = (1.6e12, 4.7e12, 1.4e13)
LRS = (1e-3, 3e-3, 1e-2)
# each family's sizes, smallest first (patched-128x4 is the patched `tiny` preset); flat-256x4 gives every
# patched size a flat size near its parameter count (FLOPs per byte at equal parameters: interpolated, or
# extrapolated a little); why these sizes: docs/RESULTS.md, "Training budget"
SIZES = [
    Size("flat-64x4", "flat", 64, 4, 2),
    Size("flat-128x4", "flat", 128, 4, 4),
    Size("flat-256x4", "flat", 256, 4, 4),
    Size("patched-128x4", "patched", 128, 4, 4, local_hidden=64, local_layers=1, local_window=64),
    Size("patched-256x4", "patched", 256, 4, 4, local_hidden=64, local_layers=1, local_window=64),
]
SMOKE_SIZES = [
    Size("flat-16x1", "flat", 16, 1, 1),
    Size("flat-32x1", "flat", 32, 1, 2),
    Size("patched-32x1", "patched", 32, 1, 2, local_hidden=16, local_layers=1, local_window=64),
    Size("patched-48x1", "patched", 48, 1, 2, local_hidden=16, local_layers=1, local_window=64),
]
ARCHITECTURES = ("flat", "patched")


@dataclass(frozen=True)
class Stores:
    stream: str
    train: Path
    heldout: Path
    text_bytes: int  # of the training store
    rates: object  # StreamRates of the training store


@dataclass(frozen=True)
class Run:
    """One training run: a size on a stream at a budget, with its learning rate."""

    size: Size
    stream: str
    budget: float
    lr: float
    steps: int
    batch: int

    @property
    def family(self) -> str:
        return family_name(self.size.architecture, self.stream)

    @property
    def name(self) -> str:
        return f"{self.size.name}-{self.stream}-{self.budget:.2g}-lr{self.lr:g}"


@dataclass
class Row:
    run: Run
    parameters: float
    train_flops_per_byte: float
    run_flops: float
    passes: float
    bpb: float
    teacher_bpb: float
    global_steps_per_byte: float
    speed_b1: float
    speed_b8: float
    train_seconds: float | None


def family_name(architecture: str, stream: str) -> str:
    return f"{architecture} ({'<eot>' if stream == 'eot' else stream})"


# ------------------------------------------------------------------------------ stores


def all_books() -> list[str]:
    """The KJV's books in their order."""
    from benchmarks.common import kjv_chapters

    return list(dict.fromkeys(key.rsplit(" ", 1)[0] for key, _ in kjv_chapters()))


def dumped(work: Path, args, stream: str) -> Stores:
    """The stream's training and held-out stores (dumped unless complete)."""
    from logit_store import LogitStore
    from students.models.cost import StreamRates, rates_of_stores

    train_store = dump_store(work, f"train-{stream}", *args.train, args.teacher, stream=stream)
    heldout_store = dump_store(work, f"heldout-{stream}", *args.heldout, args.teacher, stream=stream)
    text_bytes = LogitStore(train_store).stats()["text_bytes"]
    return Stores(stream, train_store, heldout_store, text_bytes, StreamRates(**rates_of_stores([train_store])))


# ------------------------------------------------------------------------------ runs


def flops_per_symbol(size: Size, stores: Stores, args) -> float:
    """Training FLOPs per symbol of ``size`` on ``stores``' stream (from an untrained model's shape)."""
    from students.models.architectures import architecture_named, student_cost
    from students.models.shape import StudentShape

    shape = StudentShape(**size.train_flags(args.sizes_scale), stream=stores.stream)
    model = architecture_named(size.architecture).build(shape, seq_len=args.seq_len, seed=0)
    return student_cost(model).train_flops_per_symbol(stores.rates, args.seq_len)


def planned(size: Size, stores: Stores, budget: float, lr: float, args) -> Run:
    """The run that spends ``budget``: at least ``args.min_steps`` steps, the batch as large as that allows."""
    symbols = budget / flops_per_symbol(size, stores, args)
    batch = max(1, math.floor(symbols / (args.min_steps * args.seq_len)))
    steps = max(1, round(symbols / (batch * args.seq_len)))
    return Run(size, stores.stream, budget, lr, steps, batch)


def train_run(work: Path, run: Run, stores: Stores, args) -> Path:
    """Train (or resume) ``run``; its training time is kept in ``WORKDIR/train_seconds.json``."""
    from students.training.optim import WARMUP_FRACTION

    run_args = argparse.Namespace(**{**vars(args), "steps": run.steps, "batch_size": run.batch})
    start = time.perf_counter()
    out = train(
        work,
        run.size,
        run_args,
        (stores.train, stores.heldout),
        run_name=run.name,
        stream=run.stream,
        lr=run.lr,
        min_lr=run.lr / 10,
        warmup_steps=max(1, round(WARMUP_FRACTION * run.steps)),
    )
    seconds = kept_seconds(work)
    if run.name not in seconds:  # the first (whole) training of this run, not a reuse
        kept_seconds(work, {run.name: time.perf_counter() - start})
    return out


def kept_seconds(work: Path, seconds: dict[str, float] | None = None) -> dict[str, float]:
    path = work / "train_seconds.json"
    kept = json.loads(path.read_text()) if path.is_file() else {}
    if seconds:
        kept |= seconds
        path.write_text(json.dumps(kept, indent=1))
    return kept


def final_bpb(out: Path) -> tuple[float, float]:
    """(student, teacher) held-out BPB of the run's last evaluation."""
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    return last["student_bpb"], last["teacher_bpb"]


def sweep(work: Path, sizes: list[Size], stores: dict[str, Stores], args) -> dict[str, float]:
    """Each family's learning rate: the best held-out BPB of its smaller size at the smallest budget."""
    chosen = {}
    for stream, store in stores.items():
        for architecture in ARCHITECTURES:
            size = min((s for s in sizes if s.architecture == architecture), key=lambda s: s.hidden)
            results = []
            for lr in args.lrs:
                run = planned(size, store, min(args.budgets), lr, args)
                results.append((final_bpb(train_run(work, run, store, args))[0], lr))
                print(f"sweep {run.name}: held-out BPB {results[-1][0]:.3f}", flush=True)
            chosen[family_name(architecture, stream)] = min(results)[1]
    return chosen


def measure(work: Path, run: Run, out: Path, stores: Stores, speeds: dict, args) -> Row:
    from students.models.architectures import student_cost
    from students.models.speed import generation_speed
    from students.release.trained_student import load_student, resolve_checkpoint

    model = load_student(resolve_checkpoint(out)).to(args.device)
    cost, rates = student_cost(model), stores.rates
    per_symbol = cost.train_flops_per_symbol(rates, args.seq_len)
    key = (run.size.name, run.stream)
    if key not in speeds:  # speed depends on the shape, not the budget: once per size and stream
        new_symbols = math.ceil(args.new_bytes * rates.symbols_per_byte)
        speeds[key] = [
            generation_speed(model, prompts(stores.heldout, batch, args.prompt_symbols).to(args.device), new_symbols)
            for batch in (1, 8)
        ]
    symbols = run.steps * run.batch * args.seq_len
    bpb, teacher_bpb = final_bpb(out)
    return Row(
        run,
        cost.parameters / 1e6,
        per_symbol * rates.symbols_per_byte,
        symbols * per_symbol,
        symbols / rates.symbols_per_byte / stores.text_bytes,
        bpb,
        teacher_bpb,
        cost.global_steps_per_byte(rates),
        speeds[key][0].bytes_per_s,
        speeds[key][1].bytes_per_s,
        kept_seconds(work).get(run.name),
    )


# ------------------------------------------------------------------------------ report


def frontier(rows: list[Row]) -> dict[str, dict[float, Row]]:
    """Each family's best row at each budget."""
    best: dict[str, dict[float, Row]] = {}
    for r in rows:
        at = best.setdefault(r.run.family, {})
        if r.run.budget not in at or r.bpb < at[r.run.budget].bpb:
            at[r.run.budget] = r
    return best


def crossing(budgets: list[float], differences: list[float]) -> str:
    """Where patched - flat changes sign (log-interpolated), or that it does not."""
    for (b0, d0), (b1, d1) in zip(zip(budgets, differences), zip(budgets[1:], differences[1:])):
        if (d0 > 0) != (d1 > 0):
            at = math.exp(math.log(b0) + (math.log(b1) - math.log(b0)) * d0 / (d0 - d1))
            return f"the lines cross near {at:.2g} FLOPs"
    return "the lines do not cross in this range"


def flops_ratio_at_equal_parameters(rows: list[Row], stream: str) -> list[tuple[str, float]]:
    """Each patched size's training FLOPs per byte over the flat family's at its parameter count
    (log-interpolated between the flat sizes)."""
    flat = {r.run.size.name: r for r in rows if r.run.stream == stream and r.run.size.architecture == "flat"}
    patched = {r.run.size.name: r for r in rows if r.run.stream == stream and r.run.size.architecture == "patched"}
    xs, ys = [r.parameters for r in flat.values()], [math.log(r.train_flops_per_byte) for r in flat.values()]
    out = []
    for name, r in patched.items():
        at, _ = interpolate(r.parameters, xs, ys)
        out.append((name, r.train_flops_per_byte / math.exp(at)))
    return out


def report(rows: list[Row], lrs: dict[str, float], stores: dict[str, Stores], args, seconds: float):
    first = next(iter(stores.values()))
    lines = [
        (
            f"teacher {args.teacher_name}; train {args.train_label} ({first.text_bytes:,} text bytes), "
            f"held out {', '.join(args.heldout[0])} (teacher {rows[0].teacher_bpb:.3f} BPB); windows of {args.seq_len} "
            f"symbols, at least {args.min_steps} steps a run; learning rates from one sweep "
            f"({', '.join(f'{x:g}' for x in args.lrs)}) per family at the smallest budget: "
            + ", ".join(f"{family} {lr:g}" for family, lr in lrs.items())
            + f"; cosine to a tenth, alpha 0.9; generation {args.new_bytes} new bytes, greedy, caches on, "
            f"{args.device}, {torch.get_num_threads()} threads"
        )
    ]
    header = ["budget FLOPs", "student", "stream", "params", "steps x batch", "train FLOPs/B", "run FLOPs", "passes"]
    header += ["BPB", "large-model steps/B", "B/s b1", "B/s b8", "train s"]
    body = [
        [
            f"{r.run.budget:.2g}",
            r.run.size.name,
            r.run.stream,
            f"{r.parameters:.2f}M",
            f"{r.run.steps} x {r.run.batch}",
            f"{r.train_flops_per_byte:.3g}",
            f"{r.run_flops:.3g}",
            f"{r.passes:.2f}",
            f"{r.bpb:.3f}",
            f"{r.global_steps_per_byte:.3f}",
            f"{r.speed_b1:,.0f}",
            f"{r.speed_b8:,.0f}",
            "" if r.train_seconds is None else f"{r.train_seconds:.0f}",
        ]
        for r in sorted(rows, key=lambda r: (r.run.budget, r.run.stream, r.run.size.architecture, r.run.size.hidden))
    ]
    table = markdown_table(header, body)
    best = frontier(rows)
    budgets = sorted(args.budgets)
    frontier_lines = [
        f"frontier {family}: " + ", ".join(f"{b:.2g} {at[b].bpb:.3f} ({at[b].run.size.name})" for b in budgets)
        for family, at in best.items()
    ]
    parts = []
    for stream in stores:
        flat, patched = best[family_name("flat", stream)], best[family_name("patched", stream)]
        differences = [patched[b].bpb - flat[b].bpb for b in budgets]
        met = all(d <= 0 for d in differences)
        ratios = flops_ratio_at_equal_parameters(rows, stream)
        parts.append(
            f"{'<eot>' if stream == 'eot' else stream} stream: best BPB patched - flat at budgets "
            f"{', '.join(f'{b:.2g}' for b in budgets)}: {', '.join(f'{d:+.3f}' for d in differences)} "
            f"({'met' if met else 'MISSED'}, goal <= 0; {crossing(budgets, differences)}); training FLOPs per byte "
            f"patched/flat at equal parameters {', '.join(f'{v:.2f} ({n})' for n, v in ratios)} "
            f"({'met' if max(v for _, v in ratios) <= 1 / 3 else 'MISSED'}, goal <= 0.33)"
        )
    trained = sum(kept_seconds(args.workdir).values())  # every run of this workdir (sweep included), as first trained
    summary = (
        "summary: "
        + "; ".join(parts)
        + f"; runtime {seconds / 60:.0f} min (training {trained / 60:.0f} min in all, reused runs included)"
    )
    lines += [table, *frontier_lines, summary]
    return lines


def save_plot(rows: list[Row], path: Path, teacher_name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for family, at in frontier(rows).items():
        budgets = sorted(at)
        left.plot(budgets, [at[b].bpb for b in budgets], marker="o", label=f"{family}, best size")
    for r in rows:
        left.scatter(r.run.budget, r.bpb, s=8, color="grey")
    for family in dict.fromkeys(r.run.family for r in rows):
        largest = max(r.run.budget for r in rows)
        family_rows = [r for r in rows if r.run.family == family and r.run.budget == largest]
        right.plot(
            [r.train_flops_per_byte for r in family_rows], [r.bpb for r in family_rows], marker="s", label=family
        )
    left.set_xscale("log")
    left.set_xlabel("training budget, FLOPs per run")
    right.set_xscale("log")
    right.set_xlabel("training FLOPs per text byte (sizes at the largest budget)")
    left.set_ylabel("held-out BPB")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    fig.suptitle(f"byte students at fixed training budgets ({teacher_name} teacher, KJV)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


# ------------------------------------------------------------------------------ the run


def compare(args, sizes: list[Size]) -> list[str]:
    if args.device == "cpu":
        os.environ["ACCELERATE_USE_CPU"] = "1"
    start = time.perf_counter()
    work = args.workdir
    stores = {stream: dumped(work, args, stream) for stream in args.streams}
    if args.dump_only:
        return []
    lrs = sweep(work, sizes, stores, args)
    runs = [
        planned(size, stores[stream], budget, lrs[family_name(size.architecture, stream)], args)
        for budget in sorted(args.budgets)
        for stream in args.streams
        for size in sizes
    ]
    outs = {run.name: train_run(work, run, stores[run.stream], args) for run in runs}
    torch.manual_seed(0)
    speeds: dict = {}
    largest_first = sorted(runs, key=lambda r: -r.budget)  # speeds measured on the best-trained weights
    rows = [measure(work, run, outs[run.name], stores[run.stream], speeds, args) for run in largest_first]
    lines = report(rows, lrs, stores, args, time.perf_counter() - start)
    print("\n".join(lines))
    save_plot(rows, args.plot or work / "budget.png", args.teacher_name)
    if args.markdown:
        write_section("budget", "\n\n".join(lines))
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--workdir", type=Path, default=Path("runs/budget"), help="stores, runs and the plot go here")
    parser.add_argument(
        "--budgets", type=float, nargs=3, default=list(BUDGETS), help="training FLOPs per run, three budgets"
    )
    parser.add_argument(
        "--train-books", nargs="*", default=None, help="KJV books to train on (default: all but the held-out ones)"
    )
    parser.add_argument("--streams", nargs="+", default=["eot", "fused"], choices=["eot", "fused"], help="streams")
    parser.add_argument("--lrs", type=float, nargs=3, default=list(LRS), help="the sweep's learning rates")
    parser.add_argument("--min-steps", type=int, default=1000, help="optimizer steps each run takes at least")
    parser.add_argument("--seq-len", type=int, default=256, help="symbols per sequence")
    parser.add_argument("--sizes-scale", type=int, default=1, help="multiply every width by this (GPU runs)")
    parser.add_argument("--new-bytes", type=int, default=512, help="bytes to generate per row when timing")
    parser.add_argument("--prompt-symbols", type=int, default=32, help="prompt length when timing")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (training and timing)")
    parser.add_argument("--dump-only", action="store_true", help="dump the stores and stop")
    parser.add_argument("--plot", type=Path, default=None, help="PNG path (default: WORKDIR/budget.png)")
    parser.add_argument("--markdown", action="store_true", help="also write the report to docs/RESULTS.md")
    parser.add_argument("--smoke", action="store_true", help="toy sizes in a temporary folder (seconds): a check")
    args = parser.parse_args(argv)
    if args.smoke:
        smoke(args)
        return
    from benchmarks.common import smollm2_gguf

    args.teacher, args.teacher_name = str(smollm2_gguf()), "SmolLM2-135M"
    args.heldout = (HELDOUT_BOOKS, 10**6)
    books = args.train_books or [b for b in all_books() if b not in HELDOUT_BOOKS]
    args.train, args.train_label = (books, 10**6), ", ".join(books) if len(books) <= 4 else f"{len(books)} books"
    compare(args, SIZES)


def smoke(args) -> None:
    """The tiny random teacher on two chapters, the <eot> stream, toy sizes and budgets of a few steps, in a
    temporary folder."""
    from benchmarks.smoke import TEACHER_NAME, tiny_teacher

    args.teacher, args.teacher_name = str(tiny_teacher()), TEACHER_NAME
    args.train, args.train_label, args.heldout = (["Genesis"], 2), "Genesis 1-2", (HELDOUT_BOOKS, 2)
    args.seq_len, args.min_steps, args.sizes_scale, args.device = 64, 2, 1, "cpu"
    args.new_bytes, args.prompt_symbols, args.dump_only, args.markdown, args.plot = 16, 8, False, False, None
    args.streams = ["eot"]  # the fused families run the same code (benchmarks/fused.py's smoke trains them)
    with tempfile.TemporaryDirectory() as tmp:
        args.workdir = Path(tmp)
        stores = {"eot": dumped(args.workdir, args, "eot")}
        base = flops_per_symbol(SMOKE_SIZES[-1], stores["eot"], args) * args.seq_len * args.min_steps
        args.budgets = [base, 2 * base, 4 * base]
        compare(args, SMOKE_SIZES)


if __name__ == "__main__":
    main()
