"""Sample text from an exported student folder (``bytedistill generate``).

The prompt becomes the training stream (the teacher's ``<eot>`` marks, via the folder's stream
tokenizer) up to its last word, whose bytes are fed with the student placing the ``<eot>`` marks
(``HealingProcessor``: the word may go on, so the teacher's segmentation of the cut-off word is not
imposed); the student places its own ``<eot>`` marks in what it generates. Past the trained
context the window slides: generation continues from the last half context of symbols, so no
position the student never trained is run.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from bytestream.alphabet import EOS, NUM_BYTES
from bytestream.stream_tokenizer import HealingProcessor
from students.generate_options import GenerateOptions
from students.score import load_model, load_stream_tokenizer
from students.tokenizer import decode_bytes


class _ByteBudget(StoppingCriteria):
    """Stop once ``max_bytes`` byte symbols (not counting ``<eot>``) follow the prompt."""

    def __init__(self, prompt_len: int, max_bytes: int):
        self.prompt_len, self.max_bytes = prompt_len, max_bytes

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        produced = (input_ids[:, self.prompt_len :] < NUM_BYTES).sum(-1)
        return produced >= self.max_bytes


def load_folder(folder: Path):
    """The exported student and its stream tokenizer."""
    return load_model(folder), load_stream_tokenizer(folder)


def generate_bytes(model, tokenizer, prompt: str, options: GenerateOptions) -> bytes:
    """The continuation's exact bytes (``<eot>`` and other specials dropped)."""
    symbols, open_bytes = tokenizer.encode_prompt(prompt.encode("utf-8"))
    return continue_stream(model, symbols, open_bytes, options)


@torch.no_grad()
def continue_stream(model, symbols: list[int], open_bytes: bytes, options: GenerateOptions) -> bytes:
    """The bytes that follow ``open_bytes`` (fed first, the model placing their ``<eot>`` marks)
    after the stream ``symbols``."""
    torch.manual_seed(options.seed)
    context = model.config.max_position_embeddings
    symbols, prompt_len = list(symbols), len(symbols)
    wanted = len(open_bytes) + options.max_new_bytes  # the prompt's last word, then the continuation
    sampling = (
        {} if options.greedy else {"temperature": options.temperature, "top_k": options.top_k, "top_p": options.top_p}
    )
    produced = 0
    while produced < wanted and symbols[-1] != EOS:  # a byte at least every other symbol
        window = symbols if len(symbols) < context else symbols[-max(context // 2, 1) :]
        healing = HealingProcessor([open_bytes[produced:]], len(window))
        output = model.generate(
            input_ids=torch.tensor([window]),
            attention_mask=torch.ones(1, len(window), dtype=torch.long),
            do_sample=not options.greedy,
            max_new_tokens=context - len(window),
            stopping_criteria=StoppingCriteriaList([_ByteBudget(len(window), wanted - produced)]),
            logits_processor=LogitsProcessorList([healing]),
            **sampling,
        )
        new = output[0, len(window) :].tolist()
        symbols += new
        produced += sum(1 for s in new if s < NUM_BYTES)
    return decode_bytes(symbols[prompt_len:])[len(open_bytes) : wanted]
