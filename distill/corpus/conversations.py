"""Records that hold conversations (docs/DESIGN.md, "Conversations"): which fields a corpus record's
conversation is read from, and the conversation as a document.

A record holds either a list of messages (``{"role", "content"}``; the ``messages`` field by
default) or a prompt and, optionally, its answer (``prompt_field``, ``answer_field``): the pair is
the conversation ``[user: prompt, assistant: answer]``, or ``[user: prompt]`` when the answer is
missing or empty (the teacher writes it: ``dump --respond``). The document is the conversation in
its corpus form, ``{"messages": [...]}`` as UTF-8 JSON; what the messages hold is checked when the
document is encoded (a malformed one is skipped and listed, like any document the teacher cannot
encode).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from common.errors import UserError

DEFAULT_MESSAGES_FIELD = "messages"
DEFAULT_ANSWER_FIELD = "response"


@dataclass(frozen=True)
class ConversationFields:
    """Where a record's conversation is: its ``messages`` field, or its ``prompt`` field (and
    ``answer``) when a prompt field is named (the ``dump --chat`` flags ``--messages-field``,
    ``--prompt-field`` and ``--answer-field``)."""

    messages: str = field(
        default=DEFAULT_MESSAGES_FIELD,
        metadata={
            "flag": "messages_field",
            "help": "with --chat: record field holding a conversation's messages (a list of {role, content})",
        },
    )
    prompt: str | None = field(
        default=None,
        metadata={
            "flag": "prompt_field",
            "help": "with --chat: read prompt/answer pairs instead, the prompt from this field",
        },
    )
    answer: str = field(
        default=DEFAULT_ANSWER_FIELD,
        metadata={
            "flag": "answer_field",
            "help": "with --prompt-field: the field holding the answer (missing or empty: --respond writes it)",
        },
    )

    def columns(self) -> list[str]:
        """The fields a record's conversation is read from (a parquet file's columns)."""
        return [self.prompt, self.answer] if self.prompt else [self.messages]

    def document(self, record: dict, where: str) -> bytes:
        """The conversation of one record in its corpus form."""
        if self.prompt is None:
            if self.messages not in record:
                raise UserError(
                    f"{where}: no field {self.messages!r} (fields: {', '.join(sorted(record)) or 'none'}); "
                    "use --messages-field, or --prompt-field for prompt/answer pairs"
                )
            messages = record[self.messages]
            if isinstance(messages, str):  # a column of JSON text
                try:
                    messages = json.loads(messages)
                except ValueError:
                    messages = None
            if not isinstance(messages, list):
                messages = [] if messages is None else messages  # refused by the encoder, naming the document
            return conversation_document(messages)
        if self.prompt not in record:
            raise UserError(
                f"{where}: no field {self.prompt!r} (fields: {', '.join(sorted(record)) or 'none'}); use --prompt-field"
            )
        messages = [{"role": "user", "content": record[self.prompt]}]
        answer = record.get(self.answer)
        if answer not in (None, ""):
            messages.append({"role": "assistant", "content": answer})
        return conversation_document(messages)


def conversation_document(messages) -> bytes:
    """A conversation's corpus form: ``{"messages": [...]}`` as compact UTF-8 JSON."""
    try:
        return json.dumps({"messages": messages}, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError):
        return b'{"messages": null}'  # not JSON data: refused when it is encoded
    except UnicodeEncodeError:  # a lone surrogate
        return b'{"messages": null}'
