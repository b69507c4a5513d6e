"""What the corpus fingerprint costs: hashing every byte of a local corpus (``corpus_fingerprint``,
done once at every dump start) against reading its documents (``select_documents``, which every
dump does anyway), on one generated ``.jsonl`` corpus of KJV verses.

    python -m benchmarks.corpus_fingerprint [--megabytes 200]

Prints a table of seconds and MB/s per step and a ``summary`` line with the ratio.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from benchmarks.common import kjv_chapters
from distill.corpus import CorpusSpec, corpus_fingerprint, select_documents


def write_corpus(path: Path, megabytes: int) -> int:
    """KJV chapters as .jsonl records, repeated to ``megabytes`` MB; returns the file's size."""
    records = b"".join(json.dumps({"text": text.decode()}).encode() + b"\n" for _, text in kjv_chapters())
    with path.open("wb") as f:
        for _ in range(max(1, megabytes * 1_000_000 // len(records))):
            f.write(records)
    return path.stat().st_size


def timed(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "corpus.jsonl"
        size = write_corpus(path, args.megabytes)
        spec = CorpusSpec(str(path))
        read = timed(lambda: sum(1 for _ in select_documents(spec)))
        fingerprint = timed(lambda: corpus_fingerprint(spec))
    print(f"corpus: {size / 1e6:,.0f} MB of .jsonl")
    print(f"{'step':<34} {'seconds':>8} {'MB/s':>8}")
    for name, seconds in (
        ("read the documents (every dump)", read),
        ("fingerprint: SHA-256 of every byte", fingerprint),
    ):
        print(f"{name:<34} {seconds:8.2f} {size / 1e6 / seconds:8.0f}")
    print(f"summary: the fingerprint costs {fingerprint / read:.2f}x one reading of the corpus")


if __name__ == "__main__":
    main()
