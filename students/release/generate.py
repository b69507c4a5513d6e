"""Sample text from an exported student folder (``bytedistill generate``).

The prompt becomes the training stream (the teacher's token ends, as ``<eot>`` marks or as the
fused stream's flagged bytes, via the folder's stream tokenizer) up to its last word, whose bytes
are fed with the student placing the token ends (``HealingProcessor``: the word may go on, so the
teacher's segmentation of the cut-off word is not imposed); the student places its own in what it
generates; a last word longer than half the trained context is healed over its last tokens within
that half only (the rest keeps the teacher's segmentation: past the context the window would drop
it). Budgets count text bytes, never ``<eot>``, and the output drops every mark. Past the trained
context the window slides: generation continues from the last half context of symbols, so no
position the student never trained is run.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import torch
from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from bytestream.healing import HealingProcessor
from bytestream.stream_kind import StreamKind
from students.models.decode import generate_compiled
from students.release.exported_folder import load_model, load_stream_tokenizer, require_same_stream
from students.release.generate_options import GenerateOptions


class _ByteBudget(StoppingCriteria):
    """Stop each row once its ``max_bytes`` text bytes (symbols below ``text_symbols``: not ``<eot>``)
    follow the prompt, or once it has ``max_symbols`` new symbols (where its own window reaches the
    trained context)."""

    def __init__(
        self,
        prompt_len: int,
        max_bytes: int | list[int],
        max_symbols: int | list[int] | None,
        text_symbols: int,
    ):
        self.prompt_len, self.max_bytes, self.text_symbols = prompt_len, torch.as_tensor(max_bytes), text_symbols
        self.max_symbols = None if max_symbols is None else torch.as_tensor(max_symbols)

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        new = input_ids[:, self.prompt_len :]
        done = (new < self.text_symbols).sum(-1) >= self.max_bytes.to(new.device)
        if self.max_symbols is not None:
            done |= new.shape[1] >= self.max_symbols.to(new.device)
        return done


def load_folder(folder: Path):
    """The exported student and its stream tokenizer."""
    return load_model(folder), load_stream_tokenizer(folder)


def generate_bytes(model, tokenizer, prompt: str, options: GenerateOptions) -> bytes:
    """The continuation's exact bytes (``<eot>``, flags and other specials dropped)."""
    return generate_batch(model, tokenizer, [prompt], options)[0]


def generate_batch(model, tokenizer, prompts: list[str], options: GenerateOptions) -> list[bytes]:
    """Each prompt's continuation, the prompts generated together as one left-padded batch (each
    healed on its own; greedy, a row's continuation is the one it gets alone)."""
    require_same_stream(model, tokenizer)
    encoded = [encode_prompt(model, tokenizer, prompt.encode("utf-8")) for prompt in prompts]
    return continue_streams(model, [s for s, _ in encoded], [o for _, o in encoded], options)


