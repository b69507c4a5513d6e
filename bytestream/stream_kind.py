"""Which stream a store holds and a student reads: the ``<eot>`` stream or the fused one
(docs/DESIGN.md, "Stream" and "The fused stream").

Importing it loads no Numba (a store's manifest names its stream, and ``--help`` reads neither):
the layouts are imported when one is made.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from bytestream.alphabet import (
    ALPHABET_SIZE,
    BOS,
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


class StreamKind(Enum):
    """``EOT``: bytes with an ``<eot>`` symbol after each teacher token; ``FUSED``: one symbol per
    text byte that says whether the teacher's token ends with it."""

    EOT = "eot"
    FUSED = "fused"

    @property
    def alphabet_size(self) -> int:
        return FUSED_ALPHABET_SIZE if self is StreamKind.FUSED else ALPHABET_SIZE

    @property
    def bos(self) -> int:
        return FUSED_BOS if self is StreamKind.FUSED else BOS

    @property
    def eos(self) -> int:
        return FUSED_EOS if self is StreamKind.FUSED else EOS

    @property
    def pad(self) -> int:
        return FUSED_PAD if self is StreamKind.FUSED else PAD

    @property
    def eot(self) -> int | None:
        """The ``<eot>`` symbol; the fused stream has none."""
        return None if self is StreamKind.FUSED else EOT

    @property
    def text_symbols(self) -> int:
        """Symbols below this are text bytes (the fused stream's flagged bytes included)."""
        return 2 * NUM_BYTES if self is StreamKind.FUSED else NUM_BYTES

    def byte_value(self, symbol: int) -> int | None:
        """The text byte a symbol stands for, or None for a special (``<eot>``, ``<bos>``, …)."""
        symbol = int(symbol)
        return symbol % NUM_BYTES if 0 <= symbol < self.text_symbols else None

    def text_bytes(self, symbols) -> bytes:
        """The exact bytes of a symbol sequence: its text bytes, flags and specials dropped."""
        return bytes(b for b in map(self.byte_value, symbols) if b is not None)

    def closes_token(self, symbol: int) -> bool:
        """Whether the teacher's token ends at this symbol: ``<eot>``, or a fused byte flagged "ends"."""
        symbol = int(symbol)
        return FUSED_ENDS <= symbol < FUSED_BOS if self is StreamKind.FUSED else symbol == EOT

    @property
    def shown(self) -> str:
        """How a message names it: ``<eot>`` or ``fused``."""
        return "fused" if self is StreamKind.FUSED else "<eot>"

    def layout(self, trie: VocabTrie, token_ids: np.ndarray) -> StreamLayout:
        """A document's stream and supports from its teacher token ids (no BOS/EOS ids)."""
        import numpy as np

        from bytestream.fused_stream import fused_stream_layout
        from bytestream.stream import stream_layout

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
