"""``dump`` peak memory against the group size and the document length, on the CPU.

A random Llama (hidden size 64, 2 layers) over the real Llama-3 vocabulary (V = 128,256) dumps
KJV text; each configuration runs in its own process, which reports its own peak RSS. The
configurations are the issue's — groups of 16k / 64k / 256k tokens, and a corpus 10× longer
that includes one 1 MB document — scaled down by ``--scale`` (default 64: groups of 256 / 1k /
4k tokens, a 16 KB long document, and ``--head-rows`` 1024/64 = 16) so the whole script takes a
few minutes on 2 cores. Goal: ``memory growth`` (max / min peak RSS) ≤ 1.1.

    python -m benchmarks.dump_memory [--scale 64]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from benchmarks.common import kjv_chapters, llama3_tokenizer_json
from distill.dump import DumpConfig, run_dump

GROUPS = (16_384, 65_536, 262_144)
LONG_DOCUMENT = 1_000_000  # bytes, in the 10× corpus
HEAD_ROWS = 1024


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
        joined = b"\n".join(chapters)[:long_document]
        docs.insert(len(docs) // 2, joined)
    path.write_text("\n".join(json.dumps({"text": d.decode("utf-8", errors="replace")}) for d in docs))
    return sum(len(d) for d in docs)


def child(args) -> None:
    config = DumpConfig(
        teacher=args.teacher,
        tokenizer=str(llama3_tokenizer_json()),
        corpus=args.corpus,
        output=args.output,
        group_tokens=args.group_tokens,
        head_rows=args.head_rows,
        batch_tokens=2048,
        max_length=512,
        stride=128,
        threads=1,
        progress=False,
    )
    s = run_dump(config)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"peak": peak, "tokens": s.tokens, "seconds": s.seconds}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scale", type=int, default=64, help="divide group sizes, document length and --head-rows by this"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("teacher", "corpus", "output"):
        parser.add_argument(f"--{name}", help=argparse.SUPPRESS)
    parser.add_argument("--group-tokens", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--head-rows", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    head_rows = max(1, HEAD_ROWS // args.scale)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        save_teacher(tmp / "teacher")
        base_bytes = 4 * GROUPS[-1] // args.scale  # about one largest group of tokens
        base = write_corpus(tmp / "base.jsonl", base_bytes)
        long = write_corpus(
            tmp / "long.jsonl", 10 * base_bytes - LONG_DOCUMENT // args.scale, LONG_DOCUMENT // args.scale
        )
        runs = [
            (f"group {g // 1024}k tokens / {args.scale}", tmp / "base.jsonl", base, g // args.scale) for g in GROUPS
        ]
        runs.append(
            (
                f"10x corpus + {LONG_DOCUMENT // args.scale // 1000} KB document",
                tmp / "long.jsonl",
                long,
                GROUPS[0] // args.scale,
            )
        )
        print(
            f"random Llama (hidden 64) over the Llama-3 vocabulary, CPU, 1 thread, --head-rows {head_rows}; "
            f"settings / {args.scale}"
        )
        print(f"{'run':<40}{'text bytes':>12}{'tokens':>10}{'seconds':>9}{'peak RSS':>12}")
        peaks = []
        for n, (name, corpus, size, group) in enumerate(runs):
            command = [
                sys.executable,
                "-m",
                "benchmarks.dump_memory",
                "--child",
                "--teacher",
                str(tmp / "teacher"),
                "--corpus",
                str(corpus),
                "--output",
                str(tmp / f"store{n}"),
                "--group-tokens",
                str(group),
                "--head-rows",
                str(head_rows),
            ]
            proc = subprocess.run(command, capture_output=True, text=True, check=True)
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            peaks.append(result["peak"])
            print(
                f"{name:<40}{size:>12,}{result['tokens']:>10,}{result['seconds']:>9.1f}{result['peak'] / 1e6:>9.0f} MB"
            )
    print(f"memory growth = {max(peaks) / min(peaks):.3f} (max / min peak RSS; goal <= 1.1)")


if __name__ == "__main__":
    main()
