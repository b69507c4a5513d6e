"""``bytedistill inspect STORE``, ``bytedistill verify STORE`` and ``bytedistill push-store STORE REPO``.

STORE is a store directory or a store on the Hub, ``hf://datasets/OWNER/NAME[@REVISION]``
(:mod:`logit_store.hub`)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from common.hub import RETRIES, TIMEOUT_S
from configs.ranges import COUNT, NON_NEGATIVE, POSITIVE
from logit_store.file_names import SKIP_LIST
from logit_store.publish import COMMIT_BYTES, COMMIT_MESSAGE

STORE_HELP = "logit store directory, or a store on the Hub: hf://datasets/OWNER/NAME[@REVISION]"


@dataclass
class InspectConfig:
    store: str = field(metadata={"help": STORE_HELP, "positional": True})
    json: bool = field(default=False, metadata={"help": "print the summary as one JSON object"})


@dataclass
class VerifyConfig:
    store: str = field(metadata={"help": STORE_HELP, "positional": True})
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
    from logit_store.hub import is_hub_name, local_store
    from logit_store.skips import read_skips

    store = LogitStore(local_store(config.store))
    stats = store.stats()
    stats["directory"] = str(config.store if is_hub_name(config.store) else store.directory)
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
    from logit_store.hub import local_store
    from logit_store.verify import verify_store

    store = LogitStore(local_store(config.store))
    summary = verify_store(store, config.tolerance)
    if config.json:
        print(json.dumps(summary, sort_keys=True))
    else:
        print(
            f"OK: {summary['shards']} shards, {summary['chunks']} chunks, {summary['documents']:,} documents, "
            f"{summary['positions']:,} positions of the {summary['stream']} stream verified (max |sum-1| = {summary['max_normalisation_error']:.2e})"
            + _kl_note(summary["encoding_kl_bits_per_position"])
            + (f"; unfinished writers: {summary['unfinished_writers']}" if summary["unfinished_writers"] else "")
            + (f"; missing writers: {summary['missing_writers']}" if summary["missing_writers"] else "")
        )
    return 0


def _kl_note(kl_bits: float | None) -> str:
    """The encoding's mean KL as verify prints it (nothing where the writers did not record it)."""
    return "" if kl_bits is None else f"; encoding KL {kl_bits:.3g} bits per position (exact || stored, mean)"


@dataclass
class PushStoreConfig:
    store: str = field(metadata={"help": "finished logit store directory", "positional": True})
    repo_id: str = field(metadata={"help": "Hub dataset repo id, e.g. your-name/kjv-logits", "positional": True})
    private: bool = field(default=False, metadata={"help": "create the dataset repo as private"})
    revision: str | None = field(
        default=None, metadata={"help": "branch to push to (created if missing; default main)"}
    )
    commit_message: str = field(default=COMMIT_MESSAGE, metadata={"help": "commit message"})
    commit_bytes: int = field(
        default=COMMIT_BYTES,
        metadata={"help": "bytes of files per commit: a large store goes in several commits", "range": COUNT},
    )
    allow_partial: bool = field(
        default=False,
        metadata={"help": "publish a store whose dump has not finished (a writer unfinished or missing)"},
    )
    endpoint: str | None = field(
        default=None,
        metadata={
            "help": "Hub endpoint URL (default: HF_ENDPOINT or https://huggingface.co); the Hugging Face token goes "
            "only to those, another server gets the token in BYTEDISTILL_ENDPOINT_TOKEN"
        },
    )
    timeout: float = field(
        default=TIMEOUT_S,
        metadata={"help": "seconds to wait for the Hub to connect, and for each read or write", "range": POSITIVE},
    )
    retries: int = field(
        default=RETRIES,
        metadata={
            "help": "tries after the first of each Hub call (network error, timeout, 429, 5xx)",
            "range": NON_NEGATIVE,
        },
    )
    dry_run: bool = field(
        default=False,
        metadata={"help": "make push-store's checks (a missing token is reported), list the files, upload nothing"},
    )


def push_store(config: PushStoreConfig) -> int:
    """Publish a finished logit store as a Hub dataset repo (its own files, a file list and a card).

    Opens the store and reads every chunk's checksum, refuses a partial store (unless
    --allow-partial), then uploads its files in commits of at most --commit-bytes, the manifest,
    the file list (hub_files.json) and the dataset card last. A push that stopped continues: files
    already on the revision with the same bytes are not sent again. Train from it with
    --train-stores hf://datasets/REPO.
    """
    from common.hub import check_network_options
    from logit_store.publish import plan_store_push, upload_store

    check_network_options(config.timeout, config.retries)
    with plan_store_push(
        Path(config.store),
        config.repo_id,
        config.endpoint,
        need_token=not config.dry_run,
        allow_partial=config.allow_partial,
    ) as plan:
        if plan.left_out:
            print(
                f"warning: not uploading {len(plan.left_out)} file(s) that are not the store's: "
                f"{', '.join(plan.left_out)}",
                file=sys.stderr,
            )
        revision = config.revision or "main"
        if config.dry_run:
            for entry in plan.entries:
                print(f"{entry.size:>14,}  {entry.name}")
            total = sum(e.size for e in plan.entries) + len(plan.file_list) + len(plan.card)
            print(f"{total:>14,}  total, {len(plan.entries) + 2} files with hub_files.json and README.md")
            print(
                f"dry run: nothing was uploaded; push-store would send these files to the dataset "
                f"{config.repo_id}@{revision} at {plan.target.endpoint}, "
                + (plan.target.token_note if plan.target.token else f"but would refuse: {plan.target.token_note}")
            )
            return 0
        url, sent = upload_store(
            plan,
            private=config.private,
            revision=config.revision,
            commit_message=config.commit_message,
            commit_bytes=config.commit_bytes,
            timeout=config.timeout,
            retries=config.retries,
        )
        print(
            f"pushed {plan.directory} to {url} ({sent} files sent, {len(plan.entries) + 2 - sent} already there); "
            f"train from it with --train-stores hf://datasets/{config.repo_id}@{revision}"
        )
        return 0
