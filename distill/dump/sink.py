"""The conversion sink: converted values fill in, and complete documents are written in corpus order.

One background thread (a one-worker executor) owns the documents not yet written, their values
and what was written; the teacher pass hands it immutable messages and nothing else:
:class:`DocumentsPlanned` (a group's documents, in corpus order, before any of their rows),
:class:`LogitRows` (a head chunk's logits, which the thread converts with Numba: it releases the
GIL, so the teacher computes on meanwhile) or :class:`ConvertedRows` (a head chunk the device path
already converted). At most ``MAX_IN_FLIGHT`` messages that carry rows are with the thread, which
bounds the logits waiting (:mod:`distill.dump.memory`). A failure in the thread is raised in the sender
at its next hand-over, or when the sink closes; closing hands back the :class:`WrittenCounts`.
A complete document goes to its store writer, which encodes it on its own threads
(``--encode-threads``); the thread adds it to the counts once it is encoded, in corpus order.
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from common.errors import UserError
from distill.conversion.converter import Converter, DocumentDistributions
from distill.conversion.rows import ColumnOrder
from distill.dump import memory as dump_memory
from distill.dump.summary import WrittenCounts
from distill.teacher.reader import PlannedDocument, RowSpan
from logit_store.writer import PendingDocument

# messages carrying rows held by the sink's thread: the one it converts. The teacher computes the
# next chunk meanwhile and hands it over when the thread is free, so the thread never waits for a
# chunk that is ready and at most two chunks of logits exist (a deeper queue holds a third and
# converts no sooner: at the defaults over the Llama-3 vocabulary, 1 MB of text peaked at 2.54 GB
# with it and 2.14 GB without, benchmarks/dump_memory.py --scale 1)
MAX_IN_FLIGHT = 1
TRIM_EVERY_POSITIONS = 1 << 15  # about 6,000 tokens of text: a fraction of a store chunk


@dataclass(frozen=True)
class DocumentsPlanned:
    """A group's documents, in corpus order: they are written in this order once complete."""

    documents: tuple[PlannedDocument, ...]


@dataclass(frozen=True)
class LogitRows:
    """A head chunk's float32 logits, for the sink to convert into the spans' documents."""

    logits: np.ndarray  # (rows, V)
    columns: ColumnOrder
    spans: tuple[RowSpan, ...]


@dataclass(frozen=True)
class ConvertedSpan:
    """The converted values of a document's teacher rows ``first_row .. first_row + len(dropped)``."""

    document: PlannedDocument
    first_row: int
    values: np.ndarray  # the support values of these rows' positions, in position order
    dropped: np.ndarray  # these rows' dropped special mass


@dataclass(frozen=True)
class ConvertedRows:
    """A head chunk converted on the device."""

    spans: tuple[ConvertedSpan, ...]


Message = DocumentsPlanned | LogitRows | ConvertedRows


@contextmanager
def store_errors(store):
    """A failing disk (full, read-only, over quota) is one line, not a traceback."""
    try:
        yield
    except OSError as exc:
        raise UserError(f"writing the store {store.directory} failed: {exc}") from None


class ConversionSink:
    """The sender's side: queues messages for the thread, bounded, and surfaces its failures."""

    def __init__(self, stores: dict, converter: Converter, bar):
        self._receiver = _Receiver(stores, converter, bar)  # touched only on the thread
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dump-writer")
        self._in_flight: deque[tuple[Future, bool]] = deque()  # (task, whether its message carries rows)

    def send(self, message: Message) -> None:
        """Queue ``message``; wait while ``MAX_IN_FLIGHT`` messages carrying rows are with the thread;
        raise the thread's failure, if any."""
        carries_rows = not isinstance(message, DocumentsPlanned)
        while self._in_flight and (
            self._in_flight[0][0].done() or (carries_rows and self._rows_in_flight() >= MAX_IN_FLIGHT)
        ):
            self._in_flight.popleft()[0].result()
        self._in_flight.append((self._executor.submit(self._receiver.receive, message), carries_rows))

    def _rows_in_flight(self) -> int:
        return sum(carries_rows for _, carries_rows in self._in_flight)

    def close(self) -> WrittenCounts:
        """Wait for every message and return what was written; every planned document must have
        been completed."""
        while self._in_flight:
            self._in_flight.popleft()[0].result()
        written = self._executor.submit(self._receiver.finish).result()
        self._executor.shutdown()
        return written

    def abort(self) -> None:
        """Drop the queued messages and wait for the one being handled."""
        self._executor.shutdown(wait=True, cancel_futures=True)


