"""What a dump did: its counts, sums and times, and the lines it prints.

:class:`WrittenCounts` is what the conversion sink wrote (the sink's thread alone adds to it, and
hands it back when the sink closes); :class:`DumpSummary` is built once, at the end of the pass,
from it and from what the orchestrator found and measured.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from logit_store.file_names import SKIP_LIST
from logit_store.skips import Skip

SHOWN_SKIPS = 5  # skipped documents named in the summary (all are in the store's skip lists)


@dataclass(frozen=True)
class WrittenCounts:
    """The documents the sink wrote this run, and sums over them."""

    documents: int = 0
    text_bytes: int = 0
    tokens: int = 0
    positions: int = 0
    teacher_nll_nats: float = 0.0  # of the stored (decoded) values: what train and score read
    exact_teacher_nll_nats: float = 0.0  # of the exact values, before the encoding's quantisation
    kl_bits: float = 0.0  # KL(exact || stored) summed over the positions
    dropped_mass_sum: float = 0.0
    teacher_rows: int = 0
    convert_write_seconds: float = 0.0  # conversion + encoding + writing, overlapped with the forward on CPU

    def plus_document(
        self,
        *,
        text_bytes: int,
        tokens: int,
        positions: int,
        nll: float,
        exact_nll: float,
        kl_bits: float,
        dropped_mass,
    ) -> WrittenCounts:
        """These counts with one more document (``dropped_mass``: its rows' dropped special mass)."""
        return dataclasses.replace(
            self,
            documents=self.documents + 1,
            text_bytes=self.text_bytes + text_bytes,
            tokens=self.tokens + tokens,
            positions=self.positions + positions,
            teacher_nll_nats=self.teacher_nll_nats + nll,
            exact_teacher_nll_nats=self.exact_teacher_nll_nats + exact_nll,
            kl_bits=self.kl_bits + kl_bits,
            dropped_mass_sum=self.dropped_mass_sum + float(dropped_mass.sum()),
            teacher_rows=self.teacher_rows + len(dropped_mass),
        )

    def plus_seconds(self, seconds: float) -> WrittenCounts:
        return dataclasses.replace(self, convert_write_seconds=self.convert_write_seconds + seconds)


@dataclass(frozen=True)
class DumpSummary(WrittenCounts):
    """The written counts, and what the rest of the pass found and measured."""

    skipped_existing: int = 0  # documents earlier runs stored
    existing_text_bytes: int = 0  # and their text
    empty_skipped: int = 0
    skips: list[Skip] = field(default_factory=list)  # this worker's writers' skip lists, this run's and earlier
    skipped_now: int = 0  # of them, met by this run
    not_read: str | None = None  # corpus entries not read, counted by reason
    store: str = ""  # the store directory
    store_bytes: int = 0  # this writer's shards, documents of earlier runs included
    setup_seconds: float = 0.0  # loading the teacher, tokenizer and trie
    seconds: float = 0.0  # the pass itself, after setup
    forward_seconds: float = 0.0  # the teacher's trunk and head
    device_convert_seconds: float = 0.0  # the device path's conversion, between head chunks
    outside_forward_seconds: float = 0.0

    @property
    def teacher_bpb(self) -> float:
        return self.teacher_nll_nats / (math.log(2) * self.text_bytes) if self.text_bytes else float("nan")

    @property
    def bytes_per_text_byte(self) -> float:
        stored_text = self.existing_text_bytes + self.text_bytes
        return self.store_bytes / stored_text if stored_text else float("nan")

    def document_counts(self) -> str:
        return (
            f"{self.documents:,} (+{self.skipped_existing:,} already stored, {self.empty_skipped:,} empty skipped, "
            f"{len(self.skips):,} unencodable skipped)"
        )

    def skip_lines(self) -> list[str]:
        """The skipped documents, the first few by key and reason, and where the list is."""
        if not self.skips:
            return []
        earlier = len(self.skips) - self.skipped_now
        head = f"skipped             {len(self.skips):,} documents the teacher cannot encode" + (
            f" ({earlier:,} listed by an earlier run)" if earlier else ""
        )
        shown = [f"  {s.key}: {s.reason}" for s in self.skips[:SHOWN_SKIPS]]
        more = len(self.skips) - len(shown)
        return [
            head,
            *shown,
            f"  {'… ' + format(more, ',') + ' more; ' if more else ''}all in {Path(self.store) / SKIP_LIST.shown}",
        ]

    def lines(self) -> list[str]:
        store = (
            f"{self.store_bytes:,} bytes in the shards alone ({self.bytes_per_text_byte:.2f} per text byte; "
            "inspect also counts the manifest and the vocabulary file)"
        )
        notes = self.skip_lines() + ([f"not read            {self.not_read}"] if self.not_read else [])
        if not self.documents:
            return [
                f"documents           {self.document_counts()}: nothing left to dump",
                *notes,
                f"store size          {store}",
            ]
        mean_dropped = self.dropped_mass_sum / max(self.teacher_rows, 1)
        return [
            f"documents           {self.document_counts()}",
            *notes,
            f"text bytes          {self.text_bytes:,}",
            (
                f"teacher tokens      {self.tokens:,} ({self.teacher_rows:,} teacher rows, the progress bar's count: "
                "each document's tokens and its end)"
            ),
            f"stream positions    {self.positions:,}",
            f"store size          {store}",
            (
                f"teacher BPB         {self.teacher_bpb:.4f} as stored (what train and score report; "
                f"{self.exact_teacher_nll_nats / (math.log(2) * self.text_bytes):.4f} before the encoding's rounding)"
            ),
            f"encoding KL         {self.kl_bits / max(self.positions, 1):.3g} bits per position (exact || stored, mean)",
            f"dropped special mass {mean_dropped:.3g} per teacher row (mean)",
            (
                f"time                {self.seconds:.1f} s after {self.setup_seconds:.1f} s of setup "
                f"({self.tokens / max(self.seconds, 1e-9):,.0f} tokens/s); "
                f"{self.outside_forward_seconds / max(self.seconds, 1e-9):.1%} of it outside the teacher forward"
            ),
        ]
