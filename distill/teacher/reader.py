"""The teacher reading documents as a store's teacher read them: one reader for the dump and for
on-policy scoring.

A :class:`TeacherReader` is a loaded teacher with its output layer in the conversion's column order,
the conversion, and the store's :class:`distill.teacher.windows.Reading` (its stream and windows).
It makes a document's plan (:meth:`TeacherReader.document`: its ids, windows and stream layout, a
conversation's roles too) and gives the exact rows of a group of documents
(:meth:`TeacherReader.rows`): their windows, longest first, in padded batches of at most
``batch_tokens`` tokens (:func:`window_batches`), each run through the trunk once, then the LM head
in chunks of ``head_rows`` rows (:func:`head_chunks`), so float32 logits exist for ``head_rows``
rows at a time whatever the batch, group or document size. The dump hands each chunk to its
conversion sink (:mod:`distill.dump.teacher_pass`); on-policy training converts it in place
(``students/training/on_policy_teacher.py``). On the device path both convert a chunk with
:meth:`TeacherReader.convert_on_device` right after the head.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from bytestream.stream import StreamLayout
from bytestream.stream_kind import StreamKind
from distill.conversion.converter import Converter
from distill.conversion.device import torch_conversion
from distill.teacher.chat import ChatDocument
from distill.teacher.model import Teacher, TeacherLogits
from distill.teacher.windows import Reading, Window


@dataclass(frozen=True, eq=False)
class PlannedDocument:
    """A document to run through the teacher: its ids, windows and stream layout."""

    index: int  # its number among its writer's documents
    key: str
    data: bytes
    token_ids: np.ndarray
    windows: tuple[Window, ...]
    writer_id: int
    layout: StreamLayout
    roles: np.ndarray | None = None  # a conversation's role per target (a chat store's)

    @property
    def text_bytes(self) -> int:
        """Its text bytes: the document's own, or a conversation's rendered text in its stream."""
        return len(self.data) if self.roles is None else self.layout.num_text_bytes()

    @property
    def rows(self) -> int:
        """Its teacher rows: one per token and one after the last."""
        return len(self.token_ids) + 1

    def positions_of(self, first_row: int, rows: int) -> slice:
        """Where rows ``first_row .. first_row + rows`` put their values among the document's."""
        p0, p1 = np.searchsorted(self.layout.position_row, [first_row, first_row + rows])
        return slice(int(self.layout.offsets[p0]), int(self.layout.offsets[p1]))


@dataclass(frozen=True)
class RowSpan:
    """Rows ``start..stop`` of a head chunk: the document's teacher rows from ``first_row`` on."""

    document: PlannedDocument
    first_row: int
    start: int
    stop: int


@dataclass(frozen=True)
class DocumentRows:
    """One head chunk: its float32 logits (their columns in the order they say) and the document
    rows they hold."""

    logits: TeacherLogits
    spans: tuple[RowSpan, ...]


Job = tuple[PlannedDocument, Window]


def window_batches(group: Iterable[PlannedDocument], prefix_length: int, batch_tokens: int) -> Iterator[list[Job]]:
    """The group's windows, longest first, in batches whose padded length is at most ``batch_tokens``."""
    jobs = [(doc, window) for doc in group for window in doc.windows]
    jobs.sort(key=lambda job: -job[1].input_length(prefix_length))
    batch: list[Job] = []
    for job in jobs:
        if batch and (len(batch) + 1) * batch[0][1].input_length(prefix_length) > batch_tokens:
            yield batch
            batch = []
        batch.append(job)
    if batch:
        yield batch


