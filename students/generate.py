"""Sample text from an exported student folder (``bytedistill generate``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteria, StoppingCriteriaList

from distill.alphabet import NUM_BYTES
from distill.errors import UserError
from students.tokenizer import decode_bytes


class _ByteBudget(StoppingCriteria):
    """Stop once ``max_bytes`` byte symbols (not counting ``<eot>``) follow the prompt."""

    def __init__(self, prompt_len: int, max_bytes: int):
        self.prompt_len, self.max_bytes = prompt_len, max_bytes

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        produced = (input_ids[:, self.prompt_len :] < NUM_BYTES).sum(-1)
        return produced >= self.max_bytes


@dataclass
class GenerateOptions:
    max_new_bytes: int = 200
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False
    seed: int = 0


def load_folder(folder: Path):
    if not (Path(folder) / "config.json").is_file():
        raise UserError(f"{folder} is not an exported model folder (no config.json)")
    return AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


@torch.no_grad()
def generate_bytes(model, tokenizer, prompt: str, options: GenerateOptions) -> bytes:
    """The continuation's exact bytes (``<eot>`` and other specials dropped)."""
    torch.manual_seed(options.seed)
    inputs = tokenizer(prompt, return_tensors="pt")
    prompt_len = inputs["input_ids"].shape[1]
    sampling = {} if options.greedy else {"temperature": options.temperature, "top_k": options.top_k, "top_p": options.top_p}
    output = model.generate(
        **inputs,
        do_sample=not options.greedy,
        max_new_tokens=options.max_new_bytes * 4,  # symbols include <eot> marks; the byte budget stops first
        stopping_criteria=StoppingCriteriaList([_ByteBudget(prompt_len, options.max_new_bytes)]),
        **sampling,
    )
    return decode_bytes(output[0, prompt_len:].tolist())[: options.max_new_bytes]


def generate_text(folder: Path, prompt: str, options: GenerateOptions | None = None) -> str:
    """The continuation of ``prompt`` as text (invalid UTF-8 shown as U+FFFD)."""
    model, tokenizer = load_folder(folder)
    return generate_bytes(model, tokenizer, prompt, options or GenerateOptions()).decode("utf-8", errors="replace")
