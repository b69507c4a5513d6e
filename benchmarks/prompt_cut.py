"""Greedy continuations of prompts cut inside a word, with and without healing, against cuts at
the word boundary before them.

    python -m benchmarks.prompt_cut [MODEL_FOLDER] [--books Ruth] [--cuts 200] [--seed 0] [--prompts] [--smoke]

MODEL_FOLDER is a fused (or ``<eot>``) student's export, whose prompts carry the teacher's flags
and so can be cut inside a word (default ``runs/fused/model``:
``python -m examples.quickstart --stream fused --workdir runs/fused``); a bytes student reads plain
bytes, has no flags to heal, and is refused.

Documents: KJV chapters of ``--books`` (default Ruth, the quickstart's held-out book). Cuts are
drawn at uniformly random byte offsets (at least 16 bytes from either end) until ``--cuts`` of
them fall inside a word (an ASCII letter on both sides); the fraction that did is printed. For a
cut inside a word at offset ``c`` the target is the true text's next 16 bytes ``doc[c:c+16]``:

- healed: the prompt ``doc[:c]`` through ``tokenizer.encode_prompt`` (teacher tokens up to the
  last word, the word's bytes fed with the student placing ``<eot>``), as ``bytedistill generate``
  and ``model.generate(**tokenizer.prompt(...))`` do;
- today: ``doc[:c]`` as a complete text (the teacher's marks, a final ``<eot>`` at the cut);
- at boundary: ``doc[:w]`` as a complete text, ``w`` the word boundary before the cut (before the
  word's leading space), greedy ``c - w + 16`` bytes, of which the last 16 are compared with the
  same target bytes; its own next 16 bytes ``doc[w:w+16]`` are shown too, for reference.

Accuracy is the fraction of the 16 bytes equal to the true byte at the same position. Every
continuation goes through the documented path (``AutoTokenizer(..., trust_remote_code=True)``,
the folder's ``tokenization_bytedistill.py``) and ``students.release.generate.continue_stream`` (greedy,
the window sliding past the trained context). Goal: healed ≥ 0.95 × at boundary. ``--prompts``
also prints the four hand-made prompts' continuations through ``model.generate(**tokenizer.prompt(p))``.
``--smoke``: 5 cuts in 2 chapters, and the prompts, with the toy exported student of
``benchmarks/smoke.py`` (built in a temporary folder): seconds, a check that the benchmark runs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.common import kjv_chapters
from students.release.generate import GenerateOptions, continue_stream

TARGET = 16
PROMPTS = ["In the begi", "In the beginning God creat", "And God sa", "And God said"]


@dataclass
class Cut:
    document: bytes
    at: int  # the cut: the prompt is document[:at]
    boundary: int  # the word boundary before it (before the word's leading space)


def is_letter(value: int) -> bool:
    return chr(value).isalpha() and value < 128


def word_boundary(data: bytes, at: int) -> int:
    start = at
    while start > 0 and is_letter(data[start - 1]):
        start -= 1
    return start - 1 if start > 0 and data[start - 1] == ord(" ") else start


def draw_cuts(documents: list[bytes], mid_word: int, seed: int) -> tuple[list[Cut], int]:
    """Random cuts until ``mid_word`` fall inside a word; also how many were drawn in all."""
    rng = np.random.default_rng(seed)
    usable = [d for d in documents if len(d) > 2 * TARGET + 1]
    cuts, drawn = [], 0
    while len(cuts) < mid_word:
        data = usable[rng.integers(len(usable))]
        at = int(rng.integers(TARGET, len(data) - TARGET))
        drawn += 1
        if is_letter(data[at - 1]) and is_letter(data[at]):
            cuts.append(Cut(data, at, word_boundary(data, at)))
    return cuts, drawn


def accuracy(generated: bytes, truth: bytes) -> float:
    return sum(a == b for a, b in zip(generated, truth)) / len(truth)


def measure(model, tokenizer, cuts: list[Cut]) -> dict[str, list[float]]:
    greedy = GenerateOptions(max_new_bytes=TARGET, greedy=True)
    rows: dict[str, list[float]] = {
        k: [] for k in ("healed", "today", "boundary", "boundary own", "healed letter", "today letter")
    }
    for cut in cuts:
        prompt, truth = cut.document[: cut.at], cut.document[cut.at : cut.at + TARGET]
        healed = continue_stream(model, *tokenizer.encode_prompt(prompt), greedy)
        today = continue_stream(model, tokenizer.encode_bytes(prompt), b"", greedy)
        lead = cut.at - cut.boundary
        wide = GenerateOptions(max_new_bytes=lead + TARGET, greedy=True)
        boundary = continue_stream(model, tokenizer.encode_bytes(cut.document[: cut.boundary]), b"", wide)
        rows["healed"].append(accuracy(healed, truth))
        rows["today"].append(accuracy(today, truth))
        rows["boundary"].append(accuracy(boundary[lead:], truth))
        rows["boundary own"].append(accuracy(boundary[:TARGET], cut.document[cut.boundary : cut.boundary + TARGET]))
        rows["healed letter"].append(float(bool(healed) and is_letter(healed[0])))
        rows["today letter"].append(float(bool(today) and is_letter(today[0])))
    return rows


def prompt_table(model, tokenizer) -> str:
    """The hand-made prompts through the model card's path: ``model.generate(**tokenizer.prompt(p))``."""
    lines = [
        "| prompt | committed stream tail | fed with the student's marks | continuation (greedy) |",
        "|---|---|---|---|",
    ]
    for prompt in PROMPTS:
        inputs = tokenizer.prompt(prompt)
        output = model.generate(**inputs, max_new_tokens=40, do_sample=False)[0]
        start = inputs["input_ids"].shape[1]
        symbols, open_bytes = tokenizer.encode_prompt(prompt.encode())
        tail = tokenizer.convert_tokens_to_string([tokenizer.convert_ids_to_tokens(s) for s in symbols[-6:]])
        fed = []
        for s in output[start:].tolist():
            fed.append(s)
            if sum(1 for f in fed if f < 256) == len(open_bytes):
                break
        shown = tokenizer.convert_tokens_to_string([tokenizer.convert_ids_to_tokens(s) for s in fed])
        text = tokenizer.decode(output, skip_special_tokens=True)[:48]
        lines.append(f"| `{prompt}` | `{tail}` | `{shown}` | `{text}` |".replace("\n", "\\n"))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "model", nargs="?", type=Path, default=Path("runs/fused/model"), help="a fused student's exported folder"
    )
    parser.add_argument("--books", nargs="+", default=["Ruth"], help="KJV books whose chapters are the documents")
    parser.add_argument("--chapters", type=int, default=0, help="only the first N chapters (0: all)")
    parser.add_argument("--cuts", type=int, default=200, help="cuts inside a word to measure")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the cut offsets")
    parser.add_argument("--prompts", action="store_true", help="also print the hand-made prompts' table")
    parser.add_argument("--smoke", action="store_true", help="a toy exported student (seconds): a check that it runs")
    args = parser.parse_args()
    if not args.smoke:
        measure_and_print(args)
        return
    from benchmarks.smoke import tiny_exported_student

    args.cuts, args.chapters, args.prompts = 5, 2, True
    with tempfile.TemporaryDirectory() as tmp:
        args.model = tiny_exported_student(Path(tmp)).folder
        measure_and_print(args)


