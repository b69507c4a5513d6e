"""The student writes its answers: prompts cut from training windows, sampled continuations.

A prompt is the text a training window starts with, up to its first document end, at most the
bytes a sequence has room for beside a whole answer, and cut before its last space or newline, so
it ends where a word begins (a word cut in two would be read with a token end the whole word does
not have). The student reads the prompt as the training data shows it, the teacher's stream of the
prompt's text, and samples up to ``--on-policy-bytes`` text bytes at ``--on-policy-temperature``
(``<bos>``, ``<pad>`` and the bytes no teacher token holds are never drawn; ``<eos>`` ends an answer).

In a store of conversations a prompt is a window's stream up to the start of an assistant turn
(:func:`chat_prompt_of`: where its targets' role turns to the assistant's, after the template's
generation prompt), with its reserved symbols (the template's specials), taken from the
conversation's start when it has room, else from the first special that leaves room (the text
after a special is read the same way wherever the document starts). The student writes the
assistant's turn until the template's end of turn (a reserved symbol; the others are never
drawn), ``<eos>`` or the byte budget.
Each answer draws from a generator of its own, seeded by the sequence it replaces
(:func:`sequence_seed`: the run's seed, the epoch, the split and the window), by the Gumbel-max
trick (the argmax of the tempered logits plus Gumbel noise is a draw from their softmax): what a
sequence's answer is depends on the weights and that sequence alone, not on the other answers of
its batch, on the process that writes it or on what was drawn before, so two runs that train on
the same sequences with the same weights write the same answers, and a resumed run needs no
sampling state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from bytestream.stream_kind import StreamKind
from students.training.loss import ASSISTANT

WORD_STARTS = (ord(" "), ord("\n"))  # bytes a prompt is cut before


@dataclass(frozen=True)
class Answer:
    """A prompt, what the student wrote after it (its symbols, its text) and whether it ended (wrote
    ``<eos>`` or, in a conversation, the end of its turn). In a conversation the prompt's specials
    are ``prompt_specials`` ((byte offset in ``prompt``, teacher id), in order) and ``turn_end`` is
    the teacher id of the end of turn the student wrote."""

    prompt: bytes
    symbols: tuple[int, ...]
    text: bytes
    ended: bool
    prompt_specials: tuple[tuple[int, int], ...] = ()
    turn_end: int | None = None

    @property
    def prompt_units(self) -> int:
        """The prompt's stream units: its bytes and its specials."""
        return len(self.prompt) + len(self.prompt_specials)

    @property
    def wrote_eos(self) -> bool:
        return self.ended and self.turn_end is None

    def cut(self, length: int) -> Answer:
        """The answer cut to its first ``length`` text bytes, not ended."""
        return Answer(self.prompt, self.symbols, self.text[:length], False, self.prompt_specials)

    def shown(self, special_text) -> tuple[str, str]:
        """Prompt and answer as text (invalid UTF-8 escaped), each special as ``special_text(id)``."""

        def text(pieces) -> str:
            return "".join(
                p.decode("utf-8", "backslashreplace") if isinstance(p, bytes) else special_text(p) for p in pieces
            )

        prompt = Answer(self.prompt, (), b"", False, self.prompt_specials).pieces()
        return text(prompt), text([self.text, *([self.turn_end] if self.turn_end is not None else [])])

    def pieces(self) -> list[bytes | int]:
        """Prompt and answer as the teacher reads them: text pieces and specials (teacher ids)."""
        whole = self.prompt + self.text
        specials = [*self.prompt_specials, *([(len(whole), self.turn_end)] if self.turn_end is not None else [])]
        pieces: list[bytes | int] = []
        at = 0
        for offset, special in specials:
            if offset > at:
                pieces.append(whole[at:offset])
            pieces.append(special)
            at = offset
        if at < len(whole):
            pieces.append(whole[at:])
        return pieces


def prompt_of(inputs: np.ndarray, stream: StreamKind, budget: int) -> bytes:
    """The prompt a window's input symbols give: its text up to the first document end (``<eos>``,
    a new ``<bos>`` or padding), at most ``budget`` bytes, cut before the last space or newline."""
    text = bytearray()
    for i, symbol in enumerate(inputs.tolist()):
        byte = stream.byte_value(symbol)
        if byte is None:
            if symbol == stream.eot or (i == 0 and symbol == stream.bos):
                continue
            break
        text.append(byte)
        if len(text) == budget:
            break
    cut = max((i for i, b in enumerate(text) if b in WORD_STARTS), default=0)
    return bytes(text[:cut] if cut > 0 else text)


