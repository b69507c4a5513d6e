"""A teacher's tokens as a stream's symbols (docs/DESIGN.md, "Stream" and "The fused stream"):
each token's bytes then ``<eot>``, or its bytes with the last one flagged "ends", a reserved
special as one symbol. The student's tokenizer (``bytestream/stream_tokenizer.py``) keeps a marked
copy (tests/test_shipped_copies.py holds it to this source).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bytestream.alphabet import FUSED_ENDS, NUM_BYTES

if TYPE_CHECKING:
    from bytestream.stream_kind import StreamKind


def stream_symbols(spelled: list[bytes | int], stream: StreamKind, *, bos: bool = True, eos: bool = False) -> list[int]:
    """The ``stream`` of the tokens' bytes: ``[<bos>] bytes(t_1) <eot> … bytes(t_m) <eot> [<eos>]``,
    or in the fused stream each token's bytes with its last one flagged (a token with no bytes, the
    dummy prefix space alone, is context and holds no symbol), or in the bytes stream the bytes alone; a reserved special (an int ``i``,
    as :meth:`TeacherTokens.streamed_tokens` gives it) is the one symbol ``alphabet_size + i``."""
    symbols = [stream.bos] if bos else []
    for spelling in spelled:
        if isinstance(spelling, int):
            symbols.append(stream.alphabet_size + spelling)
        elif stream.eot is not None:
            symbols.extend(spelling)
            symbols.append(stream.eot)
        elif stream.text_symbols > NUM_BYTES:  # the fused stream: the last byte flagged
            symbols.extend(spelling[:-1])
            symbols.extend([FUSED_ENDS + spelling[-1]] if spelling else [])
        else:  # the bytes stream: the bytes alone
            symbols.extend(spelling)
    if eos:
        symbols.append(stream.eos)
    return symbols
