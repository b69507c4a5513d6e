"""The teacher that scores what the student writes: the training stores' own teacher, loaded in the
training process, reading each text exactly as ``dump`` reads a document.

:func:`refuse_other_teacher` compares a ``--teacher`` with the teacher the store's manifest records
(its weights, before anything loads; then its vocabulary, context prefix and end-of-text ids) and
refuses another one in one line. :class:`ScoringTeacher` turns texts into the teacher's exact
next-symbol distributions over the store's stream with the dump's own reader
(:class:`distill.teacher.reader.TeacherReader`): the teacher's encoder
(:class:`distill.teacher.encode.DocumentEncoder`), the reading the dump recorded in the store's
manifest (its stream and teacher windows: :meth:`distill.teacher.windows.Reading.of_manifest`), the
reader's batches and head chunks and the conversion (Numba on the CPU, the reader's device path
next to a GPU teacher). For a store of conversations the teacher reads with the store's reserved
symbols kept (its vocabulary as ``dump --chat`` made it) and its chat template (recorded in the
manifest), and a text comes in pieces: text read as ``dump --chat`` reads the text between two
specials, and specials as their ids.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from bytestream.stream_kind import StreamKind
from bytestream.vocab import split_gguf_path
from common.errors import UserError
from distill.conversion.converter import DocumentDistributions
from distill.teacher.chat import ChatEncoder, ChatTemplate, special_texts
from distill.teacher.encode import DocumentEncoder, UnencodableDocument
from distill.teacher.identity import hub_revision, teacher_name, weights_hash
from distill.teacher.model import Teacher, load_teacher
from distill.teacher.reader import DocumentRows, TeacherReader
from distill.teacher.windows import Reading
from logit_store.manifest import read_manifest
from logit_store.teachers import described, different_teachers

HEAD_ROWS = 256  # teacher rows whose float32 logits exist at once
BATCH_WINDOWS = 8  # windows of the store's max_length per teacher batch


def refuse_other_teacher(source: str, store: str) -> dict:
    """The store's manifest, after refusing a ``--teacher`` whose weights are known to differ from
    the ones the store records (read from its files: nothing is loaded)."""
    manifest = read_manifest(Path(store))
    model_source, gguf = split_gguf_path(source, None)
    if not Path(model_source).exists() and model_source.startswith((".", "/")):
        raise UserError(f"--teacher {source}: not found")
    revision = None if Path(model_source).exists() else hub_revision(model_source, gguf or "config.json")
    given = {"teacher": teacher_name(source), "teacher_hash": weights_hash(model_source, gguf, revision)}
    if different_teachers(manifest, given):
        raise UserError(
            f"--teacher {source} ({described(given)}) is not the teacher the store {store} was dumped from "
            f"({described(manifest)}): on-policy answers are scored by the store's own teacher"
        )
    return manifest


def refuse_other_reading(teacher: Teacher, manifest: dict, store: str) -> None:
    """Refuse a loaded teacher that reads text otherwise than the store's did (another vocabulary,
    context prefix or end-of-text ids)."""
    settings = manifest.get("settings", {})
    found = []
    if teacher.vocab.hash != manifest.get("vocab_hash"):
        found.append("vocabulary")
    if settings.get("context_prefix") not in (None, teacher.context_prefix):
        found.append(f"context prefix {teacher.context_prefix} (the store's: {settings['context_prefix']})")
    if settings.get("end_of_text_ids") not in (None, list(teacher.vocab.end_of_text_ids)):
        found.append("end-of-text ids")
    if found:
        raise UserError(
            f"--teacher {teacher.name} is not the teacher the store {store} was dumped from "
            f"(its {', '.join(found)} differ): on-policy answers are scored by the store's own teacher"
        )


def with_chat(teacher: Teacher, manifest: dict, store: str) -> tuple[Teacher, ChatEncoder]:
    """A teacher reading as ``dump --chat`` read the store of conversations ``manifest`` describes:
    the store's reserved symbols kept in its vocabulary, its chat template for the end of a turn."""
    settings = manifest.get("settings", {})
    kept = [int(entry["teacher_id"]) for entry in manifest["reserved_symbols"]]
    specials = special_texts(teacher.tokenizer, teacher.vocab)
    vocab = teacher.vocab.with_kept(kept) if all(i in teacher.vocab.special_ids for i in kept) else None
    if vocab is None or list(vocab.kept_ids) != kept or "chat_template" not in settings:
        raise UserError(
            f"--teacher {teacher.name} cannot read the store {store}'s conversations as it was dumped "
            "(its reserved symbols are not the teacher's specials): on-policy answers are scored by the "
            "store's own teacher"
        )
    tokens = settings.get("chat_template_tokens") or {}
    template = ChatTemplate(settings["chat_template"], tokens.get("bos_token") or None, tokens.get("eos_token") or None)
    return replace(teacher, vocab=vocab), ChatEncoder(template, DocumentEncoder(teacher.tokenizer, vocab), specials)


