"""What a resume's corpus check costs each worker: the manifest's fingerprint (the listing: names and
sizes), then a SHA-256 of each piece dealt to the worker's writers (``share_fingerprints``, once
at every dump start), against reading the documents of its share (``writer_documents``, which
every dump does anyway), on one generated ``.jsonl`` corpus of KJV verses, with 1, 2 and 4
workers of 8 writers.

    python -m benchmarks.corpus_fingerprint [--megabytes 200] [--smoke]

Prints a table of bytes read (counted by the kernel) and seconds per worker and a ``summary`` line.
``--smoke``: the first 300 KB of KJV chapters instead: a check that the benchmark runs.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from benchmarks.common import kjv_chapters
from distill.corpus.shares import share_fingerprints, writer_documents
from distill.corpus.spec import CorpusSpec, corpus_fingerprint
from distill.dump.sharding import writers_of

WRITERS = 8
SMOKE_BYTES = 300_000


def write_corpus(path: Path, target_bytes: int) -> int:
    """KJV chapters as .jsonl records, the whole book repeated to about ``target_bytes`` (below
    one book, its first chapters up to that); returns the file's size."""
    records = [json.dumps({"text": text.decode()}).encode() + b"\n" for _, text in kjv_chapters()]
    book = b"".join(records)
    with path.open("wb") as f:
        if target_bytes < len(book):
            written = 0
            for record in records:
                if written >= target_bytes:
                    break
                written += f.write(record)
        else:
            for _ in range(target_bytes // len(book)):
                f.write(book)
    return path.stat().st_size


def read_bytes() -> int:
    """Bytes this process has read through system calls so far."""
    return int(dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())["rchar"])


def measured(step) -> tuple[float, int]:
    """(seconds, bytes read) of one call."""
    start, before = time.perf_counter(), read_bytes()
    step()
    return time.perf_counter() - start, read_bytes() - before


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument(
        "--megabytes", type=int, default=200, help="megabytes of the generated .jsonl corpus of KJV verses"
    )
    parser.add_argument(
        "--smoke", action="store_true", help=f"{SMOKE_BYTES // 1000} KB (seconds): a check that it runs"
    )
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "corpus.jsonl"
        size = write_corpus(path, SMOKE_BYTES if args.smoke else args.megabytes * 1_000_000)
        spec = CorpusSpec(str(path))
        listing, _ = measured(lambda: corpus_fingerprint(spec))
        for workers in (1, 2, 4):
            mine = writers_of(0, workers, WRITERS)
            check = measured(lambda mine=mine: share_fingerprints(spec, WRITERS, mine))
            read = measured(lambda mine=mine: sum(1 for _ in writer_documents(spec, WRITERS, mine)))
            rows.append((workers, *check, *read))
    print(
        f"corpus: {size / 1e6:,.{1 if args.smoke else 0}f} MB of .jsonl, {WRITERS} writers; "
        f"manifest fingerprint {listing * 1e3:.1f} ms"
    )
    print(f"{'workers':>7} {'check MB':>9} {'check s':>8} {'read MB':>8} {'read s':>7} {'check/read':>10}")
    for workers, check_s, check_b, read_s, read_b in rows:
        print(
            f"{workers:>7} {check_b / 1e6:9.1f} {check_s:8.2f} {read_b / 1e6:8.1f} {read_s:7.2f} {check_s / read_s:10.2f}"
        )
    shares = ", ".join(f"{workers}: {check_b / size:.2f}" for workers, _, check_b, _, _ in rows)
    worst = max(check_s / read_s for _, check_s, _, read_s, _ in rows)
    print(
        f"summary: worker 0 checks this share of the corpus (by workers) {shares}; the check costs at most "
        f"{worst:.2f}x reading its documents"
    )


if __name__ == "__main__":
    main()
