"""Each worker reads its share of the corpus: pieces dealt to the store's writers.

The corpus is cut into pieces, in an order and at places that depend on the corpus alone: a
text file, a ``.jsonl.zst`` file, ``JSONL_PIECE_BYTES`` of a ``.jsonl`` file (the lines that
start in them), a parquet row group, ``DATASET_PIECE_ROWS`` rows of a saved or downloaded
dataset, one shard (data file) of a streamed one. Piece ``p`` and every document in it belong to
writer ``p % writers`` (:mod:`distill.sharding` deals the writers to the workers), so a worker
opens only its writers' pieces, about 1/N of the corpus with N workers, and a document goes to
the same writer whatever the number of processes, which keeps resuming exact.

A document's key names where it lies, never which worker read it: ``file.jsonl@<byte offset>``
for a ``.jsonl`` line, ``file.parquet#<row>``, ``name[split][<row>]`` for a dataset row and
``name[split][<shard>:<row in shard>]`` for a streamed one; ``.txt`` and ``.jsonl.zst`` keys
are :mod:`distill.corpus`'s. The held-out decision is by content. ``max_docs`` and
``max_bytes`` count the corpus in order, so with them every worker reads the corpus up to the
limit (and keeps its own documents).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bytestream.errors import UserError
from distill.corpus import (
    CorpusCounts,
    CorpusSpec,
    check_source,
    corpus_files,
    file_key,
    is_saved_dataset,
    jsonl_documents,
    jsonl_text,
    load_dataset,
    record_text,
    select_documents,
    text_documents,
)
from distill.corpus_files import file_suffix

JSONL_PIECE_BYTES = 32 << 20
READ_BLOCK = 1 << 20
DATASET_PIECE_ROWS = 10_000


@dataclass(frozen=True)
class Piece:
    """One unit of reading: ``kind`` says how, ``start``/``stop`` where (bytes, a row group, rows
    or a shard, by kind)."""

    kind: str  # text | jsonl | jsonl.zst | parquet | dataset | streamed
    name: str  # the file's key (or the dataset's name)
    start: int = 0
    stop: int = 0
    file: Path | None = None
    first_row: int = 0  # a parquet row group's first row in its file

    @property
    def label(self) -> str:
        """The piece as a user finds it: ``file``, ``file.jsonl@start-stop`` or ``file.parquet#group``."""
        if self.kind == "jsonl":
            return f"{self.name}@{self.start}-{self.stop}"
        if self.kind == "parquet":
            return f"{self.name}#group{self.start}"
        return self.name


def pieces_settings() -> dict:
    """What places the pieces: recorded in the store, so that a change is refused on resume."""
    return {"jsonl_bytes": JSONL_PIECE_BYTES, "dataset_rows": DATASET_PIECE_ROWS}


def share_fingerprints(
    spec: CorpusSpec, writers: int, mine: list[int], jsonl_piece_bytes: int = JSONL_PIECE_BYTES
) -> dict[int, dict[str, str]]:
    """For each writer in ``mine``, a SHA-256 of the bytes of every file piece dealt to it, by piece
    label: the bytes a resume must find unchanged. Only those pieces are read. A dataset source
    (saved or downloaded) has no file pieces: its identity is its name and settings in the manifest."""
    prints: dict[int, dict[str, str]] = {w: {} for w in mine}
    path = Path(spec.source)
    if not path.exists() or is_saved_dataset(path):
        return prints
    source = _Source(spec, jsonl_piece_bytes)
    for p, piece in enumerate(source.pieces()):
        if p % writers in prints and piece.file is not None:
            prints[p % writers][piece.label] = _piece_digest(source, piece)
    return prints


def _piece_digest(source: _Source, piece: Piece) -> str:
    if piece.kind == "parquet":
        ranges = _row_group_byte_ranges(source.parquet_files[piece.file], piece.start)
    elif piece.kind == "jsonl":
        ranges = [(piece.start, piece.stop)]
    else:
        ranges = [(0, piece.file.stat().st_size)]
    digest = hashlib.sha256()
    try:
        with piece.file.open("rb") as f:
            for start, stop in ranges:
                f.seek(start)
                while start < stop and (block := f.read(min(READ_BLOCK, stop - start))):
                    digest.update(block)
                    start += len(block)
    except OSError as exc:
        raise UserError(f"cannot read the corpus file {piece.file}: {exc.strerror or exc}") from None
    return digest.hexdigest()


def _row_group_byte_ranges(table, group: int) -> list[tuple[int, int]]:
    """Where a parquet row group's column chunks lie in its file."""
    ranges = []
    row_group = table.metadata.row_group(group)
    for c in range(row_group.num_columns):
        chunk = row_group.column(c)
        start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
        ranges.append((start, start + chunk.total_compressed_size))
    return ranges


def writer_documents(
    spec: CorpusSpec,
    writers: int,
    mine: list[int],
    counts: CorpusCounts | None = None,
    jsonl_piece_bytes: int = JSONL_PIECE_BYTES,
) -> Iterator[tuple[str, bytes, int]]:
    """The selected documents of writers ``mine`` (of ``writers``), in corpus order:
    ``(key, data, writer)``. Only their pieces are read, unless a document or byte limit is set."""
    counts = counts if counts is not None else CorpusCounts()
    source = _Source(spec, jsonl_piece_bytes)
    dealt = [(piece, p % writers) for p, piece in enumerate(source.pieces())]
    if spec.max_docs is None and spec.max_bytes is None:
        for piece, writer in dealt:
            if writer in mine:
                tagged = ((key, data, writer) for key, data in source.documents(piece))
                yield from select_documents(spec, counts, tagged)
        return
    everything = ((key, data, writer) for piece, writer in dealt for key, data in source.documents(piece))
    yield from (item for item in select_documents(spec, counts, everything) if item[2] in mine)


