"""The ``<eot>`` stream against the fused stream, for flat and patched students: one run, one table.

The same corpus is dumped twice by the real SmolLM2-135M teacher (all of Genesis to train on, Ruth
and Jonah held out), once per stream (docs/DESIGN.md, "The fused stream"), and each store's bytes
per text byte and dump time are measured. Then one flat and one patched student are trained per
stream with one recipe (optimiser, schedule, α, steps, symbols per step: nothing differs but the
stream), each evaluated on its own stream's held-out store through training. Per student: the
sequential steps per text byte (the whole model's for flat, the local model's and the large
model's for patched), training FLOPs per text byte, held-out BPB at the end (equal steps) and at
the ``<eot>`` student's total training FLOPs (interpolated on the fused student's curve), and
generation bytes/s at batch 1 and 8 (greedy, caches on). A line starting ``summary`` gives the
ratios against its goals (``GOAL_*``), met or missed.

    OMP_NUM_THREADS=1 python -m benchmarks.fused [--workdir runs/fused] [--steps 400] [--batch-size 8]
    python -m benchmarks.fused --device cuda --workdir runs/fused-gpu --steps 4000 --batch-size 32 \\
        --seq-len 512 --sizes-scale 2     # the prepared GPU line
    python -m benchmarks.fused --smoke    # seconds: a check that the benchmark runs

Stores and runs are cached under ``--workdir`` (a rerun measures again); dump times are those of the
run that dumped the stores, or, with ``--dump-repeats N``, of fresh dumps of the held-out corpus,
the two streams taking turns. ``--only NAME …`` trains just
those students (several such processes train in parallel).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from benchmarks import patched
from benchmarks.patched import Recipe, Size, dump_store, prompts, train
from benchmarks.results import markdown_table, write_section
from bytestream.stream_kind import StreamKind

STREAMS = (StreamKind.EOT, StreamKind.FUSED)
GOAL_FLAT_STEPS, GOAL_FLOPS, GOAL_BPB, GOAL_STORE, GOAL_DUMP = 1.00, 0.82, 0.01, 1.1, 1.1
QUICKSTART_CHAPTERS = 12  # examples/quickstart.py trains on the first 12 chapters of Genesis

SIZES = [
    Size("flat-128x4", "flat", 128, 4, 4),
    Size("patched-256x4", "patched", 256, 4, 4, local_hidden=64, local_layers=1, local_window=64),
]
SMOKE_SIZES = [
    Size("flat-16x1", "flat", 16, 1, 1),
    Size("patched-32x1", "patched", 32, 1, 2, local_hidden=16, local_layers=1, local_window=64),
]


def real_recipe() -> Recipe:
    """benchmarks/patched.py's teacher and held-out books, all of Genesis to train on, these sizes."""
    return replace(patched.real_recipe(), train=(["Genesis"], 50), sizes=SIZES)


def smoke_recipe() -> Recipe:
    return replace(patched.smoke_recipe(), sizes=SMOKE_SIZES)


# ------------------------------------------------------------------------------ stores


@dataclass(frozen=True)
class StreamStores:
    stream: StreamKind
    train: Path
    heldout: Path
    bytes_per_text_byte: float  # the training store's shards, manifest and vocabulary
    rates: object  # StreamRates of the training store
    quickstart_steps_per_byte: float  # flat steps per text byte on the quickstart's chapters


def dumped(work: Path, recipe: Recipe, stream: StreamKind) -> StreamStores:
    """The stream's train and held-out stores (dumped unless complete; the seconds of each dump
    made here are kept in ``WORKDIR/dump_seconds.json``)."""
    from logit_store import LogitStore
    from logit_store.file_names import MANIFEST
    from students.models.cost import StreamRates, rates_of_stores

    paths = []
    for split, books in (("train", recipe.train), ("heldout", recipe.heldout)):
        name = f"{split}-{stream.value}"
        fresh = not (work / "store" / name / MANIFEST).is_file()
        start = time.perf_counter()
        paths.append(dump_store(work, name, *books, recipe.teacher, stream=stream.value))
        if fresh:
            record_seconds(work, {name: time.perf_counter() - start})
    store = LogitStore(paths[0])
    return StreamStores(
        stream,
        *paths,
        bytes_per_text_byte=store.stats()["bytes_per_text_byte"],
        rates=StreamRates(**rates_of_stores([paths[0]])),
        quickstart_steps_per_byte=flat_steps_per_byte(store, QUICKSTART_CHAPTERS),
    )


