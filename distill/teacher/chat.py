"""Conversations as teacher documents: rendered by the teacher's chat template, read as the teacher
reads them, with each byte's speaker (docs/DESIGN.md, "Conversations").

A conversation is a list of messages ``{"role": "system" | "user" | "assistant", "content": text}``;
in a corpus it travels as the UTF-8 JSON object ``{"messages": [...]}`` (:func:`distill.corpus.conversations.conversation_document`).
:class:`ChatEncoder` turns one into a :class:`ChatDocument`:

- the rendering is the template's text for the whole conversation; messages 1..k render to a prefix
  of messages 1..k+1 (else the template is not prefix-stable and the conversation is refused), so
  message k owns what its rendering adds. Rendered once more with a probe in place of its content,
  that growth splits into the template's header, the content, and the template's footer;
- the specials the template writes (outside every content) are split out and become their ids;
  every piece of text between them is tokenised as text (a special's text inside a message is
  text), the first piece as a document starts (after the dummy prefix space, if the teacher adds
  one), the others as text after a special. A leading special that is the teacher's context prefix
  (its BOS) is context, and a trailing end-of-text special is the stream's ``<eos>``;
- roles are byte offsets in the rendering: a message's content has its role (1 system, 2 user,
  3 assistant); an assistant message's role also covers the special that opens its footer (its
  end of turn, so a student learns to stop); all else (headers, the template's text) is 0.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bytestream.stream_kind import StreamKind
from common.errors import UserError
from distill.teacher.encode import DocumentEncoder, UnencodableDocument
from distill.teacher.template_budget import TemplateTooCostly, render_template

ROLES = {"system": 1, "user": 2, "assistant": 3}  # 0: the template's own text
TEMPLATE_ROLE = 0
PROBE = "bytedistill0probe0content"  # stands for a message's content; no template trims or escapes it


class MalformedConversation(UnencodableDocument):
    """A conversation that cannot be rendered exactly: skipped and listed, or refused with --strict."""


def parse_conversation(data: bytes) -> list[dict]:
    """The messages of a conversation's corpus form, each checked: a role among system, user and
    assistant, and content that is text."""
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        raise MalformedConversation("not a conversation (its JSON does not parse)") from None
    messages = record.get("messages") if isinstance(record, dict) else None
    if not isinstance(messages, list) or not messages:
        raise MalformedConversation("a conversation needs a non-empty list of messages")
    for k, message in enumerate(messages, 1):
        if not isinstance(message, dict) or "role" not in message:
            raise MalformedConversation(f"message {k} has no role")
        role, content = message["role"], message.get("content")
        if role not in ROLES:
            raise MalformedConversation(f"message {k} has the role {role!r}, not system, user or assistant")
        if not isinstance(content, str):
            raise MalformedConversation(f"message {k}'s content is {type(content).__name__}, not text")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


@dataclass(frozen=True)
class ChatTemplate:
    """A Jinja chat template and the special-token texts it is given."""

    source: str
    bos_token: str | None = None
    eos_token: str | None = None

    @property
    def sha256(self) -> str:
        """What the template is (a store of conversations records it: another template, another store)."""
        return hashlib.sha256(self.source.encode("utf-8")).hexdigest()

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """The template's text for ``messages``, rendered as ``transformers`` renders it, within a
        render's budget (:mod:`distill.teacher.template_budget`: past it, :class:`TemplateTooCostly`)."""
        try:
            return render_template(
                self.source,
                messages=messages,
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        except TemplateTooCostly:
            raise
        except Exception as exc:  # noqa: BLE001 - a template raises what it likes (raise_exception, jinja errors)
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise MalformedConversation(f"the chat template refuses it: {reason}") from None


def load_chat_template(tokenizer, template_file: str | None) -> ChatTemplate:
    """The teacher's chat template: ``template_file`` (a Jinja text file), else the tokenizer's own
    (a folder's ``tokenizer_config.json``, a GGUF's ``tokenizer.chat_template``)."""
    if template_file is not None:
        path = Path(template_file)
        if not path.is_file():
            raise UserError(f"--chat-template {template_file}: no such file")
        source = path.read_text(encoding="utf-8")
    else:
        source = getattr(tokenizer, "chat_template", None)
        if isinstance(source, dict):  # several named templates: the default one
            source = source.get("default")
        if not isinstance(source, str) or not source.strip():
            raise UserError("the teacher's tokenizer has no chat template: give one with --chat-template FILE")
    return ChatTemplate(source, getattr(tokenizer, "bos_token", None), getattr(tokenizer, "eos_token", None))


def special_texts(tokenizer, vocab) -> dict[str, int]:
    """Every special id of the vocabulary that has a text, by its text."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    special = set(vocab.special_ids)
    spec = json.loads(backend.to_str())
    texts = {token["content"]: token["id"] for token in spec.get("added_tokens", []) if token["id"] in special}
    return {text: i for text, i in texts.items() if text}


def probe_conversations() -> list[list[dict]]:
    """Conversations with probe contents that show which specials a template writes: with a system
    prompt and two exchanges, and without the system prompt (a template may refuse one)."""
    exchange = [{"role": "user", "content": PROBE}, {"role": "assistant", "content": PROBE}]
    return [[{"role": "system", "content": PROBE}, *exchange, *exchange], [*exchange, *exchange]]


@dataclass(frozen=True)
class ChatDocument:
    """A rendered conversation as the teacher reads it."""

    token_ids: np.ndarray  # (m,) int64: regular ids and kept specials (no context prefix, no final <eos>)
    text: bytes  # the rendering, less the context prefix and the final end-of-text special's text
    role_starts: np.ndarray  # (R,) int64: byte offsets in ``text`` where a run of one role starts (0 first)
    role_values: np.ndarray  # (R,) uint8: each run's role
    special_lengths: np.ndarray  # (specials in token_ids,) int64: their texts' UTF-8 lengths, in order

    def __len__(self) -> int:
        return len(self.token_ids)

    def byte_roles(self) -> np.ndarray:
        """(len(text),) uint8: the role of every byte of the rendering."""
        runs = np.diff(np.append(self.role_starts, len(self.text)))
        return np.repeat(self.role_values, runs).astype(np.uint8)

    def target_roles(self, symbols: np.ndarray, stream: StreamKind) -> np.ndarray:
        """(L − 1,) uint8: the role of each target of the stream ``symbols`` (target i is symbol
        i + 1): a text byte's or a special's is the role of its first byte in the rendering, an
        ``<eot>``'s that of the byte before it (the token it closes), the final ``<eos>``'s 0."""
        targets = np.asarray(symbols[1:], dtype=np.int64)
        text = targets < stream.text_symbols
        special = targets >= stream.alphabet_size
        advance = text.astype(np.int64)
        advance[special] = self.special_lengths
        start = np.cumsum(advance) - advance
        roles = np.append(self.byte_roles(), np.uint8(TEMPLATE_ROLE))  # a sentinel past the end
        out = np.zeros(len(targets), np.uint8)
        out[text | special] = roles[start[text | special]]
        if stream.eot is not None:
            closes = targets == stream.eot
            out[closes] = roles[np.maximum(start[closes] - 1, 0)]
        return out


class ChatEncoder:
    """Renders conversations with the teacher's chat template into teacher ids (regular tokens and
    the kept specials) and roles. ``encoder`` is the teacher's document encoder over the chat
    vocabulary (whose ``kept_ids`` are the reserved symbols). A conversation of more than
    ``max_messages`` messages is refused before it is rendered (each of its prefixes would be)."""

    def __init__(
        self,
        template: ChatTemplate,
        encoder: DocumentEncoder,
        specials: dict[str, int],
        max_messages: int | None = None,
    ):
        self.template, self.encoder, self.vocab = template, encoder, encoder.vocab
        self.max_messages = max_messages  # longer conversations are refused (each prefix is rendered)
        self.specials = specials
        self.ids_special = {i: text for text, i in specials.items()}
        longest_first = sorted(specials, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, longest_first))) if longest_first else None
        self.prefix_text = "".join(self.ids_special.get(i, "\0") for i in self.vocab.prefix_ids)

    def settings(self) -> dict:
        """What a chat store records of its rendering (its settings; an export ships them): the
        template, the special-token texts it was given, and the context prefix's text (what the
        teacher reads before every document, stripped where the template writes it first), and the
        texts of the reserved symbols that end a turn (:meth:`end_of_turn_texts`)."""
        tokens = {"bos_token": self.template.bos_token or "", "eos_token": self.template.eos_token or ""}
        settings = {
            "chat_template": self.template.source,
            "chat_template_tokens": tokens,
            "chat_prefix": self.prefix_text,
        }
        ends = self.end_of_turn_texts()
        return settings | ({"end_of_turn": ends} if ends is not None else {})

    def end_of_turn_texts(self) -> list[str] | None:
        """The texts of the kept specials that end an assistant turn (:meth:`end_of_turn_ids`): the one
        rule the dump, on-policy training, the export and the shipped tokenizer follow; None where the
        template renders no probe turn."""
        try:
            ends = self.end_of_turn_ids()
        except MalformedConversation:
            return None
        kept = set(self.vocab.kept_ids)
        return [self.ids_special[i] for i in ends if i in kept and i in self.ids_special]

    def template_specials(self) -> list[int]:
        """The special ids the template writes in the probe conversations, outside the context
        prefix and a final end of text: the ones a chat store keeps, by id."""
        found: set[int] = set()
        rendered_any = False
        for messages in probe_conversations():
            try:
                text = self.template.render(messages)
            except MalformedConversation:
                continue
            rendered_any = True
            start, stop = self._inner_span(text)
            found |= {self.specials[m.group()] for m in self._matches(text) if start <= m.start() and m.end() <= stop}
        if not rendered_any:
            raise UserError("the chat template renders none of the probe conversations (user, assistant, …)")
        return sorted(found)

    def encode(self, data: bytes) -> ChatDocument:
        """The conversation ``data`` (its corpus form) as the teacher reads it."""
        messages = parse_conversation(data)
        try:
            text, contents = self.render_spans(messages)
        except TemplateTooCostly as exc:  # this conversation's: the probes rendered within the budget
            raise MalformedConversation(str(exc)) from None
        start, stop = self._inner_span(text)
        return self._document(text, contents, start, stop)

    def prompt_ids(self, messages: list[dict]) -> np.ndarray:
        """The ids of a conversation rendered with the template's generation prompt (what the
        teacher answers), read as :meth:`encode` reads a conversation."""
        text, spans = self.render_spans(messages)
        prompted = self.template.render(messages, add_generation_prompt=True)
        if not prompted.startswith(text):
            raise MalformedConversation("the chat template's generation prompt changes the conversation before it")
        start, _ = self._inner_span(prompted)
        return self._document(prompted, spans, start, len(prompted)).token_ids

    def end_of_turn_ids(self) -> list[int]:
        """The specials that end an assistant turn: the one that opens an assistant message's footer
        in the template's rendering (if it writes one), then the end-of-text ids."""
        probe = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        text, spans = self.render_spans(probe)
        _, end, covered, _ = spans[-1]
        found = [self.specials[text[end:covered]]] if covered > end else []
        return found + [i for i in self.vocab.end_of_text_ids if i not in found]

    def render_spans(self, messages: list[dict]) -> tuple[str, list[tuple[int, int, int, int]]]:
        """The rendering and, per message, (content start, content end, end of what its role
        covers, role), in characters."""
        if self.max_messages is not None and len(messages) > self.max_messages:
            raise MalformedConversation(
                f"{len(messages):,} messages, more than --max-messages {self.max_messages:,} (each prefix is rendered)"
            )
        previous, spans = "", []
        for k, message in enumerate(messages, 1):
            full = self.template.render(messages[:k])
            if not full.startswith(previous):
                raise MalformedConversation(
                    f"the chat template is not prefix-stable: message {k} changes how messages 1..{k - 1} render"
                )
            probe = self.template.render([*messages[: k - 1], {"role": message["role"], "content": PROBE}])
            if not probe.startswith(previous) or probe.count(PROBE) != 1:
                raise MalformedConversation(f"the chat template does not render message {k}'s content once, as given")
            at = probe.index(PROBE)
            header, footer = probe[len(previous) : at], probe[at + len(PROBE) :]
            grown = full[len(previous) :]
            if not (grown.startswith(header) and grown.endswith(footer) and len(grown) >= len(header) + len(footer)):
                raise MalformedConversation(f"the chat template renders message {k}'s header or footer by its content")
            begin, end = len(previous) + len(header), len(full) - len(footer)
            covered = end
            if message["role"] == "assistant" and self._pattern is not None:
                closing = self._pattern.match(full, end)  # the special that ends the turn
                if closing is not None:
                    covered = closing.end()
            spans.append((begin, end, covered, ROLES[message["role"]]))
            previous = full
        return previous, spans

    def _matches(self, text: str):
        return [] if self._pattern is None else list(self._pattern.finditer(text))

    def _inner_span(self, text: str) -> tuple[int, int]:
        """The rendering without a leading context prefix (the teacher's BOS, read before every
        document) and a trailing end-of-text special (the stream's own <eos>), in characters."""
        start = len(self.prefix_text) if self.prefix_text and text.startswith(self.prefix_text) else 0
        stop = len(text)
        for text_of in (self.ids_special.get(i) for i in self.vocab.end_of_text_ids):
            if text_of and text.endswith(text_of) and stop - len(text_of) >= start:
                stop = len(text) - len(text_of)
                break
        return start, stop

    def _document(self, text: str, spans, start: int, stop: int) -> ChatDocument:
        kept = set(self.vocab.kept_ids)
        inside = [(b, e) for b, e, _, _ in spans]
        pieces: list[tuple[bool, str]] = []  # (is a special, text)
        at = start
        for match in self._matches(text):
            if match.start() < start or match.end() > stop or any(b <= match.start() < e for b, e in inside):
                continue  # context, the final <eos>, or a special's text inside a message: text
            token = self.specials[match.group()]
            if token not in kept:
                raise MalformedConversation(
                    f"the chat template writes {match.group()!r} inside the conversation, which is not a "
                    "reserved symbol of this store"
                )
            if match.start() > at:
                pieces.append((False, text[at : match.start()]))
            pieces.append((True, match.group()))
            at = match.end()
        if at < stop:
            pieces.append((False, text[at:stop]))
        ids, lengths = [], []
        for n, (is_special, piece) in enumerate(pieces):
            if is_special:
                ids.append(np.array([self.specials[piece]], np.int64))
                lengths.append(len(piece.encode("utf-8")))
            else:
                ids.append(self.encoder.encode_part(piece.encode("utf-8"), first=n == 0))
        document = text[start:stop].encode("utf-8")
        starts, values = _role_runs(text, spans, start, stop)
        return ChatDocument(
            token_ids=np.concatenate(ids) if ids else np.zeros(0, np.int64),
            text=document,
            role_starts=starts,
            role_values=values,
            special_lengths=np.asarray(lengths, np.int64),
        )