class _Source:
    """The corpus's pieces and the documents of each (a dataset is loaded once)."""

    def __init__(self, spec: CorpusSpec, jsonl_piece_bytes: int):
        check_source(spec)
        self.spec, self.jsonl_piece_bytes = spec, jsonl_piece_bytes
        self.path = Path(spec.source)
        self.dataset: Any = None
        self.parquet_files: dict[Path, Any] = {}  # opened once: the footer is read once

    def pieces(self) -> list[Piece]:
        if not self.path.exists() or is_saved_dataset(self.path):
            return self._dataset_pieces()
        return [piece for file in corpus_files(self.path) for piece in self._file_pieces(file)]

    def _file_pieces(self, file: Path) -> list[Piece]:
        suffix, name = file_suffix(file), file_key(file, self.path)
        if suffix == ".jsonl":
            size, step = file.stat().st_size, self.jsonl_piece_bytes
            return [Piece("jsonl", name, a, min(a + step, size), file) for a in range(0, size, step)]
        if suffix == ".parquet":
            self.parquet_files[file] = _parquet(file)
            groups = self.parquet_files[file].metadata
            first = [0]
            for g in range(groups.num_row_groups):
                first.append(first[-1] + groups.row_group(g).num_rows)
            return [Piece("parquet", name, g, g + 1, file, first[g]) for g in range(groups.num_row_groups)]
        return [Piece("jsonl.zst" if suffix == ".jsonl.zst" else "text", name, file=file)]

    def _dataset_pieces(self) -> list[Piece]:
        self.dataset = load_dataset(self.spec, from_disk=self.path.exists())
        name = self.path.name if self.path.exists() else self.spec.source  # a key never holds a local path
        return dataset_pieces(self.dataset, name)

    def documents(self, piece: Piece) -> Iterator[tuple[str, bytes]]:
        spec = self.spec
        if piece.kind == "text":
            return text_documents(piece.file, piece.name, spec.separator)
        if piece.kind == "jsonl.zst":
            return jsonl_documents(piece.file, piece.name, spec.text_field)
        if piece.kind == "jsonl":
            return _jsonl_range(piece, spec.text_field)
        if piece.kind == "parquet":
            return _parquet_row_group(self.parquet_files[piece.file], piece, spec.text_field)
        return dataset_documents(self.dataset, piece, spec)


def dataset_pieces(dataset, name: str) -> list[Piece]:
    """A streamed dataset's shards, or a dataset's rows ``DATASET_PIECE_ROWS`` at a time."""
    import datasets

    if isinstance(dataset, datasets.IterableDataset):
        return [Piece("streamed", name, s, s + 1) for s in range(dataset.num_shards)]
    rows, step = len(dataset), DATASET_PIECE_ROWS
    return [Piece("dataset", name, a, min(a + step, rows)) for a in range(0, rows, step)]


def dataset_documents(dataset, piece: Piece, spec: CorpusSpec) -> Iterator[tuple[str, bytes]]:
    """The records of one of :func:`dataset_pieces`' pieces (of this ``dataset``)."""
    if piece.kind == "dataset":
        numbered = enumerate(dataset.select(range(piece.start, piece.stop)), start=piece.start)
        at = "{}"
    else:
        numbered = enumerate(dataset.shard(num_shards=dataset.num_shards, index=piece.start))
        at = f"{piece.start}:{{}}"
    for i, record in numbered:
        row = at.format(i)
        where = f"{spec.source}[{spec.split}][{row}]"
        yield f"{piece.name}[{spec.split}][{row}]", record_text(record, spec.text_field, where)


def _jsonl_range(piece: Piece, text_field: str) -> Iterator[tuple[str, bytes]]:
    """The lines that start in bytes ``start .. stop`` of the file (a line that began in the
    piece before belongs to it; one that runs past ``stop`` is read to its end)."""
    with piece.file.open("rb") as f:
        at = piece.start
        if at:
            f.seek(at - 1)
            if f.read(1) != b"\n":
                at += len(f.readline())
        line_number = 1 if piece.start == 0 else None  # line numbers are known in a file's first piece
        while at < piece.stop:
            line = f.readline()
            if not line:
                return
            if line.strip():
                where = f"{piece.file}:{line_number}" if line_number else f"{piece.file} (byte {at})"
                yield f"{piece.name}@{at}", jsonl_text(line, text_field, where)
            at += len(line)
            line_number = line_number + 1 if line_number else None


def _parquet(path: Path):
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise UserError(f"{path}: not a readable parquet file ({str(exc).splitlines()[0]})") from None


def _parquet_row_group(table, piece: Piece, text_field: str) -> Iterator[tuple[str, bytes]]:
    """Row group ``start`` of the file (rows keep their file-wide numbers)."""
    if text_field not in table.schema_arrow.names:
        raise UserError(
            f"{piece.file}: no column {text_field!r} (columns: {', '.join(table.schema_arrow.names)}); use --text-field"
        )
    values = table.read_row_group(piece.start, columns=[text_field]).column(0).to_pylist()
    for row, value in enumerate(values, start=piece.first_row):
        yield f"{piece.name}#{row}", record_text({text_field: value}, text_field, f"{piece.file}#{row}")