def head_chunks(teacher: Teacher, batch: list[Job], head_rows: int) -> Iterator[DocumentRows]:
    """Run one padded batch through the trunk, then the head in chunks of ``head_rows`` rows:
    each chunk's logits and the document rows they hold."""
    prefix = teacher.context_prefix
    width = max(window.input_length(len(prefix)) for _, window in batch)
    input_ids = np.zeros((len(batch), width), dtype=np.int64)
    mask = np.zeros((len(batch), width), dtype=np.int64)
    rows, spans, start = [], [], 0
    for b, (doc, w) in enumerate(batch):
        seq = np.concatenate([np.asarray(prefix, dtype=np.int64), doc.token_ids[w.token_start : w.token_stop]])
        input_ids[b, : len(seq)] = seq
        mask[b, : len(seq)] = 1
        rows.append(w.output_positions(len(prefix)))
        spans.append(RowSpan(doc, w.row_start, start, start + len(rows[-1])))
        start += len(rows[-1])
    device = teacher.device
    hidden = teacher.hidden_rows(torch.from_numpy(input_ids).to(device), torch.from_numpy(mask).to(device), rows)
    for c0 in range(0, start, head_rows):
        c1 = min(start, c0 + head_rows)
        yield DocumentRows(teacher.head_logits(hidden[c0:c1]), spans_within(spans, c0, c1))


def spans_within(spans: list[RowSpan], c0: int, c1: int) -> tuple[RowSpan, ...]:
    """The parts of ``spans`` inside rows ``c0..c1``, relative to ``c0``."""
    out = []
    for span in spans:
        lo, hi = max(span.start, c0), min(span.stop, c1)
        if lo < hi:
            out.append(RowSpan(span.document, span.first_row + lo - span.start, lo - c0, hi - c0))
    return tuple(out)


class TeacherReader:
    """A loaded teacher that reads documents into a store's rows exactly as its dump did."""

    def __init__(self, teacher: Teacher, converter: Converter, reading: Reading):
        """``teacher``: its output layer already in ``converter``'s column order
        (:meth:`TeacherReader.of` orders it)."""
        self.teacher, self.converter, self.reading = teacher, converter, reading

    @classmethod
    def of(cls, teacher: Teacher, reading: Reading) -> TeacherReader:
        """``teacher`` with the conversion of its vocabulary and its output layer ordered for it."""
        converter = Converter(teacher.vocab)
        return cls(teacher.with_sorted_head(converter.sorted_columns), converter, reading)

    @property
    def stream(self) -> StreamKind:
        return self.reading.stream

    @property
    def prefix_length(self) -> int:
        return len(self.teacher.context_prefix)

    def layout(self, token_ids: np.ndarray) -> StreamLayout:
        """The stream layout of a document of these teacher ids."""
        return self.stream.layout(self.converter.trie, token_ids)

    def document(
        self,
        encoded: np.ndarray | ChatDocument,
        *,
        index: int = 0,
        key: str = "",
        data: bytes = b"",
        writer_id: int = 0,
    ) -> PlannedDocument:
        """The plan of a document (its teacher ids) or of a conversation (a :class:`ChatDocument`:
        its roles per target too)."""
        chat = isinstance(encoded, ChatDocument)
        ids = encoded.token_ids if chat else encoded
        layout = self.layout(ids)
        roles = encoded.target_roles(layout.symbols, self.stream) if chat else None
        windows = tuple(self.reading.windows(len(ids), self.prefix_length))
        return PlannedDocument(index, key, data, ids, windows, writer_id, layout, roles)

    def batches(self, documents: Iterable[PlannedDocument], batch_tokens: int) -> Iterator[list[Job]]:
        """The documents' windows in padded batches of at most ``batch_tokens`` tokens, longest first."""
        return window_batches(documents, self.prefix_length, batch_tokens)

    def rows(self, batch: list[Job], head_rows: int) -> Iterator[DocumentRows]:
        """A batch through the trunk, then its head chunks of ``head_rows`` rows."""
        return head_chunks(self.teacher, batch, head_rows)

    def prepare_device_conversion(self) -> None:
        """Build the device path's tables now (not in the first chunk's time)."""
        torch_conversion(self.converter, self.teacher.device, self.teacher.columns, self.stream is StreamKind.FUSED)

    def convert_on_device(self, chunk: DocumentRows) -> list[tuple]:
        """A chunk converted on the teacher's device: each span with its positions' support values
        (in position order) and its rows' dropped special mass."""
        conversion = torch_conversion(
            self.converter, self.teacher.device, chunk.logits.columns, self.stream is StreamKind.FUSED
        )
        tensor = chunk.logits.tensor
        return [
            (span, *conversion.convert_rows(span.document.layout, tensor[span.start : span.stop], span.first_row))
            for span in chunk.spans
        ]
