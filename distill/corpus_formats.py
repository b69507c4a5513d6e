"""One reader per corpus format: a format lists the pieces of a file and reads the documents of a piece.

A *piece* is the unit of reading that is dealt to a store writer (:mod:`distill.corpus_shares`);
reading a whole corpus is reading all its pieces in order (:func:`distill.corpus.raw_documents`),
so each document is read by one reader and has one key, whoever reads it. A file's pieces depend on
the file alone:

==================  ========================================  ==========================================
format              piece                                     a document's key
==================  ========================================  ==========================================
``.txt .text .md``  the file                                  ``file``, or ``file#part`` with a separator
``.jsonl``          ``JSONL_PIECE_BYTES`` of the file (the    ``file@<byte offset of the line>``
                    lines that start in them)
``.jsonl.zst``      the file (compressed: no seeking)         ``file:<line number>``
``.parquet``        a row group                               ``file#<row in the file>``
a dataset           ``DATASET_PIECE_ROWS`` rows, or one       ``name[split][<row>]``, or
                    shard (data file) of a streamed one       ``name[split][<shard>:<row in the shard>]``
==================  ========================================  ==========================================

``file`` is the file's path relative to the corpus folder (or the file's name), so keys do not
depend on where the corpus lies, how its path was spelled or how it was split. Errors name a
record where a user finds it: ``path:line`` (``path (byte N)`` for a ``.jsonl`` line after pieces
that were not read), ``path#row``, ``source[split][row]``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bytestream.errors import UserError
from distill.corpus_files import TEXT_SUFFIXES, zstd_lines

if TYPE_CHECKING:
    from distill.corpus import CorpusSpec

JSONL_PIECE_BYTES = 32 << 20
DATASET_PIECE_ROWS = 10_000


@dataclass(frozen=True)
class Piece:
    """One unit of reading, listed by its ``reader``'s ``pieces`` and read by its ``documents``:
    ``start``/``stop`` say where, in the reader's terms (bytes, a row group, rows or a shard)."""

    reader: CorpusFormat = field(compare=False, repr=False)
    name: str  # the file's key (or the dataset's name)
    label: str  # the piece as a user finds it: ``file``, ``file.jsonl@start-stop``, ``file.parquet#group3``
    start: int = 0
    stop: int = 0
    file: Path | None = None  # None: a dataset's rows
    first_row: int = 0  # a parquet row group's first row in its file

    def documents(self) -> Iterator[tuple[str, bytes]]:
        """The piece's documents, ``(key, bytes)`` in order."""
        try:
            yield from self.reader.documents(self)
        except OSError as exc:
            if self.file is None:
                raise
            raise UserError(f"cannot read the corpus file {self.file}: {exc.strerror or exc}") from None

    def byte_ranges(self) -> list[tuple[int, int]]:
        """Where the piece's bytes lie in its file (none for a dataset's rows)."""
        return self.reader.byte_ranges(self) if self.file is not None else []


class CorpusFormat(Protocol):
    def pieces(self, file: Path, name: str) -> list[Piece]:
        """The pieces of ``file``, whose key is ``name``, in order."""

    def documents(self, piece: Piece) -> Iterator[tuple[str, bytes]]:
        """The documents of one of this format's pieces."""

    def byte_ranges(self, piece: Piece) -> list[tuple[int, int]]:
        """Where the bytes of one of this format's pieces lie in its file."""


def file_formats(spec: CorpusSpec, jsonl_piece_bytes: int = JSONL_PIECE_BYTES) -> dict[str, CorpusFormat]:
    """The reader of each file suffix, with the spec's settings (a corpus reading's own: the
    readers keep what they learn of their files)."""
    text = TextFile(spec.separator)
    return dict.fromkeys(TEXT_SUFFIXES, text) | {
        ".jsonl": JsonLines(spec.text_field, jsonl_piece_bytes),
        ".jsonl.zst": CompressedJsonLines(spec.text_field),
        ".parquet": Parquet(spec.text_field),
    }


