"""Teacher windows over long documents.

A document of m tokens needs m+1 teacher rows: row r is the teacher's output after the context
prefix (its BOS) and tokens t_0..t_{r-1}. A window feeds ``prefix + t[token_start:token_stop]``
and keeps rows ``row_start..row_stop-1``. The first window starts at the document's beginning;
each next one starts ``stride`` tokens before its first kept row, so **every row sees at least
``min(stride, r)`` earlier tokens of its document** (all of them when the document fits in one
window), and each window holds at most ``max_length`` inputs, the prefix included.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
