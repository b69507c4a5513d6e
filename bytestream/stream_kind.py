"""Which stream a store holds and a student reads: the ``<eot>`` stream or the fused one, which
stores hold and students read, or the bytes stream, which a student reads from fused stores
(docs/DESIGN.md, "Stream", "The fused stream" and "The bytes stream").

Importing it loads no Numba (a store's manifest names its stream, and ``--help`` reads neither):
the layouts are imported when one is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from bytestream.alphabet import (
    ALPHABET_SIZE,
    BOS,
    BYTES_ALPHABET_SIZE,
    BYTES_BOS,
    BYTES_EOS,
    BYTES_PAD,
    EOS,
    EOT,
    FUSED_ALPHABET_SIZE,
    FUSED_BOS,
    FUSED_ENDS,
    FUSED_EOS,
    FUSED_PAD,
    NUM_BYTES,
    PAD,
)

if TYPE_CHECKING:
    import numpy as np

    from bytestream.stream import StreamLayout
    from bytestream.trie import VocabTrie


AUTO_STREAM = "auto"  # dump's and train's --stream default: the store's stream (a new store: fused)


@dataclass(frozen=True)
class _Symbols:
    """A stream's alphabet and where its specials sit in it."""

    alphabet_size: int
    bos: int
    eos: int
    pad: int
    eot: int | None  # the <eot> symbol, in the one stream that has it
    text_symbols: int  # symbols below this are text bytes
    shown: str  # how a message names the stream


class StreamKind(Enum):
    """``EOT``: bytes with an ``<eot>`` symbol after each teacher token; ``FUSED``: one symbol per
    text byte that says whether the teacher's token ends with it; ``BYTES``: the text bytes alone,
    read from a fused store with each byte's two flags summed (no store holds it)."""

    EOT = "eot"
    FUSED = "fused"
    BYTES = "bytes"

    @property
    def _symbols(self) -> _Symbols:
        return _SYMBOLS[self.value]

    @property
    def stored(self) -> StreamKind:
        """The stream of the stores a student of this stream reads: the fused one for the bytes stream."""
        return StreamKind.FUSED if self is StreamKind.BYTES else self

    @classmethod
    def stored_kinds(cls) -> list[StreamKind]:
        """The streams a store can hold (a dump's ``--stream``)."""
        return [kind for kind in cls if kind.stored is kind]

    @property
    def alphabet_size(self) -> int:
        return self._symbols.alphabet_size

    @property
    def bos(self) -> int:
        return self._symbols.bos

    @property
    def eos(self) -> int:
        return self._symbols.eos

    @property
    def pad(self) -> int:
        return self._symbols.pad

    @property
    def eot(self) -> int | None:
        """The ``<eot>`` symbol; the fused and bytes streams have none."""
        return self._symbols.eot

    @property
    def text_symbols(self) -> int:
        """Symbols below this are text bytes (the fused stream's flagged bytes included)."""
        return self._symbols.text_symbols

    def byte_value(self, symbol: int) -> int | None:
        """The text byte a symbol stands for, or None for a special (``<eot>``, ``<bos>``, …)."""
        symbol = int(symbol)
        return symbol % NUM_BYTES if 0 <= symbol < self.text_symbols else None

    def text_bytes(self, symbols) -> bytes:
        """The exact bytes of a symbol sequence: its text bytes, flags and specials dropped."""
        return bytes(b for b in map(self.byte_value, symbols) if b is not None)

    def closes_token(self, symbol: int) -> bool:
        """Whether the teacher's token ends at this symbol: ``<eot>``, or a fused byte flagged "ends"
        (never in the bytes stream, which holds no boundary)."""
        symbol = int(symbol)
        return FUSED_ENDS <= symbol < FUSED_BOS if self is StreamKind.FUSED else symbol == self.eot

    def choices(self, byte: int) -> list[int]:
        """The two symbols a healed prompt byte may take: the byte and ``<eot>``, or its two flags
        ("goes on" and "ends"); in the bytes stream, which places no token end, the byte twice."""
        if self is StreamKind.FUSED:
            return [byte, FUSED_ENDS + byte]
        return [byte, byte if self.eot is None else self.eot]

    @property
    def shown(self) -> str:
        """How a message names it: ``<eot>``, ``fused`` or ``bytes``."""
        return self._symbols.shown

    def layout(self, trie: VocabTrie, token_ids: np.ndarray) -> StreamLayout:
        """A document's stream and supports from its teacher token ids (no BOS/EOS ids); a stream a
        store holds (the bytes stream is read from the fused one's)."""
        import numpy as np

        from bytestream.fused_stream import fused_stream_layout
        from bytestream.stream import stream_layout

        if self.stored is not self:
            raise ValueError(f"the {self.shown} stream has no layout of its own: read the {self.stored.shown} one")
        ids = np.asarray(token_ids, dtype=np.int64)
        return fused_stream_layout(trie, ids) if self is StreamKind.FUSED else stream_layout(trie, ids)

    @classmethod
    def of_layout(cls, layout: StreamLayout) -> StreamKind:
        return cls.FUSED if layout.fused else cls.EOT

    @classmethod
    def of_config(cls, config) -> StreamKind:
        """The stream a student's model config (or its ``config.json`` read as a dict) reads: its
        ``byte_stream`` (absent: ``<eot>``, as every student before the fused stream)."""
        value = config.get("byte_stream") if isinstance(config, dict) else getattr(config, "byte_stream", None)
        return cls(value or cls.EOT.value)


_SYMBOLS = {
    StreamKind.EOT.value: _Symbols(ALPHABET_SIZE, BOS, EOS, PAD, EOT, NUM_BYTES, "<eot>"),
    StreamKind.FUSED.value: _Symbols(
        FUSED_ALPHABET_SIZE, FUSED_BOS, FUSED_EOS, FUSED_PAD, None, 2 * NUM_BYTES, "fused"
    ),
    StreamKind.BYTES.value: _Symbols(BYTES_ALPHABET_SIZE, BYTES_BOS, BYTES_EOS, BYTES_PAD, None, NUM_BYTES, "bytes"),
}
