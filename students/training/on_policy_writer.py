"""The student writes its answers: prompts cut from training windows, sampled continuations.

A prompt is the text a training window starts with, up to its first document end, at most the
bytes a sequence has room for beside a whole answer, and cut before its last space or newline, so
it ends where a word begins (a word cut in two would be read with a token end the whole word does
not have). The student reads the prompt as the training data shows it, the teacher's stream of the
prompt's text, and samples up to ``--on-policy-bytes`` text bytes at ``--on-policy-temperature``
(``<bos>``, ``<pad>`` and the bytes no teacher token holds are never drawn; ``<eos>`` ends an answer). Its draws come from a
generator of its own (:class:`SamplingRng`), whose state a checkpoint keeps, so a resumed run
writes the same answers.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from bytestream.stream_kind import StreamKind

WORD_STARTS = (ord(" "), ord("\n"))  # bytes a prompt is cut before
RNG_FILE = "on_policy_rng_rank{rank}.pt"


@dataclass(frozen=True)
class Answer:
    """A prompt, what the student wrote after it (its symbols, its text) and whether it wrote ``<eos>``."""

    prompt: bytes
    symbols: tuple[int, ...]
    text: bytes
    ended: bool


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


class SamplingRng:
    """The student's own random state for sampling (CPU, and the student's GPU when it has one),
    apart from the one initialisation and data order use."""

    def __init__(self, seed: int, device: torch.device):
        self.device = torch.device(device)
        self.cpu = torch.Generator().manual_seed(seed).get_state()
        self.cuda = None
        if self.device.type == "cuda":
            self.cuda = torch.Generator(device=self.device).manual_seed(seed).get_state()

    @contextmanager
    def drawing(self):
        """The global generators set to this state inside, and restored after; the state advances."""
        devices = [self.device] if self.cuda is not None else []
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(self.cpu)
            if self.cuda is not None:
                torch.cuda.set_rng_state(self.cuda, self.device)
            yield
            self.cpu = torch.get_rng_state()
            if self.cuda is not None:
                self.cuda = torch.cuda.get_rng_state(self.device)

    def save(self, folder: Path, rank: int) -> None:
        torch.save({"cpu": self.cpu, "cuda": self.cuda}, folder / RNG_FILE.format(rank=rank))

    def load(self, folder: Path, rank: int) -> bool:
        """The state a checkpoint saved (False: it has none, a run without on-policy training)."""
        path = folder / RNG_FILE.format(rank=rank)
        if not path.is_file():
            return False
        saved = torch.load(path, weights_only=True)
        self.cpu = saved["cpu"]
        if self.cuda is not None and saved["cuda"] is not None:
            self.cuda = saved["cuda"]
        return True


class _Budget(StoppingCriteria):
    """A row is done once it holds ``max_bytes`` new text bytes (or ``<eos>``, which generate stops at)."""

    def __init__(self, prompt_length: int, max_bytes: int, text_symbols: int):
        self.prompt_length, self.max_bytes, self.text_symbols = prompt_length, max_bytes, text_symbols

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        return (input_ids[:, self.prompt_length :] < self.text_symbols).sum(-1) >= self.max_bytes


def written(new: list[int], stream: StreamKind, max_bytes: int) -> tuple[list[int], bool]:
    """A row's new symbols up to its byte budget or ``<eos>`` (the batch's padding after it dropped),
    and whether it ended with ``<eos>``."""
    seen = 0
    for i, symbol in enumerate(new):
        if symbol == stream.eos:
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
    rng: SamplingRng,
    never: tuple[int, ...] = (),
) -> list[Answer]:
    """Each context's continuation, sampled together as one left-padded batch (``temperature`` 0:
    greedy); the symbols ``never`` (besides ``<bos>`` and ``<pad>``) are not drawn."""
    device = next(model.parameters()).device
    length = max(map(len, contexts))
    ids = torch.tensor([[stream.pad] * (length - len(c)) + c for c in contexts], device=device)
    mask = torch.tensor([[0] * (length - len(c)) + [1] * len(c) for c in contexts], device=device)
    steps = max_bytes + 1 if stream is StreamKind.FUSED else 2 * max_bytes + 1
    was_training = model.training
    model.eval()
    try:
        with rng.drawing():
            output = model.generate(
                input_ids=ids,
                attention_mask=mask,
                **(
                    {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
                    if temperature > 0
                    else {"do_sample": False}
                ),
                max_new_tokens=steps,
                pad_token_id=stream.pad,
                eos_token_id=stream.eos,
                suppress_tokens=[stream.bos, stream.pad, *never],
                stopping_criteria=StoppingCriteriaList([_Budget(length, max_bytes, stream.text_symbols)]),
            )
    finally:
        model.train(was_training)
    answers = []
    for row, prompt in enumerate(prompts):
        symbols, ended = written(output[row, length:].tolist(), stream, max_bytes)
        answers.append(Answer(prompt, tuple(symbols), stream.text_bytes(symbols), ended))
    return answers