def chat_prompt_of(
    inputs: np.ndarray, roles: np.ndarray, stream: StreamKind, budget: int, reserved_ids: tuple[int, ...]
) -> tuple[bytes, tuple[tuple[int, int], ...]] | None:
    """The prompt of a conversation's window (``roles``: its targets' roles): its stream up to the
    first assistant turn start that has room, as text and specials ((byte offset, teacher id) of its
    reserved symbols), at most ``budget`` units (bytes and specials); None when no turn starts in
    the window with room before it."""
    symbols, roles = inputs.tolist(), roles.tolist()
    alphabet = stream.alphabet_size
    for t in range(1, len(symbols) - 1):
        if roles[t] != ASSISTANT or roles[t - 1] == ASSISTANT or symbols[t + 1] == stream.pad:
            continue
        begins = [i for i in range(t + 1) if symbols[i] in (stream.bos, stream.eos)]
        starts = [begins[-1] + 1] if begins and symbols[begins[-1]] == stream.bos else []
        starts += [i for i in range(begins[-1] + 1 if begins else 0, t + 1) if symbols[i] >= alphabet]
        for start in sorted(set(starts)):
            units = sum(
                1 for symbol in symbols[start : t + 1] if stream.byte_value(symbol) is not None or symbol >= alphabet
            )
            if 0 < units <= budget:
                return _prompt_pieces(symbols[start : t + 1], stream, reserved_ids)
    return None


def _prompt_pieces(
    symbols: list[int], stream: StreamKind, reserved_ids: tuple[int, ...]
) -> tuple[bytes, tuple[tuple[int, int], ...]]:
    text, specials = bytearray(), []
    for symbol in symbols:
        byte = stream.byte_value(symbol)
        if byte is not None:
            text.append(byte)
        elif symbol >= stream.alphabet_size:
            specials.append((len(text), reserved_ids[symbol - stream.alphabet_size]))
    return bytes(text), tuple(specials)


def sequence_seed(seed: int, epoch: int, split: int, window: int) -> int:
    """The seed of the answer that replaces window ``window`` of split ``split`` in ``epoch``."""
    return int(np.random.SeedSequence([seed, epoch, split, window]).generate_state(1, np.uint64)[0] >> 1)


class _GumbelDraw(LogitsProcessor):
    """Turns greedy decoding into sampling at ``temperature``: each row's tempered scores plus
    Gumbel noise from the row's own generator (on the CPU, so the draws are the same on any device)."""

    def __init__(self, seeds: list[int], temperature: float):
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        self.temperature = temperature

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        size = scores.shape[-1]
        noise = torch.stack([torch.empty(size, dtype=torch.float64).exponential_(generator=g) for g in self.generators])
        gumbel = (-noise.log()).to(device=scores.device, dtype=torch.float32)
        return scores.float() / self.temperature + gumbel


class _Budget(StoppingCriteria):
    """A row is done once it holds ``max_bytes`` new text bytes (or ``<eos>``, which generate stops at)."""

    def __init__(self, prompt_length: int, max_bytes: int, text_symbols: int):
        self.prompt_length, self.max_bytes, self.text_symbols = prompt_length, max_bytes, text_symbols

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        return (input_ids[:, self.prompt_length :] < self.text_symbols).sum(-1) >= self.max_bytes


def written(new: list[int], stream: StreamKind, max_bytes: int, stops: tuple[int, ...] = ()) -> tuple[list[int], bool]:
    """A row's new symbols up to its byte budget or ``<eos>`` (or one of ``stops``; the batch's
    padding after it dropped), and whether it ended with one of them."""
    seen = 0
    for i, symbol in enumerate(new):
        if symbol == stream.eos or symbol in stops:
            return new[: i + 1], True
        seen += symbol < stream.text_symbols
        if seen >= max_bytes:
            return new[: i + 1], False
    return new, False


@torch.no_grad()
def write_answers(
    model,
    contexts: list[list[int]],
    prompts: list[bytes],
    stream: StreamKind,
    *,
    max_bytes: int,
    temperature: float,
    seeds: list[int],
    never: tuple[int, ...] = (),
    stops: tuple[int, ...] = (),
) -> list[Answer]:
    """Each context's continuation, written together as one left-padded batch, row i sampled with
    seed ``seeds[i]`` (``temperature`` 0: greedy), until ``<eos>``, one of ``stops`` or the byte
    budget; the symbols ``never`` (besides ``<bos>`` and ``<pad>``) are not drawn."""
    device = next(model.parameters()).device
    length = max(map(len, contexts))
    ids = torch.tensor([[stream.pad] * (length - len(c)) + c for c in contexts], device=device)
    mask = torch.tensor([[0] * (length - len(c)) + [1] * len(c) for c in contexts], device=device)
    steps = max_bytes + 1 if stream.eot is None else 2 * max_bytes + 1
    draw = [_GumbelDraw(seeds, temperature)] if temperature > 0 else []
    was_training = model.training
    model.eval()
    try:
        output = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            logits_processor=LogitsProcessorList(draw),
            max_new_tokens=steps,
            pad_token_id=stream.pad,
            eos_token_id=[stream.eos, *stops],
            suppress_tokens=[stream.bos, stream.pad, *never],
            stopping_criteria=StoppingCriteriaList([_Budget(length, max_bytes, stream.text_symbols)]),
        )
    finally:
        model.train(was_training)
    answers = []
    for row, prompt in enumerate(prompts):
        symbols, ended = written(output[row, length:].tolist(), stream, max_bytes, stops)
        answers.append(Answer(prompt, tuple(symbols), stream.text_bytes(symbols), ended))
    return answers
