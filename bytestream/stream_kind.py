"""Which stream a store holds and a student reads: the ``<eot>`` stream or the fused one
(docs/DESIGN.md, "Stream" and "The fused stream").

Importing it loads no Numba (a store's manifest names its stream, and ``--help`` reads neither):
the layouts are imported when one is made.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from bytestream.alphabet import ALPHABET_SIZE, FUSED_ALPHABET_SIZE

if TYPE_CHECKING:
    import numpy as np

    from bytestream.stream import StreamLayout
    from bytestream.trie import VocabTrie


class StreamKind(Enum):
    """``EOT``: bytes with an ``<eot>`` symbol after each teacher token; ``FUSED``: one symbol per
    text byte that says whether the teacher's token ends with it."""

    EOT = "eot"
    FUSED = "fused"

    @property
    def alphabet_size(self) -> int:
        return FUSED_ALPHABET_SIZE if self is StreamKind.FUSED else ALPHABET_SIZE

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