class WholeFile:
    """A format whose one piece is the whole file."""

    def pieces(self, file: Path, name: str) -> list[Piece]:
        return [Piece(self, name, name, file=file)]

    def byte_ranges(self, piece: Piece) -> list[tuple[int, int]]:
        return [(0, piece.file.stat().st_size)]


class TextFile(WholeFile):
    """A text file: one document, or the parts between ``separator`` (an exact string). Read as
    bytes, so binary or invalid-UTF-8 input is distilled as bytes."""

    def __init__(self, separator: str | None):
        self.separator = separator

    def documents(self, piece: Piece) -> Iterator[tuple[str, bytes]]:
        data = piece.file.read_bytes()
        if self.separator is None:
            yield piece.name, data
            return
        for i, part in enumerate(data.split(self.separator.encode("utf-8"))):
            yield f"{piece.name}#{i}", part


class CompressedJsonLines(WholeFile):
    """A ``.jsonl.zst`` file: one document per non-blank line, read from the start."""

    def __init__(self, text_field: str):
        self.text_field = text_field

    def documents(self, piece: Piece) -> Iterator[tuple[str, bytes]]:
        for number, line in enumerate(zstd_lines(piece.file), start=1):
            if line.strip():
                yield f"{piece.name}:{number}", jsonl_text(line, self.text_field, f"{piece.file}:{number}")


class JsonLines:
    """A ``.jsonl`` file: one document per non-blank line, in pieces of ``piece_bytes``."""

    def __init__(self, text_field: str, piece_bytes: int = JSONL_PIECE_BYTES):
        self.text_field, self.piece_bytes = text_field, piece_bytes
        self._line_at: dict[tuple[Path, int], int] = {}  # (file, a piece's stop) -> number of the line there

    def pieces(self, file: Path, name: str) -> list[Piece]:
        size, step = file.stat().st_size, self.piece_bytes
        stops = [min(a + step, size) for a in range(0, size, step)]
        return [Piece(self, name, f"{name}@{a}-{b}", a, b, file) for a, b in zip(range(0, size, step), stops)]

    def byte_ranges(self, piece: Piece) -> list[tuple[int, int]]:
        return [(piece.start, piece.stop)]

    def documents(self, piece: Piece) -> Iterator[tuple[str, bytes]]:
        """The lines that start in bytes ``start .. stop`` of the file (a line that began in the
        piece before belongs to it; one that runs past ``stop`` is read to its end). Line numbers
        are known in a file's first piece and after a piece this reader read to its end."""
        with piece.file.open("rb") as f:
            at = piece.start
            if at:
                f.seek(at - 1)
                if f.read(1) != b"\n":
                    at += len(f.readline())
            line_number = 1 if piece.start == 0 else self._line_at.get((piece.file, piece.start))
            while at < piece.stop:
                line = f.readline()
                if not line:
                    return
                if line.strip():
                    where = f"{piece.file}:{line_number}" if line_number else f"{piece.file} (byte {at})"
                    yield f"{piece.name}@{at}", jsonl_text(line, self.text_field, where)
                at += len(line)
                line_number = line_number + 1 if line_number else None
            if line_number:
                self._line_at[(piece.file, piece.stop)] = line_number


