"""One reader per corpus format: a format lists the pieces of a file and reads the documents of a piece.

A *piece* is the unit of reading that is dealt to a store writer (:mod:`distill.corpus.shares`);
reading a whole corpus is reading all its pieces in order (:func:`distill.corpus.spec.raw_documents`),
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

A piece read with the fingerprint its writer recorded when the dump started (:class:`ReadCheck`)
hashes the bytes it reads as it reads them and refuses them if they differ: a file edited while a
dump runs is never stored under the fingerprint of what it held before. Text files and ``.jsonl``
pieces are hashed from the very bytes their documents come from, before the first document is
given out; a parquet row group is hashed before and right after it is read; a ``.jsonl.zst`` file (read
as a stream) is hashed as it is read, and checked at its end.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from common.errors import UserError
from distill.corpus.conversations import ConversationFields
from distill.corpus.files import TEXT_SUFFIXES, zstd_lines

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

    def documents(self, fingerprint: str | None = None) -> Iterator[tuple[str, bytes]]:
        """The piece's documents, ``(key, bytes)`` in order; with the piece's ``fingerprint`` (the
        SHA-256 of its bytes when the dump started), the bytes read are checked against it."""
        check = ReadCheck(self, fingerprint) if fingerprint is not None and self.file is not None else None
        try:
            yield from self.reader.documents(self, check)
        except OSError as exc:
            if self.file is None:
                raise
            raise UserError(f"cannot read the corpus file {self.file}: {exc.strerror or exc}") from None

    def byte_ranges(self) -> list[tuple[int, int]]:
        """Where the piece's bytes lie in its file (none for a dataset's rows)."""
        return self.reader.byte_ranges(self) if self.file is not None else []


class ReadCheck:
    """The SHA-256 of the bytes a piece's reader reads (its :meth:`Piece.byte_ranges`, in order),
    compared with the fingerprint the piece had when the dump started once all are read."""

    def __init__(self, piece: Piece, fingerprint: str):
        self.piece, self.fingerprint, self.digest = piece, fingerprint, hashlib.sha256()

    def update(self, data: bytes) -> None:
        self.digest.update(data)

    def done(self) -> None:
        if self.digest.hexdigest() != self.fingerprint:
            raise UserError(
                f"the corpus file {self.piece.file} changed while the dump ran ({self.piece.label} is not what "
                "it was when the dump started): restore it and rerun the dump to resume, or choose another --output"
            )


class CorpusFormat(Protocol):
    def pieces(self, file: Path, name: str) -> list[Piece]:
        """The pieces of ``file``, whose key is ``name``, in order."""

    def documents(self, piece: Piece, check: ReadCheck | None = None) -> Iterator[tuple[str, bytes]]:
        """The documents of one of this format's pieces (the bytes read go to ``check``)."""

    def byte_ranges(self, piece: Piece) -> list[tuple[int, int]]:
        """Where the bytes of one of this format's pieces lie in its file."""


