"""``bytedistill generate``: the command line over :func:`students.release.generate.generate_batch`."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from bytestream.errors import UserError
from students.release.generate_options import GenerateOptions


@dataclass(kw_only=True)
class GenerateConfig(GenerateOptions):
    """The library's options (their flags), the model and the prompt."""

    model: str = field(metadata={"help": "exported model folder", "positional": True})
    prompt: list[str] = field(
        default_factory=list,
        metadata={
            "help": "text to continue (none: from nothing); several (--prompt A B, or --prompt again) are "
            "generated together as one batch",
            "repeatable": True,
        },
    )
    prompts_file: str | None = field(
        default=None, metadata={"help": "a UTF-8 file of prompts, one a line, generated together (after --prompt's)"}
    )


def generate(config: GenerateConfig) -> int:
    """Continue prompts with an exported student: each continued prompt is printed, one after another."""
    from students.release.generate import generate_batch, load_folder

    prompts = [require_text(prompt) for prompt in config.prompt] + read_prompts(config.prompts_file)
    prompts = prompts or [""]
    model, tokenizer = load_folder(Path(config.model))
    context = model.config.max_position_embeddings
    print(f"trained context: {context} symbols; the window slides past it", file=sys.stderr)
    for prompt, continuation in zip(prompts, generate_batch(model, tokenizer, prompts, config)):
        print(prompt + continuation.decode("utf-8", errors="replace"))
    return 0


def read_prompts(path: str | None) -> list[str]:
    """The lines of a prompts file (a trailing newline ends the last one)."""
    if path is None:
        return []
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UserError(f"--prompts-file {path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"--prompts-file {path} is not UTF-8 text (byte {exc.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise UserError(f"--prompts-file {path} holds no prompt")
    return [line.removesuffix("\r") for line in lines]


def require_text(prompt: str) -> str:
    """Refuse a prompt that is not text: bytes of an argument that were not UTF-8 arrive as lone surrogates."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = prompt[exc.start]
        what = f"byte 0x{ord(char) - 0xDC00:02x}" if 0xDC80 <= ord(char) <= 0xDCFF else f"{char!r}"
        raise UserError(f"--prompt is not UTF-8 text ({what} at character {exc.start})") from None
    return prompt
