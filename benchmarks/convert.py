"""Conversion speed on the real Llama-3 vocabulary (V = 128,256), per core.

Prints the trie build time, tokens/s of the Numba conversion, the floor (a bare float32 softmax
over the same rows with torch, one thread), their ratio on a line starting with ``ratio``, and the
torch conversion path on the CPU. Rows are random float32 logits; tokens come from KJV text. The
floor and the conversions are timed in alternating rounds (each round times each once; the best
round of each is kept), so that a change in the machine's load moves them together.

Two column orders are timed: rows in the teacher's id order (the conversion gathers each row into
byte-string order), and rows from a teacher whose output layer ``dump`` has permuted into that
order (``Converter.sorted_columns``), which the conversion reads contiguously. ``dump`` uses the
second; the ``ratio`` line is for it.

    python -m benchmarks.convert [--tokens 512] [--repeats 3] [--smoke] [--markdown]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from benchmarks.common import kjv_chapters, llama3_tokenizer_json
from bytestream.trie import build_trie
from bytestream.vocab import load_teacher_tokenizer, vocab_from_tokenizer
from distill.conversion.converter import Converter
from distill.conversion.rows import ColumnOrder
from distill.teacher.encode import DocumentEncoder

RATIO_GOAL = 1.2  # the conversion in the dump's column order against the bare softmax


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def alternating(jobs: dict, rounds: int) -> dict[str, float]:
    """Each job timed once per round, in turn, ``rounds`` rounds; the best time of each."""
    best = {name: float("inf") for name in jobs}
    for _ in range(rounds):
        for name, job in jobs.items():
            best[name] = min(best[name], best_of(job, 1))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512, help="teacher tokens per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="alternating timed rounds; the best of each is kept")
    parser.add_argument("--smoke", action="store_true", help="toy sizes (seconds): a check that the benchmark runs")
    parser.add_argument("--markdown", action="store_true", help="write the table into docs/RESULTS.md")
    args = parser.parse_args()
    if args.smoke:
        args.tokens, args.repeats = 16, 1
    torch.set_num_threads(1)

    tokenizer = load_teacher_tokenizer(llama3_tokenizer_json())
    vocab = vocab_from_tokenizer(tokenizer, name="llama3")
    start = time.perf_counter()
    build_trie(vocab)
    first_build = time.perf_counter() - start
    build = best_of(lambda: build_trie(vocab), args.repeats)
    converter = Converter(vocab)

    text = b"\n".join(t for _, t in kjv_chapters({"Genesis"}))
    ids = DocumentEncoder(tokenizer, vocab).encode(text)[: args.tokens]
    rows = len(ids) + 1
    logits = (np.random.default_rng(0).standard_normal((rows, vocab.size)) * 3).astype(np.float32)
    logits_t = torch.from_numpy(logits)
    permuted = np.ascontiguousarray(logits[:, converter.sorted_columns])
    converter.convert_numba(ids[:4], logits[:5])  # compile / load the Numba cache
    converter.convert_torch(ids[:4], logits_t[:5])

    jobs = {
        "floor": lambda: torch.softmax(logits_t, dim=-1),
        "sorted": lambda: converter.convert_numba(ids, permuted, columns=ColumnOrder.SORTED),
        "teacher": lambda: converter.convert_numba(ids, logits),
    }
    best = alternating(jobs, args.repeats)
    t_floor, t_numba, t_teacher = best["floor"], best["sorted"], best["teacher"]
    t_torch = best_of(lambda: converter.convert_torch(ids, logits_t), 1)  # far from the floor: timed once
    bytes_per_token = len(vocab.bytes_of(ids)) / len(ids)

    print(
        f"Llama-3 vocabulary: V = {vocab.size:,}; {len(ids)} KJV tokens ({bytes_per_token:.2f} bytes/token), one thread"
    )
    print(f"{'what':<46}{'time':>12}{'tokens/s':>14}")
    print(f"{'trie build (first call, incl. JIT cache)':<46}{first_build:>11.3f}s{'':>14}")
    print(f"{'trie build (warm)':<46}{build:>11.3f}s{'':>14}")
    timed = [
        ("floor: torch.softmax float32, same rows", t_floor),
        ("Numba conversion, sorted columns (dump)", t_numba),
        ("Numba conversion, teacher id order", t_teacher),
        ("torch conversion on CPU, teacher id order", t_torch),
    ]
    for name, t in timed:
        print(f"{name:<46}{t * 1e3:>10.1f}ms{len(ids) / t:>14,.0f}")
    ratio = t_numba / t_floor
    verdict = "met" if ratio <= RATIO_GOAL else "MISSED"
    print(f"ratio numba(sorted columns)/floor = {ratio:.2f} (goal <= {RATIO_GOAL}: {verdict}; alternating rounds)")
    print(f"  numba(teacher id order)/floor = {t_teacher / t_floor:.2f}; torch-cpu/floor = {t_torch / t_floor:.2f}")
    if args.markdown and not args.smoke:
        from benchmarks.results import markdown_table, write_section

        rows = [["trie build (warm)", f"{build:.3f} s", ""]]
        rows += [[name, f"{t * 1e3:.1f} ms", f"{len(ids) / t:,.0f}"] for name, t in timed]
        rows += [["ratio numba (sorted columns) / floor", f"{t_numba / t_floor:.2f}", ""]]
        write_section("convert", markdown_table(["what", "time", "tokens/s"], rows))


if __name__ == "__main__":
    main()
