"""Which documents a dump reads, and how it groups them: the plan, before any teacher row.

A worker's writers were each dealt their documents in corpus order (:mod:`distill.corpus.shares`);
a writer resumes after its stored documents and the skips among them, and passes over every
document its skip list names, so what a run reads does not depend on where an earlier one stopped
(:meth:`Skipper.remaining`). Each document left is encoded, or skipped and listed
(:meth:`Skipper.encode`); encoded documents are planned by the teacher's reader (their teacher
windows and stream layout: :class:`distill.teacher.reader.TeacherReader`) and gathered into groups
of about ``group_tokens`` tokens (:func:`plan_groups`), which the teacher pass orders by length. A
planned document is immutable: the values converted from its rows are the conversion sink's.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from common.errors import UserError
from distill.dump import memory as dump_memory
from distill.teacher.encode import DocumentEncoder, UnencodableDocument
from distill.teacher.reader import PlannedDocument, TeacherReader
from logit_store.file_names import SKIP_LIST
from logit_store.skips import Skip, SkipList


class Skipper:
    """This worker's skip lists (one per writer): where each writer resumes, and encoding a document
    or skipping it. A document the teacher cannot encode (or longer than --max-document-bytes) is
    recorded in its writer's skip list, or, with --strict, refused; with --strict a store whose
    lists already name documents is refused."""

    def __init__(
        self,
        output: str,
        writers: list[int],
        *,
        strict: bool,
        max_document_bytes: int | None,
        budget: dump_memory.DocumentBudget | None = None,
    ):
        self._lists = {w: SkipList(Path(output), w) for w in writers}
        self._strict, self._limit, self._budget = strict, max_document_bytes, budget
        self.skipped_now = 0  # documents this run skipped
        listed = sum(len(skips.skips) for skips in self._lists.values())
        if strict and listed:
            raise UserError(
                f"--strict: the store {output} already lists {listed} skipped documents ({SKIP_LIST.shown}); "
                "resume it without --strict"
            )

    def remaining(
        self, documents: Iterable[tuple[str, bytes, int]], stored: dict[int, int]
    ) -> Iterator[tuple[int, str, bytes, int]]:
        """The ``(key, data, writer)`` documents that writer ``w`` has not yet done: past its first
        ``stored[w]`` stored documents and the skips among them, and minus those its list names;
        each as ``(number in its writer, key, data, writer)``."""
        resume = {w: self._lists[w].resume_ordinal(n) for w, n in stored.items()}
        known = {w: skips.indices for w, skips in self._lists.items()}  # as listed before this run
        return _past(documents, resume, known)

    def encode(self, encoder, index: int, key: str, data: bytes, writer: int):
        """The document's teacher ids (a :class:`DocumentEncoder`'s), or a conversation
        (a :class:`distill.teacher.chat.ChatEncoder`'s), or None when it is skipped (and listed)."""
        try:
            if self._limit is not None and len(data) > self._limit:
                raise UnencodableDocument(f"{len(data):,} bytes, more than --max-document-bytes {self._limit:,}")
            self._refuse_too_long(key, len(data))  # before encoding it: its tokens guessed from its bytes
            ids = encoder.encode(data)
            self._refuse_too_long(key, len(data), len(ids))
            return ids
        except UnencodableDocument as exc:
            if self._strict:
                raise UserError(f"document {key}: {exc} (without --strict it is skipped and listed)") from None
            self._lists[writer].add(Skip(index, key, str(exc)))
            self.skipped_now += 1
            return None

    def _refuse_too_long(self, key: str, data_bytes: int, tokens: int | None = None) -> None:
        """A document whose values could not wait in the memory left is refused (not skipped:
        the user chooses --max-document-bytes, which skips and lists it)."""
        problem = self._budget.refusal(key, data_bytes, tokens) if self._budget is not None else None
        if problem:
            raise UserError(problem)

    def skips(self) -> list[Skip]:
        """Every skip of these writers, this run's and earlier: writer by writer, by number."""
        return [s for _, skips in sorted(self._lists.items()) for s in sorted(skips.skips, key=lambda s: s.index)]

    def close(self) -> None:
        for skips in self._lists.values():
            skips.close()


def _past(
    documents: Iterable[tuple[str, bytes, int]], resume: dict[int, int], known: dict[int, frozenset[int]]
) -> Iterator[tuple[int, str, bytes, int]]:
    seen = dict.fromkeys(resume, 0)
    for key, data, writer in documents:
        seen[writer] += 1
        number = seen[writer] - 1
        if number >= resume[writer] and number not in known[writer]:
            yield number, key, data, writer


def plan_groups(
    documents: Iterable[tuple[int, str, bytes, int]],
    skipper: Skipper,
    encoder: DocumentEncoder,
    reader: TeacherReader,
    group_tokens: int,
) -> Iterator[tuple[PlannedDocument, ...]]:
    """The encoded documents, each planned by the teacher's reader (its windows, its layout in the
    store's stream), in groups of at least ``group_tokens`` tokens (the last may be smaller); a
    document longer than a group is named on stderr with the memory it holds."""
    group: list[PlannedDocument] = []
    tokens = 0
    for index, key, data, writer in documents:
        encoded = skipper.encode(encoder, index, key, data, writer)
        if encoded is None:
            continue
        planned = reader.document(encoded, index=index, key=key, data=data, writer_id=writer)
        ids = planned.token_ids
        if len(ids) > group_tokens:
            extra = dump_memory.long_document_bytes(len(ids), group_tokens, reader.stream)
            print(
                f"dump memory: {key} has {len(ids):,} tokens, {extra / 1e9:.2f} GB more until written", file=sys.stderr
            )
        group.append(planned)
        tokens += len(ids) + reader.prefix_length
        if tokens >= group_tokens:
            yield tuple(group)
            group, tokens = [], 0
    if group:
        yield tuple(group)