def measure_and_print(args) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bytestream.stream_tokenizer import TEACHER_TOKENIZER_FILE

    if not (args.model / TEACHER_TOKENIZER_FILE).is_file():  # a bytes student's folder: plain bytes, no flags
        raise SystemExit(
            f"{args.model} has no {TEACHER_TOKENIZER_FILE}: not a fused student's folder, whose prompts carry the "
            "teacher's flags (python -m examples.quickstart --stream fused --workdir runs/fused makes one)"
        )
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=True)
    chapters = kjv_chapters(set(args.books))
    documents = [text for _, text in (chapters[: args.chapters] if args.chapters else chapters)]
    cuts, drawn = draw_cuts(documents, args.cuts, args.seed)
    start = time.perf_counter()
    rows = measure(model, tokenizer, cuts)
    seconds = time.perf_counter() - start
    mean = {name: float(np.mean(values)) for name, values in rows.items()}
    print(
        f"{len(cuts)} cuts inside a word out of {drawn} random offsets ({len(cuts) / drawn:.0%}) in "
        f"{len(documents)} chapters of {', '.join(args.books)}; greedy, {TARGET} bytes; {seconds:.0f} s"
    )
    print("| cut inside a word | next-16-byte accuracy | first byte a letter |")
    print("|---|---|---|")
    print(
        f"| healed (tokenizer.encode_prompt / prompt) | {mean['healed']:.3f} | {sum(rows['healed letter']):.0f} / {len(cuts)} |"
    )
    print(
        f"| not healed (the teacher's <eot> at the cut) | {mean['today']:.3f} | {sum(rows['today letter']):.0f} / {len(cuts)} |"
    )
    print(f"| cut at the word boundary before, same target bytes | {mean['boundary']:.3f} | |")
    print(f"| (reference: boundary cut, its own next 16 bytes) | {mean['boundary own']:.3f} | |")
    ratio = mean["healed"] / mean["boundary"] if mean["boundary"] else float("nan")
    verdict = "met" if ratio >= 0.95 else "NOT met"
    print(
        f"summary: healed {mean['healed']:.3f}, not healed {mean['today']:.3f}, at boundary {mean['boundary']:.3f}; "
        f"healed / at boundary = {ratio:.2f} (goal >= 0.95: {verdict})"
    )
    if args.prompts:
        print()
        print(prompt_table(model, tokenizer))


if __name__ == "__main__":
    main()
