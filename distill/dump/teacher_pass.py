"""The teacher pass: a group's windows through the teacher, and every head chunk to the sink.

The windows of a group run longest first, in padded batches of at most ``batch_tokens`` tokens
(:func:`window_batches`); each batch runs through the trunk once, then the LM head in chunks of
``head_rows`` rows (:func:`head_chunks`), so float32 logits exist for ``head_rows`` rows at a time
whatever the batch, group or document size. Each chunk is handed to the conversion sink: as logits
for its Numba conversion, or, on the device path, converted on the device right after the head
(:class:`TeacherPass`). The logits say their column order, and the conversion reads that order.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from bytestream.stream_kind import StreamKind
from distill.conversion.converter import Converter
from distill.conversion.device import torch_conversion
from distill.dump.plan import PlannedDocument
from distill.dump.sink import ConversionSink, ConvertedRows, ConvertedSpan, LogitRows, RowSpan
from distill.teacher.model import Teacher, TeacherLogits
from distill.teacher.windows import Window

Job = tuple[PlannedDocument, Window]


@dataclass(frozen=True)
class PassTimes:
    forward_seconds: float  # the teacher's trunk and head (and waiting for the sink), per group
    device_convert_seconds: float  # the device path's conversion, between head chunks


def window_batches(group: tuple[PlannedDocument, ...], prefix_length: int, batch_tokens: int) -> Iterator[list[Job]]:
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


def head_chunks(
    teacher: Teacher, batch: list[Job], head_rows: int
) -> Iterator[tuple[TeacherLogits, tuple[RowSpan, ...]]]:
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
        yield teacher.head_logits(hidden[c0:c1]), spans_within(spans, c0, c1)


def spans_within(spans: list[RowSpan], c0: int, c1: int) -> tuple[RowSpan, ...]:
    """The parts of ``spans`` inside rows ``c0..c1``, relative to ``c0``."""
    out = []
    for span in spans:
        lo, hi = max(span.start, c0), min(span.stop, c1)
        if lo < hi:
            out.append(RowSpan(span.document, span.first_row + lo - span.start, lo - c0, hi - c0))
    return tuple(out)


class TeacherPass:
    """Runs groups through the teacher and hands every head chunk to the sink (on the main thread);
    owns the pass's times."""

    def __init__(
        self,
        teacher: Teacher,
        converter: Converter,
        sink: ConversionSink,
        *,
        batch_tokens: int,
        head_rows: int,
        on_device: bool,
        bar,
        stream: StreamKind = StreamKind.EOT,
    ):
        """``stream``: the one the documents' layouts are of (the device path converts into it)."""
        self._teacher, self._converter, self._sink, self._bar = teacher, converter, sink, bar
        self._batch_tokens, self._head_rows, self._on_device = batch_tokens, head_rows, on_device
        self._fused = stream is StreamKind.FUSED
        if on_device:  # the device tables are built now, not in the first chunk's time
            torch_conversion(converter, teacher.device, teacher.columns, self._fused)
        self._forward_seconds = self._device_convert_seconds = 0.0

    def run(self, group: tuple[PlannedDocument, ...]) -> None:
        """Forward every window of the group, and hand over its rows."""
        start, converting = time.perf_counter(), self._device_convert_seconds
        for batch in window_batches(group, len(self._teacher.context_prefix), self._batch_tokens):
            rows = 0
            for logits, spans in head_chunks(self._teacher, batch, self._head_rows):
                self._hand_over(logits, spans)
                rows += len(logits.tensor)
            self._bar.update(rows)
        self._forward_seconds += time.perf_counter() - start - (self._device_convert_seconds - converting)

    def times(self) -> PassTimes:
        return PassTimes(self._forward_seconds, self._device_convert_seconds)

    def _hand_over(self, logits: TeacherLogits, spans: tuple[RowSpan, ...]) -> None:
        if not self._on_device:
            self._sink.send(
                LogitRows(logits.tensor.cpu().numpy(), logits.columns, spans)
            )  # rows on a GPU come to the host
            return
        if logits.tensor.is_cuda:  # the forward's kernels are asynchronous: time the conversion alone
            torch.cuda.synchronize(logits.tensor.device)
        start = time.perf_counter()
        conversion = torch_conversion(self._converter, self._teacher.device, logits.columns, self._fused)
        converted = tuple(
            ConvertedSpan(
                span.document,
                span.first_row,
                *conversion.convert_rows(span.document.layout, logits.tensor[span.start : span.stop], span.first_row),
            )
            for span in spans
        )
        self._device_convert_seconds += time.perf_counter() - start
        self._sink.send(ConvertedRows(converted))
