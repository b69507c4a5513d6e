"""The bytes stream read from a fused one (docs/DESIGN.md, "The bytes stream"): each fused symbol
loses its flag, and each fused row sums its byte's two halves, P(b | s) = P(b, ends | s) + P(b, goes
on | s); the specials (``<bos>``, ``<eos>``, ``<pad>``, a chat store's reserved symbols) keep their
own mass and their order, moved down past the flagged bytes.

:func:`bytes_symbols` and :func:`bytes_rows` take numpy arrays or torch tensors; :func:`as_read` is
where a stored stream becomes the one a student reads.
"""

from __future__ import annotations

from bytestream.alphabet import BYTES_BOS, FUSED_BOS, FUSED_ENDS, NUM_BYTES
from bytestream.stream_kind import StreamKind

SPECIALS_SHIFT = FUSED_BOS - BYTES_BOS  # a fused special (reserved ones included) less this is its bytes symbol


def bytes_symbols(fused):
    """The bytes stream of fused symbols: byte ``b`` (inside or ending its token) is ``b``, a special moves down."""
    return (fused < FUSED_BOS) * (fused % NUM_BYTES) + (fused >= FUSED_BOS) * (fused - SPECIALS_SHIFT)


def bytes_rows(fused_rows):
    """Rows over the bytes alphabet (then the reserved symbols) from rows over the fused one: byte ``b``'s
    mass is its "goes on" entry plus its "ends" entry, one addition each; the specials' columns are kept."""
    rows = fused_rows[..., SPECIALS_SHIFT:] * 1  # a copy: the ends halves, then the specials
    rows[..., :NUM_BYTES] += fused_rows[..., :FUSED_ENDS]  # plus the goes-on halves
    return rows


def as_read(stream: StreamKind, symbols, rows=None):
    """A stored stream's ``symbols`` (and teacher ``rows``, or None) as a student of ``stream`` reads them:
    a bytes student's with the fused flags summed out, any other's as stored."""
    if stream is not StreamKind.BYTES:
        return symbols, rows
    return bytes_symbols(symbols), None if rows is None else bytes_rows(rows)
