"""``bytedistill inspect STORE`` and ``bytedistill verify STORE``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from configs.ranges import POSITIVE
from logit_store.file_names import SKIP_LIST


@dataclass
class InspectConfig:
    store: str = field(metadata={"help": "logit store directory", "positional": True})
    json: bool = field(default=False, metadata={"help": "print the summary as one JSON object"})


@dataclass
class VerifyConfig:
    store: str = field(metadata={"help": "logit store directory", "positional": True})
    tolerance: float = field(
        default=1e-3, metadata={"help": "largest allowed |sum of a position's probabilities - 1|", "range": POSITIVE}
    )
    json: bool = field(default=False, metadata={"help": "print the summary as one JSON object"})


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return str(n)


def inspect(config: InspectConfig) -> int:
    """Summarise a logit store (documents, bytes, positions, size, encoding).

    Reads the store's manifest and shard indexes only (nothing is decompressed).
    """
    from logit_store import LogitStore
    from logit_store.skips import read_skips

    store = LogitStore(config.store)
    stats = store.stats()
    stats["directory"] = str(store.directory)
    stats["format_version"] = store.manifest["format_version"]
    stats["corpus_hash"] = store.manifest.get("corpus_hash")
    stats["settings"] = store.manifest.get("settings")
    stats["skipped_documents"] = len(read_skips(store.directory))
    if config.json:
        print(json.dumps(stats, sort_keys=True))
        return 0
    bpb = stats["bytes_per_text_byte"]
    lines = [
        f"store:           {stats['directory']} (format {stats['format_version']})",
        f"teacher:         {stats['teacher']}",
        f"vocab hash:      {stats['vocab_hash']}",
        f"encoding:        {stats['encoding']} {json.dumps(stats['encoding_params'])}",
        f"stream:          {stats['stream']}",
        f"documents:       {stats['documents']:,}",
        f"text bytes:      {stats['text_bytes']:,}",
        f"positions:       {stats['positions']:,}",
        f"tokens:          {stats['tokens']:,}",
        f"skipped:         {stats['skipped_documents']:,} documents the teacher could not encode ({SKIP_LIST.shown})",
        f"shards/chunks:   {stats['shards']} / {stats['chunks']}",
        (
            f"size on disk:    {_human(stats['size_on_disk'])} ({stats['size_on_disk']:,} bytes: the shards, "
            "the manifest and the one-off vocabulary file)"
        ),
        (
            f"bytes/text byte: {bpb:.2f} on disk; {stats['shard_bytes_per_text_byte']:.2f} in the shards alone "
            "(what dump reports)"
        )
        if bpb is not None
        else "bytes/text byte: n/a",
    ]
    if stats["unfinished_writers"]:
        lines.append(
            f"unfinished:      writers {stats['unfinished_writers']} have no completion record "
            "(still writing, or stopped)"
        )
    if stats["missing_writers"]:
        lines.append(
            f"missing:         writers {stats['missing_writers']} of the {stats['settings']['writers']} the store "
            "counts left no shard and no completion record (their dump never ran, or stopped early)"
        )
    print("\n".join(lines))
    return 0


def verify(config: VerifyConfig) -> int:
    """Check every checksum and decode every document of a logit store.

    Checks every shard's index and every chunk's checksum, decodes every document and checks that
    its distributions are normalised. Exits 0 with a summary, or 2 naming the first bad
    shard/chunk/document.
    """
    from logit_store import LogitStore
    from logit_store.verify import verify_store

    store = LogitStore(config.store)
    summary = verify_store(store, config.tolerance)
    if config.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(
            f"OK: {summary['shards']} shards, {summary['chunks']} chunks, {summary['documents']:,} documents, "
            f"{summary['positions']:,} positions of the {summary['stream']} stream verified (max |sum-1| = {summary['max_normalisation_error']:.2e})"
            + (f"; unfinished writers: {summary['unfinished_writers']}" if summary["unfinished_writers"] else "")
            + (f"; missing writers: {summary['missing_writers']}" if summary["missing_writers"] else "")
        )
    return 0
