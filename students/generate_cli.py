"""``bytedistill generate``: the command line over :func:`students.generate.generate_bytes`."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class GenerateConfig:
    model: str = field(metadata={"help": "exported model folder", "positional": True})
    prompt: str = field(default="", metadata={"help": "text to continue"})
    max_new_bytes: int = field(default=200, metadata={"help": "bytes to generate (<eot> marks not counted)"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    top_k: int = field(default=0, metadata={"help": "sample from the k most likely symbols (0: all)"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling mass"})
    greedy: bool = field(default=False, metadata={"help": "take the most likely symbol instead of sampling"})
    seed: int = field(default=0, metadata={"help": "random seed for sampling"})


def generate(config: GenerateConfig) -> int:
    """Continue a prompt with an exported student."""
    from students.generate import GenerateOptions, generate_bytes, load_folder

    options = GenerateOptions(
        max_new_bytes=config.max_new_bytes,
        temperature=config.temperature,
        top_k=config.top_k,
        top_p=config.top_p,
        greedy=config.greedy,
        seed=config.seed,
    )
    model, tokenizer = load_folder(Path(config.model))
    context = model.config.max_position_embeddings
    print(f"trained context: {context} symbols; the window slides past it", file=sys.stderr)
    continuation = generate_bytes(model, tokenizer, config.prompt, options).decode("utf-8", errors="replace")
    print(config.prompt + continuation)
    return 0
