"""``bytedistill generate``: the command line over :func:`students.generate.generate_bytes`."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from bytestream.errors import UserError
from students.generate_options import GenerateOptions


@dataclass(kw_only=True)
class GenerateConfig(GenerateOptions):
    """The library's options (their flags), the model and the prompt."""

    model: str = field(metadata={"help": "exported model folder", "positional": True})
    prompt: str = field(default="", metadata={"help": "text to continue"})


def generate(config: GenerateConfig) -> int:
    """Continue a prompt with an exported student."""
    from students.generate import generate_bytes, load_folder

    require_text(config.prompt)
    model, tokenizer = load_folder(Path(config.model))
    context = model.config.max_position_embeddings
    print(f"trained context: {context} symbols; the window slides past it", file=sys.stderr)
    continuation = generate_bytes(model, tokenizer, config.prompt, config).decode("utf-8", errors="replace")
    print(config.prompt + continuation)
    return 0


def require_text(prompt: str) -> None:
    """Refuse a prompt that is not text: bytes of an argument that were not UTF-8 arrive as lone surrogates."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = prompt[exc.start]
        what = f"byte 0x{ord(char) - 0xDC00:02x}" if 0xDC80 <= ord(char) <= 0xDCFF else f"{char!r}"
        raise UserError(f"--prompt is not UTF-8 text ({what} at character {exc.start})") from None
