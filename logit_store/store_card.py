"""The dataset card (``README.md``) that ``push-store`` publishes with a store: what the store holds,
read from its manifest and its shard indexes, and how to train from it."""

from __future__ import annotations

import json
from importlib import metadata

from logit_store.reader import LogitStore
from logit_store.skips import read_skips


def bytedistill_version() -> str:
    try:
        return metadata.version("bytedistill")
    except metadata.PackageNotFoundError:
        return "unknown"


def _row(what: str, value) -> str:
    shown = value if isinstance(value, str) else json.dumps(value)
    return f"| {what} | {shown.replace('|', '&#124;')} |"


def store_card(store: LogitStore, repo_id: str) -> str:
    """The card's text for ``store`` published as the dataset ``repo_id``."""
    stats = store.stats()
    manifest = store.manifest
    bpb = stats["bytes_per_text_byte"]
    rows = [
        ("teacher", stats["teacher"] or "unknown"),
        ("teacher weights", manifest.get("teacher_hash") or "not recorded"),
        ("stream", stats["stream"]),
        ("encoding", f"{stats['encoding']} {json.dumps(stats['encoding_params'])}"),
        ("vocabulary hash", stats["vocab_hash"]),
        ("corpus fingerprint", manifest.get("corpus_hash") or "not recorded"),
        ("documents", f"{stats['documents']:,}"),
        ("text bytes", f"{stats['text_bytes']:,}"),
        ("positions", f"{stats['positions']:,}"),
        ("size", f"{stats['size_on_disk']:,} bytes ({stats['shards']} shards, {stats['chunks']} chunks)"),
        ("bytes per text byte", f"{bpb:.2f}" if bpb is not None else "n/a"),
        ("skipped documents", f"{len(read_skips(store.directory)):,} (listed in skipped-*.jsonl)"),
        ("unfinished writers", stats["unfinished_writers"] or "none"),
        ("missing writers", stats["missing_writers"] or "none"),
        ("format version", manifest.get("format_version")),
        ("bytedistill", bytedistill_version()),
    ]
    table = "\n".join(["| field | value |", "|---|---|", *(_row(what, value) for what, value in rows)])
    return f"""---
tags:
- bytedistill
- logit-store
- knowledge-distillation
---

# Teacher distributions: {stats["teacher"] or "unknown teacher"}

A bytedistill logit store: for every document, the teacher's token ids and its
exact next-symbol distributions over the byte stream, compressed and checksummed
(`manifest.json`, `vocab.bin`, `shard-*.bds`; `hub_files.json` lists every file with its size and
SHA-256). Nothing here is top-k or bound to the teacher's tokenizer on the student's side.

{table}

## Train a byte student from it

```
bytedistill train --train-stores hf://datasets/{repo_id} --output-dir runs/student
```

Shards are fetched into the Hub cache as training first reads them, each checked against
`hub_files.json`; `bytedistill inspect`, `verify` and `score` take the same name.
"""