def encode_prompt(model, tokenizer, prompt: bytes) -> tuple[list[int], bytes]:
    """A completion prompt's stream and its open last word, healed over at most half the trained
    context (what the window keeps once it slides): the same for ``generate``, the engine and the server."""
    heal = max(model.config.max_position_embeddings // 2, 1)
    return tokenizer.encode_prompt(prompt, max_open=heal)


def continue_stream(model, symbols: list[int], open_bytes: bytes, options: GenerateOptions) -> bytes:
    """The bytes that follow ``open_bytes`` (fed first, the model placing their ``<eot>`` marks)
    after the stream ``symbols``."""
    return continue_streams(model, [symbols], [open_bytes], options)[0]


def stop_symbols(model, stream: StreamKind) -> set[int]:
    """The symbols a generation stops at: ``<eos>``, and a chat student's end-of-turn symbols (its
    generation config's ``eos_token_id``)."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if configured is None:
        configured = []
    return {stream.eos, *([configured] if isinstance(configured, int) else configured)}


@torch.no_grad()
def continue_streams(
    model,
    streams: list[list[int]],
    open_bytes: list[bytes],
    options: GenerateOptions,
    streamer=None,
    stopped: list[bool] | None = None,
) -> list[bytes]:
    """:func:`continue_stream` for several streams at once: each row slides its own window, and a
    row leaves the batch once it has its bytes (or ``<eos>``, or a chat student's end of turn).
    ``streamer`` (one stream only) is shown each generation call's input, then its new symbols,
    as ``transformers``' streamers are. ``stopped``, a list, is given whether each row ended at a
    stop symbol (rather than at its budget)."""
    torch.manual_seed(options.seed)
    stream = StreamKind.of_config(model.config)
    stops, pad, text_symbols = stop_symbols(model, stream), stream.pad, stream.text_symbols
    if streamer is not None and len(streams) != 1:
        raise ValueError("a streamer follows one stream at a time")
    context = model.config.max_position_embeddings
    symbols = [list(s) for s in streams]
    prompt_len = [len(s) for s in streams]
    wanted = [len(o) + options.max_new_bytes for o in open_bytes]  # the prompt's last word, then the continuation
    produced = [0] * len(streams)
    sampling = (
        {} if options.greedy else {"temperature": options.temperature, "top_k": options.top_k, "top_p": options.top_p}
    )
    device = next(model.parameters()).device
    while active := [r for r in range(len(symbols)) if produced[r] < wanted[r] and symbols[r][-1] not in stops]:
        windows = [_window(symbols[r], context) for r in active]
        length = max(map(len, windows))
        ids = torch.tensor([[pad] * (length - len(w)) + w for w in windows], device=device)
        mask = torch.tensor([[0] * (length - len(w)) + [1] * len(w) for w in windows], device=device)
        opened = [open_bytes[r][produced[r] :] for r in active]
        # the last word's bytes fed, the student placing its token ends (the bytes stream has none: no word is open)
        healing = [HealingProcessor(opened, length, stream)] if any(opened) else []
        # each row stops where its own window reaches the context, so it slides where it would alone;
        # a call makes at most a context of symbols, so a budget beyond that is the context
        limits = [context - len(w) for w in windows]
        budgets = [min(wanted[r] - produced[r], context) for r in active]
        arguments = {
            "input_ids": ids,
            "attention_mask": mask,
            "do_sample": not options.greedy,
            "max_new_tokens": context - min(map(len, windows)),
            "pad_token_id": pad,
            "stopping_criteria": StoppingCriteriaList([_ByteBudget(length, budgets, limits, text_symbols)]),
            "logits_processor": LogitsProcessorList(healing),
            **({"streamer": streamer} if streamer is not None else {}),
            **sampling,
        }
        with _sliding_on_purpose():
            output = generate_compiled(model, **arguments) if options.compile else model.generate(**arguments)
        for row, r in enumerate(active):
            new = _until_stopped(output[row, length : length + limits[row]].tolist(), budgets[row], stream, stops)
            symbols[r] += new
            produced[r] += sum(1 for s in new if s < text_symbols)
    if stopped is not None:
        stopped[:] = [len(s) > n and s[-1] in stops for s, n in zip(symbols, prompt_len)]
    return [stream.text_bytes(symbols[r][prompt_len[r] :])[len(open_bytes[r]) : wanted[r]] for r in range(len(symbols))]


@contextlib.contextmanager
def _sliding_on_purpose():
    """Silence transformers' reminder that a call's length passed the trained context: a left-padded
    batch's longest row does, while each row's own positions stay within it (each stops at its own limit)."""
    logger = logging.getLogger("transformers.generation.stopping_criteria")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _window(symbols: list[int], context: int) -> list[int]:
    """The symbols a generation call reads: all of them within the trained context, else the last half context."""
    return symbols if len(symbols) < context else symbols[-max(context // 2, 1) :]


def _until_stopped(new: list[int], budget: int, stream: StreamKind, stops: set[int]) -> list[int]:
    """A row's generated symbols up to its byte budget or a stop symbol (what follows is the batch's padding)."""
    seen = 0
    for i, symbol in enumerate(new):
        seen += symbol < stream.text_symbols
        if seen >= budget or symbol in stops:
            return new[: i + 1]
    return new