def _role_runs(text: str, spans, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """Runs of one role over the UTF-8 bytes of ``text[start:stop]``: (run starts, roles)."""

    def offset(char: int) -> int:
        char = min(max(char, start), stop)
        return len(text[start:char].encode("utf-8"))

    bounds: list[tuple[int, int]] = [(0, TEMPLATE_ROLE)]
    for begin, _, covered, role in spans:
        b, e = offset(begin), offset(covered)
        if e > b:
            bounds += [(b, role), (e, TEMPLATE_ROLE)]
    starts, values = [], []
    for at, role in bounds:
        if starts and starts[-1] == at:
            values[-1] = role
        elif not values or values[-1] != role:
            starts.append(at)
            values.append(role)
    return np.asarray(starts, np.int64), np.asarray(values, np.uint8)


def chat_encoder(tokenizer, vocab, template_file: str | None = None, max_messages: int | None = None) -> ChatEncoder:
    """The chat encoder of a teacher: its template (or ``template_file``), and its vocabulary with
    the specials the template writes kept (:meth:`bytestream.vocab.TeacherVocab.with_kept`);
    conversations of more than ``max_messages`` messages refused."""
    template = load_chat_template(tokenizer, template_file)
    specials = special_texts(tokenizer, vocab)
    kept = ChatEncoder(template, DocumentEncoder(tokenizer, vocab), specials).template_specials()
    chat_vocab = vocab.with_kept(kept)
    return ChatEncoder(template, DocumentEncoder(tokenizer, chat_vocab), specials, max_messages)


def reserved_symbols(encoder: ChatEncoder) -> list[dict]:
    """The manifest's reserved symbols: each kept special's text and teacher id, in symbol order."""
    return [{"text": encoder.ids_special[i], "teacher_id": int(i)} for i in encoder.vocab.kept_ids]
