"""On-policy byte distillation against offline training: one run, one table.

The SmolLM2-135M teacher (GGUF) dumps the quickstart's data (the first 12 chapters of Genesis to
train on, 4 of Ruth held out) in the fused stream. On-policy distillation is measured as the field
uses it, as a second stage after offline training: a flat student of the default size first trains
offline (λ = 0) for ``--warm-steps`` steps (the warm start, cached under ``--workdir``); every row
after it then continues from that same warm start (``train --init-from``, a fresh optimiser and
schedule at a third of the warm start's learning rate, another data order) for ``--steps`` steps at
λ (``--on-policy``) 0, 0.5 and 1 and β (``--on-policy-beta``) 0 and 1 (λ = 0 has no β), and once more
at λ = 0 for as many steps as take the wall-clock of the best on-policy run (by the teacher's NLL of
its sampled continuations). The table's first row is the warm start itself. Per run: held-out BPB; the
teacher's NLL per byte (bits) of the student's own greedy and sampled (T = 1) continuations of
held-out prompts (scored exactly, as training scores them); the share of repeated 8-grams in
those continuations; the wall-clock per step and, for on-policy runs, its split into the student's
writing, the teacher's forward, the conversion and the student's step
(docs/DESIGN.md, "On-policy distillation"). A line starting ``summary`` states the goals: teacher NLL
per byte at least 10% lower than λ = 0's at equal steps, held-out BPB at most 0.02 worse.

    OMP_NUM_THREADS=2 python -m benchmarks.on_policy [--workdir runs/on_policy] [--warm-steps 300] \\
        [--steps 60] [--markdown]
    python -m benchmarks.on_policy --device cuda --workdir runs/on_policy-gpu --warm-steps 4000 --steps 1000 \\
        --batch-size 16 --seq-len 256 --on-policy-bytes 64    # the prepared GPU line
    python -m benchmarks.on_policy --smoke    # seconds: a check that the benchmark runs

Stores and runs (the warm start too) are cached under ``--workdir`` (a finished run is measured
again, not retrained).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks.patched import Recipe, dump_store
from benchmarks.results import markdown_table, write_section
from bytedistill.cli import main as bytedistill
from examples.quickstart import flags

GOAL_NLL, GOAL_BPB = 0.10, 0.02
SETTINGS = [(0.0, 0.0), (0.5, 0.0), (0.5, 1.0), (1.0, 0.0), (1.0, 1.0)]  # (λ, β)
QUICKSTART = (["Genesis"], 12), (["Ruth"], 4)
PARTS = ("write", "teacher", "conversion", "student")
LR, SECOND_STAGE_LR = 3e-3, 1e-3  # peak learning rates of the warm start and of the runs continuing it


def recipe(smoke: bool) -> Recipe:
    if smoke:
        from benchmarks.smoke import TEACHER_NAME, tiny_teacher

        return Recipe(str(tiny_teacher()), TEACHER_NAME, (["Genesis"], 1), (["Ruth"], 1), [])
    from benchmarks.common import smollm2_gguf

    return Recipe(str(smollm2_gguf()), "SmolLM2-135M", *QUICKSTART, [])


@dataclass
class Result:
    name: str
    share: float
    beta: float
    steps: int
    seconds: float  # wall-clock of the training command
    bpb: float
    nll_greedy: float  # teacher bits per byte of the student's continuations
    nll_sampled: float
    repeats_greedy: float  # share of repeated 8-grams
    repeats_sampled: float
    split: dict[str, float] | None  # seconds per step of each part (on-policy runs)


def train_run(
    work: Path,
    args,
    stores: tuple[Path, Path],
    teacher: str,
    share: float,
    beta: float,
    steps: int,
    name: str,
    warm: Path | None = None,
):
    """Train one student (a finished run is kept): the warm start (``warm`` None) or a run continuing
    from it; returns its folder and the training's wall-clock."""
    start = f"-from{args.warm_steps}" if warm is not None else ""
    out = work / "runs" / f"{name}-{steps}x{args.batch_size}x{args.seq_len}{start}"
    timing = out / "benchmark_seconds.json"
    if timing.is_file():
        return out, json.loads(timing.read_text())["seconds"]
    shutil.rmtree(out, ignore_errors=True)
    options = {
        "train_stores": stores[0],
        "eval_store": stores[1],
        "output_dir": out,
        "stream": "fused",  # the fused student, as the recorded rows
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "max_steps": steps,
        "warmup_steps": max(steps // 10, 1),
        "lr": LR if warm is None else SECOND_STAGE_LR,
        "min_lr": (LR if warm is None else SECOND_STAGE_LR) / 10,
        "alpha": 0.9,
        "eval_every": 0,
        "eval_bytes": 0,
        "checkpoint_every": 0,
        "keep_checkpoints": 1,
        "progress": "false",
        "seed": 0 if warm is None else 1,  # the second stage reads the data in another order
    }
    if warm is not None:
        options["init_from"] = warm
    if args.smoke:  # the smoke's toy student (benchmarks/smoke.py)
        from benchmarks.smoke import STUDENT

        options |= {k: v for k, v in STUDENT.items() if k not in ("seq_len", "batch_size")}
    if share > 0:
        options |= {
            "on_policy": share,
            "on_policy_beta": beta,
            "on_policy_bytes": args.on_policy_bytes,
            "teacher": teacher,
        }
    started = time.perf_counter()
    if bytedistill(["train", *flags(**options)]) != 0:
        raise SystemExit(f"training {name} failed")
    seconds = time.perf_counter() - started
    timing.write_text(json.dumps({"seconds": seconds}))
    print(f"{name}: {steps} steps in {seconds:.0f} s", flush=True)
    return out, seconds


def heldout_prompts(heldout: Path, count: int, length: int) -> list[bytes]:
    """The first ``length`` bytes of held-out documents, cut before a word (as on-policy prompts are)."""
    from bytestream.stream_kind import StreamKind
    from logit_store import LogitStore
    from students.training.on_policy_writer import prompt_of

    store = LogitStore(heldout)
    stream = StreamKind.of_layout(store.document(0).layout)
    prompts = []
    for i in range(count):
        layout = store.document(i % len(store)).layout
        start = (i // len(store)) * length  # more prompts than documents: later starts
        prompts.append(prompt_of(layout.symbols[1 + start :], stream, length))
    return prompts


def repeated_ngrams(texts: list[bytes], n: int = 8) -> float:
    """Share of the n-grams of each text that already occurred earlier in it."""
    total = repeated = 0
    for text in texts:
        seen: set[bytes] = set()
        for i in range(len(text) - n + 1):
            gram = text[i : i + n]
            repeated += gram in seen
            seen.add(gram)
            total += 1
    return repeated / total if total else 0.0


def continuation_nll(scorer, prompts: list[bytes], answers) -> float:
    """The teacher's NLL (bits) per byte of the continuations, given their prompts: Σ −log₂ P over the
    positions after each prompt (the final ``<eos>`` only where the student wrote it) / their bytes."""
    from students.training.on_policy import on_policy_row, readable

    nats, text_bytes = 0.0, 0
    texts, ids, kept = [], [], []
    for answer in answers:
        answer, encoded, _ = readable(scorer, answer)
        if encoded is not None and answer.text:
            texts.append(answer.prompt + answer.text)
            ids.append(encoded)
            kept.append(answer)
    for dist, answer in zip(scorer.score(texts, ids), kept):
        row = on_policy_row(dist, answer, dist.layout.num_positions, scorer.stream)
        probs = dist.target_probabilities()
        nats -= float(np.log(np.maximum(probs[row["loss_mask"][: len(probs)]], 1e-300)).sum())
        text_bytes += len(answer.text)
    return nats / math.log(2) / max(text_bytes, 1)


def measure(run: Path, scorer, prompts: list[bytes], args, device: str) -> dict:
    """Held-out BPB, and the teacher's NLL and the repetition of the student's continuations."""
    from students.release.trained_student import load_student, resolve_checkpoint
    from students.training.on_policy_writer import write_answers

    model = load_student(resolve_checkpoint(run)).to(device)
    contexts = [scorer.layout(scorer.encode(p)).symbols[:-1].astype(np.int64).tolist() for p in prompts]
    absent = scorer.absent_bytes()
    never = tuple(absent) + tuple(256 + b for b in absent)
    out = {"bpb": json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["student_bpb"]}
    for name, temperature in (("greedy", 0.0), ("sampled", 1.0)):
        answers = write_answers(
            model,
            contexts,
            prompts,
            scorer.stream,
            max_bytes=args.continuation_bytes,
            temperature=temperature,
            seeds=list(range(len(prompts))),
            never=never,
        )
        out[f"nll_{name}"] = continuation_nll(scorer, prompts, answers)
        out[f"repeats_{name}"] = repeated_ngrams([a.text for a in answers])
    return out


def split_of(run: Path) -> dict[str, float] | None:
    info = json.loads((run / "run_info.json").read_text())
    on_policy = info.get("on_policy")
    return on_policy["seconds_per_step"] if on_policy else None


def table(results: list[Result], warm: Result) -> str:
    header = [
        "run", "λ", "β", "steps", "held-out BPB", "teacher NLL/byte greedy", "teacher NLL/byte sampled",
        "8-gram repeats greedy", "8-gram repeats sampled", "s/step", "write / teacher / conversion / student",
    ]  # fmt: skip
    rows = []
    for r in [warm, *results]:
        split = "-"
        if r.split:
            total = sum(r.split.values()) or 1e-12
            split = " / ".join(f"{r.split[p] / total:.0%}" for p in PARTS)
        rows.append([
            r.name, f"{r.share:g}", f"{r.beta:g}" if r.share else "-", str(r.steps), f"{r.bpb:.4f}",
            f"{r.nll_greedy:.3f}", f"{r.nll_sampled:.3f}", f"{r.repeats_greedy:.3f}", f"{r.repeats_sampled:.3f}",
            f"{r.seconds / r.steps:.2f}", split,
        ])  # fmt: skip
    return markdown_table(header, rows)


def summary(results: list[Result], warm: Result) -> str:
    offline = results[0]
    on_policy = [r for r in results if r.share > 0 and r.steps == offline.steps]
    best = min(on_policy, key=lambda r: r.nll_sampled)
    gain = 1 - best.nll_sampled / offline.nll_sampled
    worse = best.bpb - offline.bpb
    catch = results[-1]
    caught = catch.nll_sampled <= best.nll_sampled
    return (
        f"summary: best on-policy run {best.name} ({offline.steps} steps after a warm start of {warm.steps} "
        f"offline steps that every run shares: held-out BPB {warm.bpb:.4f}, teacher NLL {warm.nll_sampled:.3f}): "
        f"teacher NLL per byte of its sampled continuations "
        f"{abs(gain):.1%} {'lower' if gain >= 0 else 'higher'} than lambda=0's at equal steps (goal >= {GOAL_NLL:.0%} lower: "
        f"{'met' if gain >= GOAL_NLL else 'missed'}), greedy {1 - best.nll_greedy / offline.nll_greedy:+.1%} lower; "
        f"held-out BPB {worse:+.4f} (goal <= +{GOAL_BPB}: {'met' if worse <= GOAL_BPB else 'missed'}); "
        f"its wall-clock per step is {best.seconds / best.steps / (offline.seconds / offline.steps):.1f}x lambda=0's; "
        f"lambda=0 given the same wall-clock ({catch.steps} steps) reaches teacher NLL {catch.nll_sampled:.3f} "
        f"against {best.nll_sampled:.3f} ({'catches up' if caught else 'does not catch up'}) "
        f"and held-out BPB {catch.bpb:.4f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=None, help="stores and runs (default: runs/on_policy)")
    parser.add_argument("--warm-steps", type=int, default=300, help="offline steps of the shared warm start")
    parser.add_argument("--steps", type=int, default=60, help="student steps of every run after the warm start")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--on-policy-bytes", type=int, default=32, help="bytes the student writes per answer")
    parser.add_argument("--prompts", type=int, default=16, help="held-out prompts the continuations follow")
    parser.add_argument("--prompt-bytes", type=int, default=64, help="bytes of each held-out prompt (at most)")
    parser.add_argument("--continuation-bytes", type=int, default=64, help="bytes of each continuation")
    parser.add_argument("--device", default="cpu", help="where the students are measured (cpu or cuda)")
    parser.add_argument("--smoke", action="store_true", help="toy sizes and the tiny teacher: seconds")
    parser.add_argument("--markdown", action="store_true", help="write the table into docs/RESULTS.md")
    args = parser.parse_args()
    if args.smoke:
        args.warm_steps, args.steps, args.batch_size, args.seq_len, args.on_policy_bytes = 2, 2, 2, 64, 8
        args.prompts, args.prompt_bytes, args.continuation_bytes = 2, 16, 8
    temporary = tempfile.TemporaryDirectory() if args.smoke and args.workdir is None else None
    work = Path(temporary.name) if temporary else (args.workdir or Path("runs/on_policy"))
    try:
        run(work, args)
    finally:
        if temporary:
            temporary.cleanup()


def run(work: Path, args) -> None:
    from students.training.on_policy_teacher import ScoringTeacher

    chosen = recipe(args.smoke)
    train = dump_store(work, "train", *chosen.train, chosen.teacher, stream="fused")
    heldout = dump_store(work, "heldout", *chosen.heldout, chosen.teacher, stream="fused")
    scorer = ScoringTeacher.load(chosen.teacher, str(heldout), torch.device(args.device))
    prompts = heldout_prompts(heldout, args.prompts, args.prompt_bytes)
    results = []

    def measured(name: str, out: Path, seconds: float, share: float, beta: float, steps: int) -> Result:
        found = measure(out, scorer, prompts, args, args.device)
        return Result(name, share, beta, steps, seconds, split=split_of(out), **found)

    warm_run, seconds = train_run(work, args, (train, heldout), chosen.teacher, 0.0, 0.0, args.warm_steps, "warm")
    warm = measured("warm start", warm_run, seconds, 0.0, 0.0, args.warm_steps)

    def add(name: str, share: float, beta: float, steps: int) -> Result:
        out, seconds = train_run(work, args, (train, heldout), chosen.teacher, share, beta, steps, name, warm_run)
        results.append(measured(name, out, seconds, share, beta, steps))
        return results[-1]

    for share, beta in SETTINGS:
        add(f"lambda{share:g}" + (f"-beta{beta:g}" if share else ""), share, beta, args.steps)
    best = min(results[1:], key=lambda r: r.nll_sampled)
    offline = results[0]
    equal_time = max(round(args.steps * best.seconds / offline.seconds), args.steps)
    add("lambda0-equal-time", 0.0, 0.0, equal_time)
    text = table(results, warm)
    print(f"\nteacher {chosen.teacher_name}; a warm start of {args.warm_steps} offline steps, then {args.steps} steps "
          f"of {args.batch_size} x {args.seq_len} symbols from it; "
          f"answers of {args.on_policy_bytes} bytes; {len(prompts)} held-out prompts, {args.continuation_bytes}-byte "
          f"continuations (teacher NLL in bits per byte)\n")  # fmt: skip
    print(text)
    line = summary(results, warm)
    print(line)
    if args.markdown:
        write_section("on_policy", f"{text}\n\n{line}")


if __name__ == "__main__":
    main()