class Parquet:
    """A ``.parquet`` file: one document per row of the text column, a row group per piece."""

    def __init__(self, text_field: str):
        self.text_field = text_field
        self._tables: dict[Path, Any] = {}  # opened once: the footer is read once

    def pieces(self, file: Path, name: str) -> list[Piece]:
        self._tables[file] = table = _open_parquet(file)
        first = [0]
        for g in range(table.metadata.num_row_groups):
            first.append(first[-1] + table.metadata.row_group(g).num_rows)
        return [Piece(self, name, f"{name}#group{g}", g, g + 1, file, first[g]) for g in range(len(first) - 1)]

    def documents(self, piece: Piece) -> Iterator[tuple[str, bytes]]:
        """Row group ``start`` of the file (rows keep their file-wide numbers)."""
        table, text_field = self._tables[piece.file], self.text_field
        if text_field not in table.schema_arrow.names:
            raise UserError(
                f"{piece.file}: no column {text_field!r} (columns: {', '.join(table.schema_arrow.names)}); "
                "use --text-field"
            )
        values = table.read_row_group(piece.start, columns=[text_field]).column(0).to_pylist()
        for row, value in enumerate(values, start=piece.first_row):
            yield f"{piece.name}#{row}", record_text({text_field: value}, text_field, f"{piece.file}#{row}")

    def byte_ranges(self, piece: Piece) -> list[tuple[int, int]]:
        """Where the row group's column chunks lie in its file."""
        ranges = []
        row_group = self._tables[piece.file].metadata.row_group(piece.start)
        for c in range(row_group.num_columns):
            chunk = row_group.column(c)
            start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
            ranges.append((start, start + chunk.total_compressed_size))
        return ranges


def _open_parquet(path: Path):
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise UserError(f"{path}: not a readable parquet file ({str(exc).splitlines()[0]})") from None


class DatasetRows:
    """A Hugging Face dataset (loaded, saved or streamed), named ``name`` in keys: its rows
    ``DATASET_PIECE_ROWS`` at a time, or a streamed dataset's shards."""

    def __init__(self, dataset, name: str, spec: CorpusSpec):
        import datasets

        self.dataset, self.name, self.spec = dataset, name, spec
        self.streamed = isinstance(dataset, datasets.IterableDataset)

    def pieces(self) -> list[Piece]:
        if self.streamed:
            return [Piece(self, self.name, self.name, s, s + 1) for s in range(self.dataset.num_shards)]
        rows, step = len(self.dataset), DATASET_PIECE_ROWS
        return [Piece(self, self.name, self.name, a, min(a + step, rows)) for a in range(0, rows, step)]

    def documents(self, piece: Piece) -> Iterator[tuple[str, bytes]]:
        dataset, spec = self.dataset, self.spec
        if self.streamed:
            numbered = enumerate(dataset.shard(num_shards=dataset.num_shards, index=piece.start))
            at = f"{piece.start}:{{}}"
        else:
            numbered = enumerate(dataset.select(range(piece.start, piece.stop)), start=piece.start)
            at = "{}"
        for i, record in numbered:
            row = at.format(i)
            where = f"{spec.source}[{spec.split}][{row}]"
            yield f"{piece.name}[{spec.split}][{row}]", record_text(record, spec.text_field, where)

    def byte_ranges(self, piece: Piece) -> list[tuple[int, int]]:
        return []


def record_text(record: dict, text_field: str, where: str) -> bytes:
    """The text of one record: its ``text_field``, as bytes (None is an empty document)."""
    if text_field not in record:
        raise UserError(
            f"{where}: no field {text_field!r} (fields: {', '.join(sorted(record)) or 'none'}); use --text-field"
        )
    value = record[text_field]
    if value is None:
        return b""
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise UserError(f"{where}: field {text_field!r} holds {type(value).__name__}, not text")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate such as "\ud800": valid JSON, not text
        raise UserError(
            f"{where}: field {text_field!r} holds a lone surrogate ({value[exc.start]!r} at character {exc.start}), "
            "which is not text"
        ) from None


def jsonl_text(line: bytes, text_field: str, where: str) -> bytes:
    """The text of one (non-blank) JSON line."""
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{where}: not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc})") from None
    except RecursionError:
        raise UserError(f"{where}: JSON nested too deeply to read") from None
    if not isinstance(record, dict):
        raise UserError(f"{where}: a JSON line must be an object with a {text_field!r} field")
    return record_text(record, text_field, where)
