"""The teacher pass: a group's windows through the teacher, and every head chunk to the sink.

The teacher reads the group as the store's teacher reads (:class:`distill.teacher.reader.TeacherReader`:
its windows longest first in padded batches of at most ``batch_tokens`` tokens, each through the
trunk once, then the LM head in chunks of ``head_rows`` rows). Each chunk is handed to the
conversion sink: as logits for its Numba conversion, or, on the device path, converted on the
device right after the head (:class:`TeacherPass`). The logits say their column order, and the
conversion reads that order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from distill.dump.sink import ConversionSink, ConvertedRows, ConvertedSpan, LogitRows
from distill.teacher.reader import DocumentRows, PlannedDocument, TeacherReader


@dataclass(frozen=True)
class PassTimes:
    forward_seconds: float  # the teacher's trunk and head (and waiting for the sink), per group
    device_convert_seconds: float  # the device path's conversion, between head chunks


class TeacherPass:
    """Runs groups through the teacher and hands every head chunk to the sink (on the main thread);
    owns the pass's times."""

    def __init__(
        self,
        reader: TeacherReader,
        sink: ConversionSink,
        *,
        batch_tokens: int,
        head_rows: int,
        on_device: bool,
        bar,
    ):
        """``reader``: the teacher, its conversion and the store's reading (the device path converts
        into its stream, the one the documents' layouts are of)."""
        self._reader, self._sink, self._bar = reader, sink, bar
        self._batch_tokens, self._head_rows, self._on_device = batch_tokens, head_rows, on_device
        if on_device:  # the device tables are built now, not in the first chunk's time
            reader.prepare_device_conversion()
        self._forward_seconds = self._device_convert_seconds = 0.0

    def run(self, group: tuple[PlannedDocument, ...]) -> None:
        """Forward every window of the group, and hand over its rows."""
        start, converting = time.perf_counter(), self._device_convert_seconds
        for batch in self._reader.batches(group, self._batch_tokens):
            rows = 0
            for chunk in self._reader.rows(batch, self._head_rows):
                self._hand_over(chunk)
                rows += len(chunk.logits.tensor)
            self._bar.update(rows)
        self._forward_seconds += time.perf_counter() - start - (self._device_convert_seconds - converting)

    def times(self) -> PassTimes:
        return PassTimes(self._forward_seconds, self._device_convert_seconds)

    def _hand_over(self, chunk: DocumentRows) -> None:
        logits = chunk.logits
        if not self._on_device:
            self._sink.send(
                LogitRows(logits.tensor.cpu().numpy(), logits.columns, chunk.spans)
            )  # rows on a GPU come to the host
            return
        if logits.tensor.is_cuda:  # the forward's kernels are asynchronous: time the conversion alone
            torch.cuda.synchronize(logits.tensor.device)
        start = time.perf_counter()
        converted = tuple(
            ConvertedSpan(span.document, span.first_row, values, dropped)
            for span, values, dropped in self._reader.convert_on_device(chunk)
        )
        self._device_convert_seconds += time.perf_counter() - start
        self._sink.send(ConvertedRows(converted))
