"""Prompt healing for ``generate`` (docs/DESIGN.md, "`<eot>` at inference"): a prompt's last word
is fed byte by byte, the model's own scores choosing at each byte between its two symbols (the byte
and ``<eot>``, or its two flags), so the student places the token ends inside the word. The
student's tokenizer (``bytestream/stream_tokenizer.py``) keeps marked copies (tests/test_shipped_copies.py
holds them to this source).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers import LogitsProcessor

if TYPE_CHECKING:
    from bytestream.stream_kind import StreamKind


def _per_row(items: list, rows: int) -> list:
    """``items`` (one per prompt) for each of ``rows`` rows, as ``generate`` expands prompts: each
    prompt's ``rows // len(items)`` copies next to each other."""
    if not items or rows % len(items):
        raise ValueError(f"a batch of {rows} rows does not expand {len(items)} prompts")
    copies = rows // len(items)
    return [items[row // copies] for row in range(rows)]


class HealingProcessor(LogitsProcessor):
    """Feeds each row's open bytes (its prompt's last word) to ``generate``, for any model.

    Row ``r`` of the batch has ``forced[r]`` still to come after the ``prompt_length`` symbols it
    was given: while some are left, only the next byte's two choices keep their scores (in the
    ``<eot>`` stream the byte and ``<eot>``; in the fused stream the byte flagged "goes on" and
    "ends", one step per byte), so the model's own choice places the token ends inside the word;
    then generation goes on freely. In the ``<eot>`` stream ``<eot>`` never follows ``<bos>`` or
    ``<eot>`` (a token has a byte). ``generate`` expands each prompt's row into consecutive rows
    (``num_return_sequences``, ``num_beams``): row ``r`` of a batch of ``k`` times the prompts is
    prompt ``r // k``'s (:func:`_per_row`).
    """

    def __init__(self, forced: list[bytes], prompt_length: int, stream: StreamKind):
        self.forced, self.prompt_length, self.stream = list(forced), prompt_length, stream

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        stream = self.stream
        if stream.eot is not None:
            last = input_ids[:, -1]
            empty = (last == stream.eot) | (last == stream.bos) | (last >= stream.alphabet_size)
            scores[empty, stream.eot] = float("-inf")
        produced = (input_ids[:, self.prompt_length :] < stream.text_symbols).sum(-1).tolist()
        for row, (tail, done) in enumerate(zip(_per_row(self.forced, len(produced)), produced)):
            if done < len(tail):
                choices = stream.choices(tail[done])
                kept = scores[row, choices].clone()
                scores[row] = float("-inf")
                scores[row, choices] = kept
        return scores
