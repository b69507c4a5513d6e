"""``bytedistill chat``: the command line over a :class:`students.release.chat.Conversation` whose answers
the decode engine generates (:func:`students.serving.offline.conversation`)."""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import UserError
from students.release.generate_options import GenerateOptions


@dataclass(kw_only=True)
class ChatConfig(GenerateOptions):
    """The library's options (their flags), the model and an optional system prompt."""

    model: str = field(metadata={"help": "exported chat student folder", "positional": True})
    system: str | None = field(default=None, metadata={"help": "a system prompt opening the conversation"})


def chat(config: ChatConfig) -> int:
    """Chat with an exported chat student in the terminal: each line read from standard input is a
    user turn (so it works piped, one turn a line; it must be UTF-8 text); the answer is written as
    it is generated, and the conversation so far is kept (past the trained context, the student reads
    its latest whole turns, a line on stderr saying how many it left out). An answer that runs out of
    --max-new-bytes before the student ends its turn is followed by a line on stderr saying so. An
    empty line is skipped; end of input ends the chat."""
    from bytedistill.generate import require_text
    from students.release.chat import require_chat
    from students.release.generate import load_folder
    from students.serving.offline import conversation as open_conversation

    if sys.stdin is None:  # started with its standard input closed (0<&-)
        raise UserError("standard input is closed: give the user's turns on it, one a line")
    system = None if config.system is None else require_text(config.system, "--system")
    model, tokenizer = load_folder(Path(config.model))
    require_chat(tokenizer, config.model)
    conversation = open_conversation(model, tokenizer, config)
    if system:
        conversation.messages.append({"role": "system", "content": system})
    interactive = sys.stdin.isatty()
    if interactive:
        print("a user turn a line; Ctrl-D ends the chat", file=sys.stderr)
    for number in itertools.count(1):
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = read_line(number)
        if line is None:
            return 0
        text = line.rstrip("\r\n")
        if not text.strip():
            continue
        left_out = conversation.left_out
        conversation.reply(text, write=_write)
        print(flush=True)
        if conversation.left_out > left_out:
            print(
                f"(the conversation is longer than the trained context: the student no longer reads its "
                f"{conversation.left_out} oldest messages)",
                file=sys.stderr,
            )
        if not conversation.ended:
            print(
                f"(the answer reached --max-new-bytes {config.max_new_bytes} before it ended its turn)", file=sys.stderr
            )


def read_line(number: int) -> str | None:
    """Standard input's next line (None at its end), read as bytes and refused in one line unless
    they are UTF-8 text (whatever the locale's encoding)."""
    source = getattr(sys.stdin, "buffer", sys.stdin)
    line = source.readline()
    if isinstance(line, str):  # a text stream without bytes beneath it
        return line or None
    if not line:
        return None
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"line {number} of standard input is not UTF-8 text (byte 0x{line[exc.start]:02x} at {exc.start})"
        ) from None


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
