"""Conversations with an exported chat student (``bytedistill chat``, ``bytedistill generate --chat``).

A chat student was distilled on conversations rendered by its teacher's chat template, the
teacher's chat specials being symbols of its own; its folder ships the template
(docs/DESIGN.md, "Conversations at inference"). A conversation so far (a list of ``{"role", "content"}``
messages) becomes the student's stream as its tokenizer's ``apply_chat_template`` makes it, with the
generation prompt (the assistant's header), the template rendered within the render budget
(docs/DESIGN.md, "The render budget"); the answer is generated until the student ends
its turn (its generation config's end-of-turn symbols), or the byte budget runs out; it is the
text bytes generated, the specials dropped. A conversation that outgrows the trained context is
read from its latest whole turns (:meth:`Conversation.stream`); past the context the window slides
as in :mod:`students.release.generate`.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bytestream.stream_kind import StreamKind
from bytestream.stream_tokenizer import ByteStreamTokenizer
from common.errors import UserError, first_line
from distill.teacher.template_budget import TemplateTooCostly, render_template
from students.release.generate import continue_streams, require_same_stream
from students.release.generate_options import GenerateOptions


def require_chat(tokenizer: ByteStreamTokenizer, folder: Path | str) -> None:
    """Refuse a student that was not distilled on conversations (no reserved symbols or no chat template)."""
    if not tokenizer.reserved_symbols or not tokenizer.chat_template:
        raise UserError(
            f"{folder} is not a chat student (it has no chat template): dump conversations with the teacher's "
            "chat template, train and export again, or use bytedistill generate without --chat"
        )


def chat_stream(tokenizer: ByteStreamTokenizer, messages: list[dict[str, str]]) -> list[int]:
    """The student's stream of a conversation so far, ending with the assistant's header: the
    folder's template rendered within a render's budget (:mod:`distill.teacher.template_budget`) with
    the texts its tokenizer's ``apply_chat_template`` gives it, then read as that method reads the
    rendering. A template that raises (its own refusal, as of a role it does not take, or the
    sandbox's) or goes past the budget is a :class:`UserError` in one line."""
    try:
        rendered = render_template(
            tokenizer.chat_template,
            messages=[dict(message) for message in messages],
            tools=None,
            documents=None,
            add_generation_prompt=True,
            **tokenizer.chat_template_variables(),
        )
        return tokenizer.encode_chat(rendered)
    except TemplateTooCostly:
        raise
    except Exception as exc:  # jinja2's errors, whatever the template's own code raises, the encoding's refusal
        raise UserError(
            f"the conversation does not render with the chat template: {type(exc).__name__}: {first_line(exc)}"
        ) from exc


def answers(
    model,
    tokenizer: ByteStreamTokenizer,
    conversations: list[list[dict[str, str]]],
    options: GenerateOptions,
    ended: list[bool] | None = None,
) -> list[str]:
    """The student's next turn in each conversation, generated together as one left-padded batch;
    ``ended``, a list, is given whether each answer ended the turn (rather than ran out of bytes)."""
    require_same_stream(model, tokenizer)
    streams = [chat_stream(tokenizer, messages) for messages in conversations]
    replies = continue_streams(model, streams, [b""] * len(streams), options, stopped=ended)
    return [reply.decode("utf-8", errors="replace") for reply in replies]


class TextStreamer:
    """A ``transformers`` streamer that writes the text of each symbol generated as it comes (the
    input of each generation call skipped; specials dropped; UTF-8 decoded across symbols)."""

    def __init__(self, write: Callable[[str], object], stream: StreamKind):
        self.write, self.stream = write, stream
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.prompt_next = True

    def put(self, value) -> None:
        if self.prompt_next:  # each generate call shows its input first
            self.prompt_next = False
            return
        text = self.decoder.decode(self.stream.text_bytes(value.reshape(-1).tolist()))
        if text:
            self.write(text)

    def end(self) -> None:
        self.prompt_next = True

    def finish(self) -> None:
        """Write what an unfinished character left (as U+FFFD)."""
        text = self.decoder.decode(b"", final=True)
        if text:
            self.write(text)
        self.decoder.reset()


@dataclass
class Conversation:
    """A conversation with a chat student: the messages so far (a system prompt first, if any)."""

    model: object
    tokenizer: ByteStreamTokenizer
    options: GenerateOptions
    messages: list[dict[str, str]] = field(default_factory=list)

    ended: bool = False  # whether the latest answer ended its turn (rather than ran out of bytes)
    left_out: int = 0  # the oldest turns (after a system prompt) the student no longer reads

    def reply(self, text: str, write: Callable[[str], object] | None = None) -> str:
        """The student's answer to the user's ``text``, given the conversation so far (:meth:`stream`);
        ``write`` is called with its text as it is generated. Both turns join the conversation
        (neither where the template refuses it: a :class:`UserError`)."""
        self.messages.append({"role": "user", "content": text})
        try:
            symbols = self.stream()
        except UserError:
            self.messages.pop()
            raise
        answer = self.answer_bytes(symbols, write)
        reply = answer.decode("utf-8", errors="replace")
        self.messages.append({"role": "assistant", "content": reply})
        return reply

    def stream(self) -> list[int]:
        """The stream the student reads for its next answer: the system prompt, if any, and the
        latest turns that leave room for the answer in the trained context (its byte budget, at most
        half the context). The oldest user turn and its answer are left out, a pair at a time, so
        that the student reads whole turns, the first a user's, from ``<bos>``, not a window cut
        inside a turn; the latest user turn always stays (past the context the window slides as in
        ``generate``)."""
        system = self.messages[:1] if self.messages and self.messages[0]["role"] == "system" else []
        turns = self.messages[len(system) :]
        context = self.model.config.max_position_embeddings
        room = min(context // 2, self.options.max_new_bytes)
        while True:
            symbols = chat_stream(self.tokenizer, system + turns[self.left_out :])
            if len(symbols) + room <= context or self.left_out + 2 >= len(turns):
                return symbols
            self.left_out += 2

    def answer_bytes(self, symbols: list[int], write: Callable[[str], object] | None) -> bytes:
        """The answer's bytes after the conversation's stream ``symbols`` (``write`` called with its
        text as it is generated), through the model's ``generate``; sets :attr:`ended`."""
        streamer = TextStreamer(write, StreamKind.of_config(self.model.config)) if write is not None else None
        stopped: list[bool] = []
        answer = continue_streams(self.model, [symbols], [b""], self.options, streamer=streamer, stopped=stopped)[0]
        if streamer is not None:
            streamer.finish()
        self.ended = stopped[0]
        return answer
