"""``dump`` throughput with the real SmolLM2-135M teacher on KJV text, on the CPU.

Prints tokens/s and the share of the pass's wall time spent outside the teacher forward
(conversion + encoding + writing that did not overlap it). Goal: at most 10%. Also the time the
background thread spent converting and writing, as the share of the pass it would take unoverlapped.

    python -m benchmarks.dump [--chapters 40] [--threads N] [--encoding log8] [--smoke]

``--smoke``: 3 chapters through the tiny random teacher of ``benchmarks/smoke.py`` (SmolLM2's
tokenizer), 256-token windows: seconds, a check that the benchmark runs.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from benchmarks.common import kjv_chapters, smollm2_gguf
from distill.corpus.spec import CorpusSpec
from distill.dump.run import DumpConfig, run_dump
from logit_store.encodings import DEFAULT_ENCODING


def write_corpus(folder: Path, chapters: int) -> int:
    docs = kjv_chapters({"Genesis", "Exodus", "Leviticus"})[:chapters]
    (folder / "kjv.jsonl").write_text("\n".join(json.dumps({"id": k, "text": t.decode()}) for k, t in docs))
    return sum(len(t) for _, t in docs)


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--chapters", type=int, default=40, help="KJV chapters to distil (about 3.5 KB each)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--encoding", default=DEFAULT_ENCODING, help="store value encoding")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per forward batch")
    parser.add_argument("--smoke", action="store_true", help="toy sizes (seconds): a check that the benchmark runs")
    args = parser.parse_args()
    teacher, name, windows = (
        str(smollm2_gguf()),
        "SmolLM2-135M (GGUF Q4_1 dequantised to float32)",
        {"max_length": 2048},
    )
    if args.smoke:
        from benchmarks import smoke

        args.chapters, args.batch_tokens = 3, 1024
        teacher, name, windows = str(smoke.tiny_teacher()), smoke.TEACHER_NAME, smoke.WINDOWS
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp)
        text_bytes = write_corpus(corpus, args.chapters)
        config = DumpConfig.of(
            teacher=teacher,
            corpus=CorpusSpec(str(corpus / "kjv.jsonl")),
            output=str(corpus / "store"),
            encoding=args.encoding,
            batch_tokens=args.batch_tokens,
            **windows,
            progress=False,
        )
        if args.threads:
            torch.set_num_threads(args.threads)  # what the command line's --threads does
        s = run_dump(config)
    print(f"{name} on {s.documents} KJV chapters, {text_bytes:,} bytes, CPU")
    print(f"{'what':<40}{'value':>16}")
    rows = [
        ("teacher tokens", f"{s.tokens:,}"),
        ("setup (load teacher, trie)", f"{s.setup_seconds:.1f} s"),
        ("pass wall time", f"{s.seconds:.1f} s"),
        ("  teacher forward", f"{s.forward_seconds:.1f} s"),
        ("  outside the forward", f"{s.outside_forward_seconds:.1f} s"),
        ("conversion+encoding+writing (thread)", f"{s.convert_write_seconds:.1f} s"),
        ("tokens/s", f"{s.tokens / s.seconds:,.0f}"),
        ("text bytes/s", f"{s.text_bytes / s.seconds:,.0f}"),
        ("store bytes per text byte", f"{s.bytes_per_text_byte:.2f}"),
        ("teacher BPB", f"{s.teacher_bpb:.4f}"),
    ]
    for name, value in rows:
        print(f"{name:<40}{value:>16}")
    print(f"share outside the forward = {s.outside_forward_seconds / s.seconds:.1%} (goal <= 10%)")
    print(
        f"conversion+encoding+writing, had it not overlapped the forward = "
        f"{s.convert_write_seconds / (s.forward_seconds + s.convert_write_seconds):.1%} of the pass"
    )


if __name__ == "__main__":
    main()