@dataclass
class ScoreTimes:
    """Seconds spent, and the work done, since the last :meth:`ScoringTeacher.take_times`."""

    forward_seconds: float = 0.0  # the teacher's trunk and head
    conversion_seconds: float = 0.0
    tokens: int = 0  # teacher inputs run (context prefix included)
    rows: int = 0  # teacher rows converted


class ScoringTeacher:
    """A loaded teacher that converts texts into the store's stream exactly as ``dump`` would."""

    def __init__(
        self,
        teacher: Teacher,
        reading: Reading,
        on_device: bool | None = None,
        chat: ChatEncoder | None = None,
    ):
        """``reading``: the store's (its stream and windows). ``on_device``: convert with the torch
        path on the teacher's device (default: on a GPU; on the CPU it is how the tests run that path,
        as ``dump --conversion torch`` does). ``chat``: the chat encoder of a store of conversations
        (``teacher``'s vocabulary is then its)."""
        self.reader = TeacherReader.of(teacher, reading)
        self.converter, self.teacher = self.reader.converter, self.reader.teacher
        self.chat = chat
        self.encoder = chat.encoder if chat is not None else DocumentEncoder(teacher.tokenizer, teacher.vocab)
        self.on_device = self.teacher.device.type == "cuda" if on_device is None else on_device
        self.times = ScoreTimes()
        if self.on_device:
            self.reader.prepare_device_conversion()

    @property
    def reading(self) -> Reading:
        return self.reader.reading

    @property
    def stream(self) -> StreamKind:
        return self.reader.stream

    @classmethod
    def load(cls, source: str, store: str, device: torch.device, on_device: bool | None = None) -> ScoringTeacher:
        """``source`` checked against ``store``'s teacher, loaded on ``device`` (bfloat16 on a GPU,
        float32 on the CPU), reading as the store's manifest records its dump read."""
        manifest = refuse_other_teacher(source, store)
        teacher = load_teacher(source, device=device)
        chat = None
        if manifest.get("reserved_symbols"):
            teacher, chat = with_chat(teacher, manifest, store)
        refuse_other_reading(teacher, manifest, store)
        return cls(teacher, Reading.of_manifest(manifest), on_device, chat)

    def encode(self, text: bytes) -> np.ndarray | None:
        """The teacher's ids of ``text`` as ``dump`` encodes a document; None when it cannot be
        encoded exactly (a byte without a token, a lossy normalizer)."""
        return self.encode_pieces([text] if text else [])

    def encode_pieces(self, pieces: list[bytes | int]) -> np.ndarray | None:
        """The teacher's ids of a document given as pieces, as ``dump --chat`` encodes a rendered
        conversation: text pieces (the first as a document starts, the others as text after a
        special) and specials (ints: their teacher ids); None when a piece cannot be encoded exactly."""
        ids = []
        try:
            for n, piece in enumerate(pieces):
                if isinstance(piece, bytes):
                    ids.append(self.encoder.encode_part(piece, first=n == 0))
                else:
                    ids.append(np.array([piece], dtype=np.int64))
        except UnencodableDocument:
            return None
        return np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)

    def reserved_ids(self) -> tuple[int, ...]:
        """The teacher ids of the store's reserved symbols, in symbol order (none for plain text)."""
        return self.teacher.vocab.kept_ids

    def special_text(self, teacher_id: int) -> str:
        """A special's text (a store of conversations' reserved symbol), as the template writes it."""
        return self.chat.ids_special[teacher_id] if self.chat is not None else f"<special {teacher_id}>"

    def turn_end_symbols(self) -> tuple[int, ...]:
        """The reserved symbols that end an assistant turn (the template's end of turn; none for
        plain text): with ``<eos>``, where the student's answer stops."""
        if self.chat is None:
            return ()
        kept = list(self.reserved_ids())
        ends = [i for i in self.chat.end_of_turn_ids() if i in kept]
        return tuple(self.stream.alphabet_size + kept.index(i) for i in ends)

    def absent_bytes(self) -> list[int]:
        """The bytes no token of the teacher holds: the teacher gives them probability 0 in every context."""
        present = set()
        for token in self.teacher.vocab.token_bytes:
            present.update(token)
        return sorted(set(range(256)) - present)

    def layout(self, token_ids: np.ndarray):
        return self.reader.layout(token_ids)

    def score(self, texts: list[bytes], token_ids: list[np.ndarray]) -> list[DocumentDistributions]:
        """The teacher's distributions at every stream position of each text (its ids given)."""
        docs = tuple(
            self.reader.document(ids, index=i, key=f"text-{i}", data=text)
            for i, (text, ids) in enumerate(zip(texts, token_ids, strict=True))
        )
        values = [np.empty(doc.layout.num_values, dtype=np.float64) for doc in docs]
        dropped = [np.empty(doc.rows, dtype=np.float64) for doc in docs]
        prefix = self.reader.prefix_length
        for batch in self.reader.batches(docs, BATCH_WINDOWS * self.reading.max_length):
            self.times.tokens += sum(window.input_length(prefix) for _, window in batch)
            chunks = self.reader.rows(batch, HEAD_ROWS)
            while True:
                started = time.perf_counter()
                chunk = next(chunks, None)
                self._synchronize()
                self.times.forward_seconds += time.perf_counter() - started
                if chunk is None:
                    break
                started = time.perf_counter()
                self._convert(chunk, values, dropped)
                self.times.conversion_seconds += time.perf_counter() - started
                self.times.rows += len(chunk.logits.tensor)
        return [DocumentDistributions(doc.layout, values[i], dropped[i]) for i, doc in enumerate(docs)]

    def _convert(self, chunk: DocumentRows, values: list[np.ndarray], dropped: list[np.ndarray]) -> None:
        """One head chunk's rows into each document's values, as the dump's sink fills them."""
        if not self.on_device:
            rows = chunk.logits.tensor.cpu().numpy()
            for span in chunk.spans:
                doc = span.document
                self.converter.convert_rows_numba(
                    doc.layout,
                    doc.token_ids,
                    rows[span.start : span.stop],
                    span.first_row,
                    values[doc.index],
                    dropped[doc.index],
                    chunk.logits.columns,
                )
            return
        for span, got, mass in self.reader.convert_on_device(chunk):
            doc = span.document
            values[doc.index][doc.positions_of(span.first_row, len(mass))] = got
            dropped[doc.index][span.first_row : span.first_row + len(mass)] = mass

    def _synchronize(self) -> None:
        if self.teacher.device.type == "cuda":
            torch.cuda.synchronize(self.teacher.device)

    def take_times(self) -> ScoreTimes:
        times, self.times = self.times, ScoreTimes()
        return times

    def trunk_flops_per_token(self) -> float:
        """Matrix-product FLOPs of one teacher input through the trunk (2 × its weights; embeddings
        are lookups, attention's own products left out)."""
        model = self.teacher.model
        weights = sum(p.numel() for p in model.base_model.parameters())
        return 2.0 * (weights - model.get_input_embeddings().weight.numel())

    def head_flops_per_row(self) -> float:
        """The float32 output layer's FLOPs per teacher row."""
        return 2.0 * self.teacher.head.weight.numel()

    def conversion_flops_per_row(self) -> float:
        """The conversion's arithmetic per teacher row: an exponential and an addition per vocabulary
        entry (the range sums), the gathers along a token's bytes left out."""
        return 2.0 * self.teacher.vocab.size
