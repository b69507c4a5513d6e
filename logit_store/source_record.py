"""What a writer's documents were read from (FORMAT.md, "Directory"): ``source-RRRRR.json``.

A writer that is given its source (a digest per piece of input it was dealt, by a label the user
can find) keeps it beside its shards. Resuming with a different source is refused while the writer
holds finished shards (their documents would no longer be the input's), and the record is
replaced while it holds none. The store itself does not interpret labels or digests.
"""

from __future__ import annotations

import json
from pathlib import Path

from common.errors import UserError
from common.files import read_regular
from logit_store.file_names import SOURCE_RECORD
from logit_store.manifest import write_atomic

SOURCE_START = b'{"writer_id": '  # how every source record begins
MAX_RECORD_BYTES = 256 << 20  # a label and a digest per 32 MiB piece: far beyond any corpus


def source_path(directory: Path, writer_id: int) -> Path:
    return Path(directory) / SOURCE_RECORD(writer_id)


def read_source_record(directory: Path, writer_id: int) -> dict[str, str] | None:
    """The digests by label that writer ``writer_id`` recorded, or None if it recorded none."""
    path = source_path(directory, writer_id)
    if not path.exists():
        return None
    if path.stat().st_size > MAX_RECORD_BYTES:
        raise UserError(f"{path} is corrupt ({path.stat().st_size:,} bytes, at most {MAX_RECORD_BYTES:,})")
    try:
        data = json.loads(read_regular(path))
        pieces = data["pieces"]
        valid = data["writer_id"] == writer_id and all(isinstance(v, str) for v in pieces.values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise UserError(f"{path} is corrupt ({exc})") from None
    if not valid:
        raise UserError(f"{path} is corrupt (not writer {writer_id}'s record of its source)")
    return pieces


def source_difference(recorded: dict[str, str], given: dict[str, str]) -> str | None:
    """The first difference between two sources, in words (None if they are the same)."""
    for label in sorted(recorded.keys() | given.keys()):
        if label not in given:
            return f"{label} is gone"
        if label not in recorded:
            return f"{label} is new"
        if recorded[label] != given[label]:
            return f"{label} changed"
    return None


def keep_source_record(directory: Path, writer_id: int, pieces: dict[str, str], finished_shards: int) -> None:
    """Record ``pieces`` as the writer's source, refusing a different one if it holds finished shards."""
    recorded = read_source_record(directory, writer_id)
    if recorded == pieces:
        return
    if finished_shards:  # a writer records its source before it finishes a shard
        change = (
            "it kept no record of it"
            if recorded is None
            else f"{source_difference(recorded, pieces)} since they were stored"
        )
        raise UserError(
            f"{directory}: writer {writer_id} stored documents of another corpus ({change}): "
            "restore the corpus, or choose another --output"
        )
    text = json.dumps({"writer_id": writer_id, "pieces": dict(sorted(pieces.items()))})
    write_atomic(source_path(directory, writer_id), (text + "\n").encode(), writer_id)
