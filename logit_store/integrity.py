"""Store-level integrity (FORMAT.md, "Integrity"): every writer's shards form a gap-free
sequence, each v2 shard names its writer, sequence, first document and the manifest it was
written for, and a finished writer leaves ``writer-RRRRR.json`` with its shard and document
counts, so a missing, renamed or foreign shard and an edited manifest are reported."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from common.errors import UserError
from common.files import read_regular
from logit_store.file_names import COMPLETION_RECORD, SHARD
from logit_store.hub_files import store_names
from logit_store.manifest import write_atomic
from logit_store.shard import ShardReader


@dataclass(frozen=True)
class Completion:
    """What a writer held when it closed."""

    writer_id: int
    shards: int
    documents: int
    kl_bits: float | None = None  # KL(exact || stored) summed over its documents' positions, if known


def completion_path(directory: Path, writer_id: int) -> Path:
    return Path(directory) / COMPLETION_RECORD(writer_id)


def write_completion(directory: Path, completion: Completion) -> None:
    record = {"writer_id": completion.writer_id, "shards": completion.shards, "documents": completion.documents}
    if completion.kl_bits is not None:
        record["kl_bits"] = completion.kl_bits
    text = json.dumps(record)
    write_atomic(completion_path(directory, completion.writer_id), (text + "\n").encode(), completion.writer_id)


def read_completion(directory: Path, writer_id: int) -> Completion | None:
    path = completion_path(directory, writer_id)
    if not path.exists():
        return None
    try:
        data = json.loads(read_regular(path).decode("utf-8"))
        completion = Completion(
            int(data["writer_id"]), int(data["shards"]), int(data["documents"]), _kl_bits(data.get("kl_bits"))
        )
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise UserError(f"{path} is corrupt ({exc})") from None
    if completion.writer_id != writer_id:
        raise UserError(f"{path} is corrupt (it names writer {completion.writer_id})")
    return completion


def _kl_bits(value) -> float | None:
    """A completion record's ``kl_bits``: absent (None) or a finite non-negative number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise ValueError(f"kl_bits {value!r} is not a finite non-negative number")
    return float(value)


def shard_sequences(directory: Path) -> dict[int, list[int]]:
    """Writer id → sorted sequence numbers of its complete shards in ``directory`` (a Hub copy's: those
    its file list names, fetched or not)."""
    found: dict[int, list[int]] = {}
    for name in store_names(directory):
        if (numbers := SHARD.numbers(name)) is not None:
            writer_id, sequence = numbers
            found.setdefault(writer_id, []).append(sequence)
    return {w: sorted(seqs) for w, seqs in sorted(found.items())}


def check_sequence(directory: Path, writer_id: int, sequences: list[int]) -> None:
    missing = sorted(set(range(max(sequences) + 1)) - set(sequences)) if sequences else []
    if missing:
        names = ", ".join(SHARD(writer_id, s) for s in missing[:3]) + (" …" if len(missing) > 3 else "")
        raise UserError(
            f"{directory}: shard {names} of writer {writer_id} is missing "
            f"(found {len(sequences)} shards up to number {max(sequences)})"
        )


def check_writer(directory: Path, writer_id: int, shards: list[ShardReader], identity: bytes | None) -> bool:
    """Check one writer's shards (in sequence order); True if the writer finished."""
    documents = 0
    for sequence, shard in enumerate(shards):
        record = shard.record
        if record is not None:
            if (record.writer_id, record.sequence) != (writer_id, sequence):
                raise UserError(
                    f"shard {shard.name} was written as {SHARD(record.writer_id, record.sequence)} (renamed or moved)"
                )
            if record.first_document != documents:
                raise UserError(
                    f"shard {shard.name} starts at the writer's document {record.first_document}, "
                    f"but its earlier shards hold {documents} (a shard replaced from another run)"
                )
            if identity is not None and record.identity != identity:
                raise UserError(
                    f"shard {shard.name} was written for a different manifest "
                    f"(the manifest's encoding, settings or vocabulary were edited, or the shard is from another store)"
                )
        documents += shard.num_docs
    completion = read_completion(directory, writer_id)
    if completion is None:
        return False
    if (completion.shards, completion.documents) != (len(shards), documents):
        raise UserError(
            f"{completion_path(directory, writer_id).name}: writer {writer_id} finished with "
            f"{completion.shards} shards and {completion.documents} documents, "
            f"the store holds {len(shards)} shards and {documents} documents (shards missing)"
        )
    return True


def completed_writers(directory: Path) -> list[int]:
    """Writer ids that left a completion record (whether or not any of their shards remain)."""
    return sorted(
        numbers[0] for name in store_names(directory) if (numbers := COMPLETION_RECORD.numbers(name)) is not None
    )


def recorded_writers(manifest: dict) -> int | None:
    """How many writers the store's documents were dealt to, when its writer recorded it
    (``settings.writers``; FORMAT.md, "Integrity")."""
    settings = manifest.get("settings")
    count = settings.get("writers") if isinstance(settings, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) and 0 < count <= 100_000 else None


@dataclass(frozen=True)
class WriterStates:
    """The writers of a store that have not finished: ``unfinished`` hold shards but no completion
    record (still writing, or stopped midway); ``missing`` are writers the manifest counts that
    left neither (their dump never ran, or stopped before its first shard)."""

    unfinished: list[int]
    missing: list[int]

    def __bool__(self) -> bool:
        return bool(self.unfinished or self.missing)

    def describe(self) -> str:
        parts = []
        if self.unfinished:
            parts.append(f"{_writers(self.unfinished)} not finished (a dump still running or stopped midway)")
        if self.missing:
            parts.append(
                f"{_writers(self.missing)} never wrote (a dump that never ran or stopped before its first shard)"
            )
        return " and ".join(parts)


def _writers(ids: list[int]) -> str:
    shown = ", ".join(map(str, ids[:8])) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")
    return f"writer{'s' if len(ids) > 1 else ''} {shown}"


def writer_states(directory: Path, manifest: dict) -> WriterStates:
    """The store's unfinished and missing writers, from its file names alone (v2 stores; a v1
    store records no completion)."""
    if manifest.get("format_version", 2) < 2:
        return WriterStates([], [])
    finished = set(completed_writers(directory))
    started = set(shard_sequences(directory))
    count = recorded_writers(manifest) or 0
    unfinished = sorted(started - finished)
    missing = sorted(set(range(count)) - started - finished)
    return WriterStates(unfinished, missing)
