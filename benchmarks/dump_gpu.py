"""``dump`` on a GPU: a randomly initialised Llama-3-8B-shaped teacher (bfloat16 trunk, float32
head) over the real Llama-3 vocabulary distils KJV text with the batch settings of
``examples/llama3_8b_gpu/dump.yaml``, through the dump itself (:func:`distill.dump.run.dump_with_teacher`).

Prints tokens/s, the share of the pass outside the teacher forward (the device conversion, the
host copies and whatever the writing thread did not overlap; goal ≤ 5%), the peak GPU memory
against the formula of :mod:`distill.dump.memory` (its device terms; on a CPU its whole sum
against peak RSS), and the largest difference between the torch
(device) and Numba (host) conversions of the same device logits, plus whether two device
conversions of them are bit-identical. One prepared script, a few minutes on one H200:

    python -m benchmarks.dump_gpu                                   # 8B shape on cuda
    python -m benchmarks.dump_gpu --smoke                           # seconds, anywhere

Then the host side after the forward, on the same vocabulary (:mod:`benchmarks.dump_host`): CPU-µs
per teacher token of each stage (the sink's fill of the device's converted rows, the store's
quantisation, stored-NLL decode, contexts, rANS, zstd and write) and the encoding's tokens/s with 1,
2 and 4 encoder threads (``--encode-threads``; alternating rounds, the best of each), with the
tokens/s 4 cores bound it to and the host cores 40,000 tokens/s need, on a ``summary`` line;
``--host-only`` runs that part alone (no teacher: any machine), ``--markdown`` writes its tables
into docs/RESULTS.md.

``--smoke``: the tiny shape on the CPU over the SmolLM2 tokenizer of ``benchmarks/smoke.py``
(49,152 tokens: its tables build in a fraction of the Llama-3 ones' time), toy windows and the
first Psalm (about 170 tokens), with the device conversion forced (``conversion: torch``), so
the dump takes the GPU's path on the CPU; only the peak GPU memory is not measured. Its host side
runs over a few thousand tokens, one round.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import yaml
from transformers import LlamaConfig, LlamaForCausalLM

from benchmarks.common import kjv_chapters, llama3_tokenizer_json
from bytestream.vocab import load_teacher_tokenizer, vocab_from_tokenizer
from distill.corpus.spec import CorpusSpec
from distill.dump.run import DumpConfig, dump_with_teacher, memory_terms
from distill.dump.settle import settle
from distill.teacher.encode import DocumentEncoder
from distill.teacher.model import Teacher

SHAPES = {
    "8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    },
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
}
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "llama3_8b_gpu" / "dump.yaml"
BATCH_SETTINGS = ("max_length", "stride", "batch_tokens", "group_tokens", "head_rows", "encoding")
SMOKE_SETTINGS = {"max_length": 128, "stride": 32, "batch_tokens": 1024, "group_tokens": 4096, "head_rows": 256}


def random_teacher(shape: str, device: torch.device, tokenizer_source: str, vocabulary: str) -> Teacher:
    tokenizer = load_teacher_tokenizer(tokenizer_source)
    vocab = vocab_from_tokenizer(tokenizer, name=vocabulary)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = LlamaConfig(
        vocab_size=vocab.size, max_position_embeddings=8192, tie_word_embeddings=False, **SHAPES[shape]
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype).eval()
    return Teacher(
        model,
        model.get_output_embeddings(),
        tokenizer,
        vocab,
        name=f"random-{vocabulary}-{shape}",
        device=device,
        dtype=dtype,
    )


def write_corpus(path: Path, text_bytes: int, books: set[str] | None = None) -> None:
    docs, total = [], 0
    for _, text in kjv_chapters(books):
        if total >= text_bytes:
            break
        docs.append(text)
        total += len(text)
    path.write_text("\n".join(json.dumps({"text": d.decode()}) for d in docs))


def conversion_difference(teacher: Teacher, text: bytes, max_length: int) -> tuple[float, bool]:
    """Max |torch − Numba| over the support values of one window's device logits, and whether
    two device conversions of them are bit-identical."""
    from distill.conversion.converter import Converter

    converter = Converter(teacher.vocab)
    teacher = teacher.with_sorted_head(converter.sorted_columns)  # as the dump runs it
    ids = DocumentEncoder(teacher.tokenizer, teacher.vocab).encode(text)[: max_length - 1]
    inputs = torch.tensor([teacher.context_prefix + ids.tolist()], device=teacher.device)
    rows = teacher.logits(inputs, torch.ones_like(inputs), [np.arange(len(ids) + 1)])
    logits, columns = rows.tensor, rows.columns
    on_device = converter.convert_torch(ids, logits, columns=columns)
    again = converter.convert_torch(ids, logits, columns=columns)
    on_host = converter.convert_numba(ids, logits.cpu().numpy(), columns=columns)
    return float(np.abs(on_device.values - on_host.values).max()), bool(np.array_equal(on_device.values, again.values))


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--shape", choices=list(SHAPES), default="8b", help="teacher shape")
    parser.add_argument("--device", default="cuda", help="torch device")
    parser.add_argument("--tokens", type=int, default=400_000, help="about this many teacher tokens of KJV text")
    for name in BATCH_SETTINGS:
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=type(DumpConfig.default(name)),
            help=f"override {name} of {EXAMPLE.name}",
        )
    parser.add_argument("--host-tokens", type=int, default=60_000, help="teacher tokens of the host side's measure")
    parser.add_argument("--host-rounds", type=int, default=3, help="alternating rounds of the encoder thread counts")
    parser.add_argument("--host-only", action="store_true", help="the host side alone (no teacher, any machine)")
    parser.add_argument("--markdown", action="store_true", help="write the host side's tables into docs/RESULTS.md")
    parser.add_argument("--smoke", action="store_true", help="toy sizes on the CPU (seconds): a check that it runs")
    args = parser.parse_args()
    example = yaml.safe_load(EXAMPLE.read_text())
    settings = {k: getattr(args, k) if getattr(args, k) is not None else example[k] for k in BATCH_SETTINGS}
    tokenizer, vocabulary, conversion, books = str(llama3_tokenizer_json()), "llama3", {}, None
    if args.smoke:
        from benchmarks.smoke import tiny_teacher

        args.shape, args.device, args.tokens = "tiny", "cpu", 100
        settings |= SMOKE_SETTINGS
        tokenizer, vocabulary, conversion, books = str(tiny_teacher()), "smollm2", {"conversion": "torch"}, {"Psalms"}
        args.host_tokens, args.host_rounds = 3_000, 1
    if not args.host_only:
        teacher_dump(args, settings, tokenizer, vocabulary, conversion, books)
    host_side(args, tokenizer, vocabulary)


def host_side(args, tokenizer_source: str, vocabulary: str) -> None:
    """The host side after the forward (:mod:`benchmarks.dump_host`), printed and perhaps written."""
    from benchmarks.dump_host import host_report
    from distill.conversion.converter import Converter

    tokenizer = load_teacher_tokenizer(tokenizer_source)
    converter = Converter(vocab_from_tokenizer(tokenizer, name=vocabulary))
    lines, summary, table = host_report(converter, tokenizer, args.host_tokens, args.host_rounds)
    print("\n".join(lines))
    print(summary)
    if args.markdown and not args.smoke:
        from benchmarks.results import write_section

        write_section("dump_host", f"{lines[0]};\n{lines[1].strip()}\n\n{table}\n\n{summary}")


def teacher_dump(args, settings: dict, tokenizer: str, vocabulary: str, conversion: dict, books) -> None:
    """The dump with a random teacher on ``args.device``: its throughput, memory and conversions."""
    device = torch.device(args.device)
    teacher = random_teacher(args.shape, device, tokenizer, vocabulary)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_corpus(tmp / "kjv.jsonl", 4 * args.tokens, books)
        warm = DumpConfig.of(
            teacher=teacher.name,
            corpus=CorpusSpec(str(tmp / "kjv.jsonl"), max_docs=2),
            output=str(tmp / "warm"),
            progress=False,
            **settings,
            **conversion,
        )
        dump_with_teacher(warm, teacher)  # compiles kernels, builds the device tables
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        config = DumpConfig.of(
            teacher=teacher.name,
            corpus=CorpusSpec(str(tmp / "kjv.jsonl")),
            output=str(tmp / "store"),
            progress=False,
            **settings,
            **conversion,
        )
        s = dump_with_teacher(config, teacher)
        wall = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    host_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    terms = memory_terms(settle(config, teacher.device), teacher)
    on_device = [t for t in terms if t.on_device or device.type != "cuda"]
    formula = sum(t.bytes for t in on_device)
    host_formula = sum(t.bytes for t in terms if not t.on_device)
    difference, deterministic = conversion_difference(teacher, kjv_chapters()[0][1], settings["max_length"])
    print(
        f"random {vocabulary} {args.shape} teacher ({teacher.dtype} trunk, float32 head) on {device}; "
        + ", ".join(f"{k} {v}" for k, v in settings.items())
    )
    rows = [
        ("documents", f"{s.documents:,}"),
        ("teacher tokens", f"{s.tokens:,}"),
        ("pass wall time", f"{s.seconds:.1f} s (with setup {wall:.1f} s)"),
        ("  teacher forward (trunk + head)", f"{s.forward_seconds:.1f} s"),
        ("  device conversion", f"{s.device_convert_seconds:.1f} s"),
        ("  outside the forward", f"{s.outside_forward_seconds:.1f} s"),
        ("tokens/s", f"{s.tokens / s.seconds:,.0f}"),
        ("store bytes per text byte", f"{s.bytes_per_text_byte:.2f}"),
        ("peak GPU memory", "n/a (not cuda)" if peak is None else f"{peak / 1e9:.2f} GB"),
        ("formula (device terms)", f"{formula / 1e9:.2f} GB"),
        ("  " + ", ".join(f"{t.name} {t.bytes / 1e9:.2f}" for t in on_device), ""),
        ("peak host RSS", f"{host_peak / 1e9:.2f} GB"),
        ("formula (host terms)", "n/a (not cuda)" if device.type != "cuda" else f"{host_formula / 1e9:.2f} GB"),
        ("max |torch - numba| value", f"{difference:.2e}"),
        ("device conversion repeatable", "bit-identical" if deterministic else "DIFFERS"),
    ]
    for name, value in rows:
        print(f"{name:<36}{value:>32}")
    measured = peak if peak is not None else host_peak
    print(
        f"share outside the forward = {s.outside_forward_seconds / s.seconds:.1%} (goal <= 5%); "
        f"{s.tokens / s.seconds:,.0f} tokens/s; memory: formula / peak on {device} = {formula / measured:.3f}"
    )


if __name__ == "__main__":
    main()
