"""``bytedistill chat``: the command line over a :class:`students.release.chat.Conversation` whose answers
the decode engine generates (:func:`students.serving.offline.conversation`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from students.release.generate_options import GenerateOptions


@dataclass(kw_only=True)
class ChatConfig(GenerateOptions):
    """The library's options (their flags), the model and an optional system prompt."""

    model: str = field(metadata={"help": "exported chat student folder", "positional": True})
    system: str | None = field(default=None, metadata={"help": "a system prompt opening the conversation"})


def chat(config: ChatConfig) -> int:
    """Chat with an exported chat student in the terminal: each line read from standard input is a
    user turn (so it works piped, one turn a line); the answer is written as it is generated, and
    the conversation so far is kept. An empty line is skipped; end of input ends the chat."""
    from students.release.chat import require_chat
    from students.release.generate import load_folder
    from students.serving.offline import conversation as open_conversation

    model, tokenizer = load_folder(Path(config.model))
    require_chat(tokenizer, config.model)
    conversation = open_conversation(model, tokenizer, config)
    if config.system:
        conversation.messages.append({"role": "system", "content": config.system})
    interactive = sys.stdin.isatty()
    if interactive:
        print("a user turn a line; Ctrl-D ends the chat", file=sys.stderr)
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            return 0
        text = line.rstrip("\r\n")
        if not text.strip():
            continue
        conversation.reply(text, write=_write)
        print(flush=True)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