def file_formats(
    separator: str | None, text_field: str, jsonl_piece_bytes: int = JSONL_PIECE_BYTES
) -> dict[str, CorpusFormat]:
    """The reader of each file suffix, with the corpus's settings (a corpus reading's own: the
    readers keep what they learn of their files)."""
    text = TextFile(separator)
    return dict.fromkeys(TEXT_SUFFIXES, text) | {
        ".jsonl": JsonLines(text_field, jsonl_piece_bytes),
        ".jsonl.zst": CompressedJsonLines(text_field),
        ".parquet": Parquet(text_field),
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

    def documents(self, piece: Piece, check: ReadCheck | None = None) -> Iterator[tuple[str, bytes]]:
        data = piece.file.read_bytes()
        if check is not None:
            check.update(data)
            check.done()
        if self.separator is None:
            yield piece.name, data
            return
        for i, part in enumerate(data.split(self.separator.encode("utf-8"))):
            yield f"{piece.name}#{i}", part


class CompressedJsonLines(WholeFile):
    """A ``.jsonl.zst`` file: one document per non-blank line, read from the start."""

    def __init__(self, text_field: str):
        self.text_field = text_field

    def documents(self, piece: Piece, check: ReadCheck | None = None) -> Iterator[tuple[str, bytes]]:
        read = check.update if check is not None else None
        for number, line in enumerate(zstd_lines(piece.file, read), start=1):
            if line.strip():
                yield f"{piece.name}:{number}", jsonl_text(line, self.text_field, f"{piece.file}:{number}")
        if check is not None:
            check.done()


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

    def documents(self, piece: Piece, check: ReadCheck | None = None) -> Iterator[tuple[str, bytes]]:
        """The lines that start in bytes ``start .. stop`` of the file (a line that began in the
        piece before belongs to it; one that runs past ``stop`` is read to its end). Line numbers
        are known in a file's first piece and after a piece this reader read to its end. The
        piece's bytes are read at once (at most ``piece_bytes``), so ``check`` sees what is parsed."""
        with piece.file.open("rb") as f:
            f.seek(piece.start)
            block = f.read(piece.stop - piece.start)
            if check is not None:
                check.update(block)
                check.done()
            at = piece.start
            if at:
                f.seek(at - 1)
                if f.read(1) != b"\n":
                    end = block.find(b"\n")
                    at = piece.stop if end < 0 else at + end + 1
            line_number = 1 if piece.start == 0 else self._line_at.get((piece.file, piece.start))
            while at < piece.stop:
                line = _line_at(f, block, piece, at)
                if not line:
                    return
                if line.strip():
                    where = f"{piece.file}:{line_number}" if line_number else f"{piece.file} (byte {at})"
                    yield f"{piece.name}@{at}", jsonl_text(line, self.text_field, where)
                at += len(line)
                line_number = line_number + 1 if line_number else None
            if line_number:
                self._line_at[(piece.file, piece.stop)] = line_number


def _line_at(f, block: bytes, piece: Piece, at: int) -> bytes:
    """The line starting at byte ``at`` of the piece: from ``block`` (its bytes), read on past the
    piece's end from ``f`` when it runs past it."""
    offset = at - piece.start
    end = block.find(b"\n", offset)
    if end >= 0:
        return block[offset : end + 1]
    f.seek(piece.start + len(block))
    return block[offset:] + f.readline()


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

    def documents(self, piece: Piece, check: ReadCheck | None = None) -> Iterator[tuple[str, bytes]]:
        """Row group ``start`` of the file (rows keep their file-wide numbers); with ``check``, its
        column chunks are hashed before and again after the group is read, before a row is given out."""
        return self._rows(piece) if check is None else self._checked_rows(piece, check)

    def _checked_rows(self, piece: Piece, check: ReadCheck) -> Iterator[tuple[str, bytes]]:
        """The group's rows, its column chunks checked before and after the group is read."""
        self._check(piece, check)
        rows = list(self._rows(piece))
        self._check(piece, ReadCheck(piece, check.fingerprint))
        yield from rows

    def _check(self, piece: Piece, check: ReadCheck) -> None:
        with piece.file.open("rb") as f:
            for start, stop in self.byte_ranges(piece):
                f.seek(start)
                check.update(f.read(stop - start))
        check.done()

    def _rows(self, piece: Piece) -> Iterator[tuple[str, bytes]]:
        table, text_field = self._tables[piece.file], self.text_field
        if isinstance(text_field, ConversationFields):  # a conversation's fields
            names = [c for c in text_field.columns() if c in table.schema_arrow.names]
            rows = table.read_row_group(piece.start, columns=names).to_pylist() if names else None
            for row in range(piece.first_row, piece.first_row + table.metadata.row_group(piece.start).num_rows):
                record = rows[row - piece.first_row] if rows is not None else {}
                yield f"{piece.name}#{row}", record_text(record, text_field, f"{piece.file}#{row}")
            return
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
    """The ``split`` of a Hugging Face dataset (loaded, saved or streamed) from ``source``, named
    ``name`` in keys: its rows ``DATASET_PIECE_ROWS`` at a time, or a streamed dataset's shards,
    each row's text in its ``text_field``."""

    def __init__(self, dataset, name: str, source: str, split: str, text_field: str):
        import datasets

        self.dataset, self.name = dataset, name
        self.source, self.split, self.text_field = source, split, text_field
        self.streamed = isinstance(dataset, datasets.IterableDataset)

    def pieces(self) -> list[Piece]:
        if self.streamed:
            return [Piece(self, self.name, self.name, s, s + 1) for s in range(self.dataset.num_shards)]
        rows, step = len(self.dataset), DATASET_PIECE_ROWS
        return [Piece(self, self.name, self.name, a, min(a + step, rows)) for a in range(0, rows, step)]

    def documents(self, piece: Piece, check: ReadCheck | None = None) -> Iterator[tuple[str, bytes]]:
        dataset = self.dataset
        if self.streamed:
            numbered = enumerate(dataset.shard(num_shards=dataset.num_shards, index=piece.start))
            at = f"{piece.start}:{{}}"
        else:
            numbered = enumerate(dataset.select(range(piece.start, piece.stop)), start=piece.start)
            at = "{}"
        for i, record in numbered:
            row = at.format(i)
            where = f"{self.source}[{self.split}][{row}]"
            yield f"{piece.name}[{self.split}][{row}]", record_text(record, self.text_field, where)

    def byte_ranges(self, piece: Piece) -> list[tuple[int, int]]:
        return []


def record_text(record: dict, text_field: str | ConversationFields, where: str) -> bytes:
    """The text of one record: its ``text_field``, as bytes (None is an empty document); for a
    corpus of conversations (``text_field`` their fields), the conversation's corpus form."""
    if isinstance(text_field, ConversationFields):
        return text_field.document(record, where)
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