@dataclass
class _Filling:
    """A planned document whose values fill in as its rows arrive."""

    document: PlannedDocument
    values: np.ndarray  # (S,) float64
    dropped: np.ndarray  # (m+1,) float64
    rows_left: int


class _Receiver:
    """The thread's state: the documents not yet written, in corpus order, and what was written."""

    def __init__(self, stores: dict, converter: Converter, bar):
        self._stores, self._converter, self._bar = stores, converter, bar
        self._pending: dict[tuple[int, int], _Filling] = {}  # by (writer, index), in corpus order
        self._written = WrittenCounts()
        self._encoding: deque[tuple[PendingDocument, dict]] = deque()  # written, counted once encoded
        self._positions_at_trim = 0

    def receive(self, message: Message) -> None:
        start = time.perf_counter()
        match message:
            case DocumentsPlanned():
                self._plan(message)
            case LogitRows():
                self._convert(message)
            case ConvertedRows():
                self._fill(message)
        self._write_complete()
        self._written = self._written.plus_seconds(time.perf_counter() - start)

    def finish(self) -> WrittenCounts:
        if self._pending:
            raise RuntimeError(f"{len(self._pending)} documents were never completed")
        self._count_encoded(wait=True)
        return self._written

    def _plan(self, message: DocumentsPlanned) -> None:
        for doc in message.documents:
            values = np.empty(doc.layout.num_values, dtype=np.float64)
            dropped = np.empty(doc.rows, dtype=np.float64)
            self._pending[doc.writer_id, doc.index] = _Filling(doc, values, dropped, doc.rows)

    def _convert(self, message: LogitRows) -> None:
        for span in message.spans:
            doc, filling = span.document, self._pending[span.document.writer_id, span.document.index]
            logits = message.logits[span.start : span.stop]
            self._converter.convert_rows_numba(
                doc.layout, doc.token_ids, logits, span.first_row, filling.values, filling.dropped, message.columns
            )
            filling.rows_left -= span.stop - span.start

    def _fill(self, message: ConvertedRows) -> None:
        for span in message.spans:
            doc, filling = span.document, self._pending[span.document.writer_id, span.document.index]
            rows = len(span.dropped)
            filling.values[doc.positions_of(span.first_row, rows)] = span.values
            filling.dropped[span.first_row : span.first_row + rows] = span.dropped
            filling.rows_left -= rows

    def _write_complete(self) -> None:
        while self._pending:
            first = next(iter(self._pending))
            if self._pending[first].rows_left:
                return
            self._write(self._pending.pop(first))
            self._trim_after_writing()

    def _trim_after_writing(self) -> None:
        """Once documents of ``TRIM_EVERY_POSITIONS`` positions were written, the pages they freed
        are handed back (:func:`distill.dump.memory.trim_freed_memory`: a walk of the heaps, so
        not after every small document)."""
        if self._written.positions - self._positions_at_trim >= TRIM_EVERY_POSITIONS:
            dump_memory.trim_freed_memory()
            self._positions_at_trim = self._written.positions

    def _write(self, filled: _Filling) -> None:
        doc = filled.document
        dist = DocumentDistributions(doc.layout, filled.values, filled.dropped)
        store = self._stores[doc.writer_id]
        with store_errors(store):
            pending = store.submit_distributions(dist, key=doc.key, token_ids=doc.token_ids, roles=doc.roles)
        counts = {
            "text_bytes": doc.text_bytes,
            "tokens": len(doc.token_ids),
            "positions": dist.layout.num_positions,
            "exact_nll": -dist.log_likelihood(),
            "dropped_mass": dist.dropped_mass,
        }
        self._encoding.append((pending, counts))
        self._count_encoded(wait=False)

    def _count_encoded(self, wait: bool) -> None:
        """Add the written documents whose encoding finished (all of them if ``wait``) to the counts,
        in the order they were written."""
        while self._encoding and (wait or self._encoding[0][0].done()):
            pending, counts = self._encoding.popleft()
            nll, kl = -pending.stored_log_likelihood(), pending.kl_bits()
            self._written = self._written.plus_document(nll=nll, kl_bits=kl, **counts)
        elapsed = max(self._bar.format_dict.get("elapsed", 0.0), 1e-9)
        self._bar.set_postfix(docs=self._written.documents, bytes_s=f"{self._written.text_bytes / elapsed:,.0f}")
