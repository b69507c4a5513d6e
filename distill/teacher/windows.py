"""Teacher windows over long documents.

A document of m tokens needs m+1 teacher rows: row r is the teacher's output after the context
prefix (its BOS) and tokens t_0..t_{r-1}. A window feeds ``prefix + t[token_start:token_stop]``
and keeps rows ``row_start..row_stop-1``. The first window starts at the document's beginning;
each next one starts ``stride`` tokens before its first kept row, so **every row sees at least
``min(stride, r)`` earlier tokens of its document** (all of them when the document fits in one
window), and each window holds at most ``max_length`` inputs, the prefix included.

How a store's teacher read its documents is one value, :class:`Reading`: the stream its rows are
converted into and the windows' ``max_length`` and ``stride``. The dump settles it and records it in
the store's manifest; on-policy training reads it back from there (:meth:`Reading.of_manifest`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bytestream.stream_kind import StreamKind
from configs.ranges import NON_NEGATIVE, at_least


@dataclass(frozen=True)
class Window:
    token_start: int
    token_stop: int
    row_start: int
    row_stop: int  # exclusive

    def input_length(self, prefix_length: int) -> int:
        return prefix_length + self.token_stop - self.token_start

    def output_positions(self, prefix_length: int) -> np.ndarray:
        """Input positions whose outputs are the kept rows (row r is the output after t_{r-1})."""
        first = prefix_length - 1 + self.row_start - self.token_start
        return np.arange(first, first + self.row_stop - self.row_start)


def plan_windows(num_tokens: int, prefix_length: int, max_length: int, stride: int) -> list[Window]:
    if prefix_length < 1:
        raise ValueError("a window needs a context prefix of at least one token")
    capacity = max_length - prefix_length
    if not 0 <= stride < capacity:
        raise ValueError(
            f"stride must be in 0..{capacity - 1} for windows of {max_length} with a prefix of {prefix_length}"
        )
    rows = num_tokens + 1
    windows = []
    row_start, token_start = 0, 0
    while row_start < rows:
        token_stop = min(num_tokens, token_start + capacity)
        row_stop = token_stop + 1  # the row after the window's last token is still inside it
        windows.append(Window(token_start, token_stop, row_start, row_stop))
        row_start = row_stop
        token_start = max(0, row_start - stride)
    return windows


@dataclass
class TeacherWindows:
    """The windows a dump reads long documents in (the flags ``--max-length`` and ``--stride``)."""

    max_length: int = field(
        default=2048, metadata={"help": "teacher window length in tokens, its BOS included", "range": at_least(2)}
    )
    stride: int = field(
        default=512,
        metadata={
            "help": "overlap between windows: every prediction sees at least this many earlier tokens of its document "
            "(or all of them)",
            "range": NON_NEGATIVE,
        },
    )


@dataclass(frozen=True)
class Reading:
    """How a teacher reads a document into a store's rows: the stream the rows are converted into,
    and the windows (``max_length`` inputs, the prefix included; ``stride`` tokens of overlap)."""

    stream: StreamKind
    max_length: int
    stride: int

    def windows(self, num_tokens: int, prefix_length: int) -> list[Window]:
        """The windows of a document of ``num_tokens`` tokens read after a prefix of ``prefix_length``."""
        return plan_windows(num_tokens, prefix_length, self.max_length, self.stride)

    def settings(self) -> dict:
        """What the manifest's ``settings`` record of it (the manifest names the stream itself)."""
        return {"max_length": self.max_length, "stride": self.stride}

    @classmethod
    def of_manifest(cls, manifest: dict) -> Reading:
        """The reading a store's (read) manifest records."""
        from logit_store.manifest import manifest_stream

        settings = manifest.get("settings", {})
        return cls(manifest_stream(manifest), int(settings["max_length"]), int(settings["stride"]))