def record_seconds(work: Path, seconds: dict[str, float] | None = None) -> dict[str, float]:
    """The dump times kept in ``WORKDIR/dump_seconds.json``, with ``seconds`` added."""
    path = work / "dump_seconds.json"
    kept = json.loads(path.read_text()) if path.is_file() else {}
    if seconds:
        kept |= seconds
        path.write_text(json.dumps(kept, indent=1))
    return kept


def dumped_seconds(work: Path) -> dict[StreamKind, float]:
    """Each stream's train and held-out dump times, as the run that dumped them measured."""
    kept = record_seconds(work)
    names = {stream: (f"train-{stream.value}", f"heldout-{stream.value}") for stream in STREAMS}
    missing = [n for pair in names.values() for n in pair if n not in kept]
    if missing:
        raise SystemExit(
            f"no dump time is recorded for {', '.join(missing)}: give --dump-repeats N to time fresh dumps"
        )
    return {stream: kept[a] + kept[b] for stream, (a, b) in names.items()}


def timed_dumps(work: Path, recipe: Recipe, repeats: int) -> dict[StreamKind, float]:
    """Each stream's fastest of ``repeats`` fresh dumps of the held-out corpus, the streams taking
    turns, so that a shared machine's changing load falls on both alike."""
    times: dict[StreamKind, list[float]] = {stream: [] for stream in STREAMS}
    for attempt in range(repeats):
        for stream in STREAMS:
            name = f"timing-{stream.value}-{attempt}"
            shutil.rmtree(work / "store" / name, ignore_errors=True)
            start = time.perf_counter()
            dump_store(work, name, *recipe.heldout, recipe.teacher, stream=stream.value)
            times[stream].append(time.perf_counter() - start)
            shutil.rmtree(work / "store" / name)
    return {stream: min(seconds) for stream, seconds in times.items()}


def flat_steps_per_byte(store, documents: int) -> float:
    """Symbols per text byte of the first ``documents`` documents' streams (``<bos>`` … ``<eos>``),
    counted exactly: a flat student takes one step per symbol."""
    stored = [store.document(i) for i in range(min(documents, len(store)))]
    return sum(len(d.layout.symbols) for d in stored) / sum(d.text_bytes for d in stored)


# ------------------------------------------------------------------------------ students


@dataclass
class Student:
    """One training run: a size, a stream and its number of steps."""

    size: Size
    stream: StreamKind
    steps: int
    label: str  # "" for the recipe's steps, else why the steps differ

    @property
    def name(self) -> str:
        return f"{self.size.name}-{self.stream.value}" + (f"-{self.label}" if self.label else "")


@dataclass
class Row:
    student: Student
    parameters: float
    steps_per_byte: float  # the whole model's (flat) or the local model's (patched) steps
    global_steps_per_byte: float
    train_flops_per_byte: float
    run_flops: float  # the whole run's training FLOPs
    bpb: float  # at the end of the run
    teacher_bpb: float
    speed_b1: float  # generated bytes/s
    speed_b8: float


def flops_per_step(size: Size, stores: StreamStores, args) -> float:
    """Training FLOPs of one step of ``size`` on ``stores``' stream (from an untrained model's shape)."""
    from students.models.architectures import architecture_named, student_cost
    from students.models.shape import StudentShape

    shape = StudentShape(**size.train_flags(args.sizes_scale), stream=stores.stream.value)
    model = architecture_named(size.architecture).build(shape, seq_len=args.seq_len, seed=0)
    return student_cost(model).train_flops_per_symbol(stores.rates, args.seq_len) * args.batch_size * args.seq_len


def students_of(size: Size, stores: dict[StreamKind, StreamStores], args) -> list[Student]:
    """The ``<eot>`` student, the fused one at equal steps and the fused one at equal training FLOPs
    (as many steps as the ``<eot>`` run's FLOPs pay for, each run with its own whole schedule)."""
    ratio = flops_per_step(size, stores[StreamKind.EOT], args) / flops_per_step(size, stores[StreamKind.FUSED], args)
    return [
        Student(size, StreamKind.EOT, args.steps, ""),
        Student(size, StreamKind.FUSED, args.steps, ""),
        Student(size, StreamKind.FUSED, max(round(args.steps * ratio), 1), "equal-flops"),
    ]


def train_student(work: Path, student: Student, stores: StreamStores, args) -> Path:
    extra = {
        "stream": student.stream.value,
        "max_steps": student.steps,
        "warmup_steps": max(student.steps // 10, 1),
        "eval_every": max(student.steps // 4, 1),
    }
    return train(work, student.size, args, (stores.train, stores.heldout), run_name=student.name, **extra)


def measure(run: Path, student: Student, stores: StreamStores, args) -> Row:
    from students.models.architectures import student_cost
    from students.models.speed import generation_speed
    from students.release.trained_student import load_student, resolve_checkpoint

    model = load_student(resolve_checkpoint(run)).to(args.device)
    cost, rates = student_cost(model), stores.rates
    flops_per_symbol = cost.train_flops_per_symbol(rates, args.seq_len)
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    if last["step"] != student.steps:
        raise SystemExit(f"{run}: its last evaluation is at step {last['step']}, not {student.steps}")
    speeds = {}
    for batch in (1, 8):
        prompt = prompts(stores.heldout, batch, args.prompt_symbols).to(args.device)
        new_symbols = math.ceil(args.new_bytes * rates.symbols_per_byte)
        speeds[batch] = generation_speed(model, prompt, new_symbols).bytes_per_s
    return Row(
        student,
        cost.parameters / 1e6,
        rates.symbols_per_byte,
        cost.global_steps_per_byte(rates),
        flops_per_symbol * rates.symbols_per_byte,
        student.steps * args.batch_size * args.seq_len * flops_per_symbol,
        last["student_bpb"],
        last["teacher_bpb"],
        speeds[1],
        speeds[8],
    )


# ------------------------------------------------------------------------------ report


def report(
    rows: list[Row], stores: dict[StreamKind, StreamStores], seconds: dict[StreamKind, float], recipe: Recipe, args
) -> tuple[list[str], str]:
    eot, fused = stores[StreamKind.EOT], stores[StreamKind.FUSED]
    lines = [
        (
            f"teacher {recipe.teacher_name}; train {recipe.train[1]} chapters of {', '.join(recipe.train[0])}, "
            f"held out {', '.join(recipe.heldout[0])} (teacher {rows[0].teacher_bpb:.3f} BPB); steps of "
            f"{args.batch_size} x {args.seq_len} symbols, lr 3e-3 with a tenth of the run warming up, alpha 0.9; "
            f"generation {args.new_bytes} new bytes, greedy, caches on, {args.device}, "
            f"{torch.get_num_threads()} threads"
        ),
        (
            f"stores: <eot> {eot.bytes_per_text_byte:.2f} B/B, fused {fused.bytes_per_text_byte:.2f} B/B; "
            f"{dump_basis(args)}: <eot> {seconds[StreamKind.EOT]:.0f} s, fused {seconds[StreamKind.FUSED]:.0f} s; symbols per text byte "
            f"<eot> {eot.rates.symbols_per_byte:.3f}, fused {fused.rates.symbols_per_byte:.3f}; teacher tokens "
            f"(patches) per byte {eot.rates.patches_per_byte:.3f}"
        ),
    ]
    header = ["student", "steps", "params", "steps/B", "global steps/B", "train FLOPs/B", "run FLOPs", "BPB"]
    header += ["B/s b1", "B/s b8"]
    table_rows = [
        [
            r.student.name,
            f"{r.student.steps}",
            f"{r.parameters:.2f}M",
            f"{r.steps_per_byte:.3f}",
            f"{r.global_steps_per_byte:.3f}",
            f"{r.train_flops_per_byte:.3g}",
            f"{r.run_flops:.3g}",
            f"{r.bpb:.3f}",
            f"{r.speed_b1:,.0f}",
            f"{r.speed_b8:,.0f}",
        ]
        for r in rows
    ]
    table = markdown_table(header, table_rows)
    lines.append(table)
    flops_ratios, equal_steps, equal_flops = [], [], []
    for size in recipe.sizes:
        base, same_steps, same_flops = (r for r in rows if r.student.size == size)
        flops_ratios.append(same_steps.train_flops_per_byte / base.train_flops_per_byte)
        equal_steps.append(same_steps.bpb - base.bpb)
        equal_flops.append(same_flops.bpb - base.bpb)
    steps = (eot.quickstart_steps_per_byte, fused.quickstart_steps_per_byte)
    store_ratio = fused.bytes_per_text_byte / eot.bytes_per_text_byte
    dump_ratio = seconds[StreamKind.FUSED] / seconds[StreamKind.EOT]
    lines.append(
        f"summary: flat steps per text byte on the quickstart's chapters {steps[0]:.3f} -> {steps[1]:.3f} "
        f"({verdict(steps[1] <= GOAL_FLAT_STEPS + 0.005)}, goal 1.00); training FLOPs per byte fused/<eot> "
        f"{listed(flops_ratios, '.3f')} ({verdict(max(flops_ratios) <= GOAL_FLOPS)}, goal <= {GOAL_FLOPS}); "
        f"held-out BPB fused - <eot> at equal training FLOPs {listed(equal_flops, '+.3f')} "
        f"({verdict(max(equal_flops) <= GOAL_BPB)}, goal <= +{GOAL_BPB}), at equal steps "
        f"{listed(equal_steps, '+.3f')}; store bytes fused/<eot> {store_ratio:.2f} "
        f"({verdict(store_ratio <= GOAL_STORE)}, goal <= {GOAL_STORE}); dump time fused/<eot> {dump_ratio:.2f} "
        f"({verdict(dump_ratio <= GOAL_DUMP)}, goal <= {GOAL_DUMP}) (students in order: "
        f"{', '.join(s.name for s in recipe.sizes)})"
    )
    return lines, "\n\n".join([*lines[:2], table, lines[-1]])


def listed(values: list[float], spec: str) -> str:
    return ", ".join(format(v, spec) for v in values)


def dump_basis(args) -> str:
    if args.dump_repeats:
        return f"dump of the held-out corpus (fastest of {args.dump_repeats}, the streams in turn)"
    return "dumps of both stores (as the run that made them measured, setup included)"


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


# ------------------------------------------------------------------------------ the run


def compare(args, recipe: Recipe) -> list[str]:
    if args.device == "cpu":
        os.environ["ACCELERATE_USE_CPU"] = "1"
    work = args.workdir
    stores = {stream: dumped(work, recipe, stream) for stream in STREAMS}
    students = [student for size in recipe.sizes for student in students_of(size, stores, args)]
    runs = {
        student.name: train_student(work, student, stores[student.stream], args)
        for student in students
        if args.only is None or student.name in args.only
    }
    if args.only is not None:
        return []
    torch.manual_seed(0)
    rows = [measure(runs[student.name], student, stores[student.stream], args) for student in students]
    seconds = timed_dumps(work, recipe, args.dump_repeats) if args.dump_repeats else dumped_seconds(work)
    lines, markdown = report(rows, stores, seconds, recipe, args)
    print("\n".join(lines))
    if args.markdown:
        write_section("fused", markdown)
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--workdir", type=Path, default=Path("runs/fused"), help="stores and runs go here")
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps per student")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    parser.add_argument("--seq-len", type=int, default=256, help="symbols per sequence")
    parser.add_argument("--sizes-scale", type=int, default=1, help="multiply every width by this (GPU runs)")
    parser.add_argument("--new-bytes", type=int, default=512, help="bytes to generate per row when timing")
    parser.add_argument("--prompt-symbols", type=int, default=32, help="prompt length when timing")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (training and timing)")
    parser.add_argument("--only", nargs="*", default=None, help="train only these students (NAME-STREAM) and stop")
    parser.add_argument(
        "--dump-repeats",
        type=int,
        default=0,
        help="time N fresh dumps of the held-out corpus per stream, the streams in turn (default 0: the times of "
        "the dumps that made the stores)",
    )
    parser.add_argument("--markdown", action="store_true", help="also write the table to docs/RESULTS.md")
    parser.add_argument("--smoke", action="store_true", help="toy sizes in a temporary folder (seconds): a check")
    args = parser.parse_args(argv)
    if not args.smoke:
        compare(args, real_recipe())
        return
    args.steps, args.batch_size, args.seq_len, args.sizes_scale, args.device = 4, 2, 64, 1, "cpu"
    args.new_bytes, args.prompt_symbols, args.only, args.markdown, args.dump_repeats = 32, 8, None, False, 1
    with tempfile.TemporaryDirectory() as tmp:
        args.workdir = Path(tmp)
        compare(args, smoke_recipe())


if __name__ == "__main__":
    main()
