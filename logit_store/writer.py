"""Writing a store (:class:`StoreWriter`): documents into shards of one writer id, atomically,
resumable (FORMAT.md, "Directory")."""

from __future__ import annotations

import json
import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import numpy as np

from bytestream.alphabet import EOT
from bytestream.stream import StreamLayout, log_likelihood, target_indices, target_values
from bytestream.stream_kind import StreamKind
from bytestream.trie import VocabTrie, build_trie
from common.errors import UserError
from logit_store.chunk import EncodedDocument
from logit_store.encodings import Encoding, get_encoding, kl_bits
from logit_store.file_names import MANIFEST, PARTIAL_SHARD, SHARD, VOCAB_FILE
from logit_store.identity import StoreIdentity
from logit_store.integrity import (
    Completion,
    check_sequence,
    check_writer,
    completion_path,
    read_completion,
    shard_sequences,
    write_completion,
)
from logit_store.manifest import (
    FORMAT_NAME,
    IDENTITY_FIELDS,
    identity_hash,
    manifest_stream,
    read_manifest,
    settings_hash,
    stream_fields,
    write_atomic,
)
from logit_store.ownership import check_store_files
from logit_store.shard import (
    CodedChunk,
    ShardFile,
    ShardReader,
    ShardRecord,
    fsync_directory,
)
from logit_store.source_record import keep_source_record
from logit_store.vocab_file import vocab_to_bytes

DECODE_RUN_VALUES = 1 << 20  # values decoded at a time to take what a reader gets (4 MiB of float32)
# float64 values of the documents handed to the encoder threads and not yet encoded, per thread (16 MiB),
# beyond the newest document: a longer one is encoded before the caller goes on, as with one thread
VALUES_IN_FLIGHT_PER_THREAD = 1 << 21


@dataclass(frozen=True)
class _Encoded:
    """A document as its encoder thread left it: stored form, the log-likelihood a reader gets and
    KL(exact || stored) summed over its positions."""

    document: EncodedDocument
    stored_log_likelihood: float
    kl_bits: float


@dataclass(frozen=True)
class PendingDocument:
    """A document the writer took, encoded on its threads; :meth:`stored_log_likelihood` waits for it."""

    encoded: Future

    def done(self) -> bool:
        return self.encoded.done()

    def stored_log_likelihood(self) -> float:
        """The document's log-likelihood under its values as a reader decodes them."""
        return self.encoded.result().stored_log_likelihood

    def kl_bits(self) -> float:
        """KL(exact || stored) in bits, summed over the document's positions."""
        return self.encoded.result().kl_bits


class _Jobs:
    """Runs the writer's encoding jobs: at once in the caller with one thread, else on a pool of
    ``threads``. The pool takes jobs in the order they were submitted, so a job that waits only for
    jobs submitted before it (a chunk for its documents) finds them running or done: no deadlock."""

    def __init__(self, threads: int):
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="store-encoder") if threads > 1 else None

    def submit(self, job, *args) -> Future:
        if self._pool is not None:
            return self._pool.submit(job, *args)
        future = Future()
        future.set_result(job(*args))
        return future

    def shutdown(self) -> None:
        """Drop the jobs not started and wait for those running."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _differences(name: str, stored, new) -> str:
    """Every differing leaf field of two manifest values, named by its dotted path."""
    if isinstance(stored, dict) and isinstance(new, dict):
        keys = sorted(k for k in stored.keys() | new.keys() if stored.get(k) != new.get(k))
        return "; ".join(_differences(f"{name}.{k}", stored.get(k), new.get(k)) for k in keys)
    return f"{name}: store has {stored!r}, this run has {new!r}"


class DifferentStore(UserError):
    """The directory holds a store of another identity; ``finished``: it holds complete shards."""

    def __init__(self, message: str, fields: list[str], finished: bool):
        super().__init__(message)
        self.fields, self.finished = fields, finished


class StoreWriter:
    """Writes documents into ``directory`` as shards ``shard-<writer_id>-<seq>.bds``.

    If the directory already holds a store with the same :class:`StoreIdentity` (vocabulary, teacher,
    tokenizer/corpus hashes, settings, encoding, stream), the writer resumes: complete shards of this
    ``writer_id`` are kept, its partial ``.tmp`` files are deleted, and
    :attr:`num_existing_documents` says how many of its documents are stored, so the caller
    skips that many and continues. A differing identity raises :class:`UserError`. Given
    ``source_pieces`` (a digest per piece of input dealt to this writer), it keeps them as
    ``source-<writer_id>.json`` and refuses to resume finished shards from a different source.

    A shard is closed after ``docs_per_shard`` documents or ``shard_bytes`` raw (uncompressed)
    bytes, whichever comes first; a chunk after ``chunk_bytes`` raw bytes (default: the encoding's,
    2 MiB, or 16 MiB for ``pow8-ans`` whose tables are per chunk). Both depend only on
    the documents, so an interrupted and resumed write gives the same shards.

    The identity's ``stream`` is the stream its documents' values are over (every document's layout
    is of it); an ``<eot>`` store is written as format version 2, another as version 3, which names
    it. Its ``reserved_symbols`` (``[{"text", "teacher_id"}, ...]``, the vocabulary's kept specials
    in order) make a chat store, version 4: every document then comes with the role of each target.
    """

    def __init__(
        self,
        directory: str | Path,
        identity: StoreIdentity,
        *,
        source_pieces: dict[str, str] | None = None,
        writer_id: int = 0,
        docs_per_shard: int | None = None,
        shard_bytes: int = 1 << 30,
        chunk_bytes: int | None = None,
        compression_level: int = 9,
        trie: VocabTrie | None = None,
        encode_threads: int = 1,
    ):
        vocab, encoding, stream = identity.vocab, identity.encoding, identity.stream
        reserved_symbols, settings = identity.reserved_symbols, identity.settings
        if not 0 <= writer_id <= 99999:
            raise UserError(f"writer id must be in 0..99999, got {writer_id}")
        if encode_threads < 1:
            raise UserError(f"encode threads must be at least 1, got {encode_threads}")
        self.directory = Path(directory)
        self.vocab = vocab
        self.encoding = encoding if isinstance(encoding, Encoding) else get_encoding(encoding, identity.encoding_params)
        self.writer_id = int(writer_id)
        self.docs_per_shard = docs_per_shard
        self.shard_bytes = int(shard_bytes)
        self.chunk_bytes = int(chunk_bytes or self.encoding.chunk_bytes)
        self.compression_level = int(compression_level)
        self._trie = trie
        self.stream = stream
        self.source_pieces = source_pieces
        self.chat = bool(reserved_symbols)
        if [r["teacher_id"] for r in reserved_symbols or []] != list(vocab.kept_ids):
            raise ValueError("reserved_symbols must name the vocabulary's kept ids, in order")
        settings = dict(settings or {})
        try:
            json.dumps(settings, sort_keys=True)
        except TypeError as exc:
            raise UserError(f"store settings must be JSON-serialisable: {exc}") from None
        self.manifest = {
            "format": FORMAT_NAME,
            **stream_fields(stream, reserved_symbols),
            "teacher": identity.teacher or vocab.name,
            "teacher_hash": identity.teacher_hash,
            "tokenizer_source": _relative_to(identity.tokenizer_source, self.directory),
            "vocab_hash": vocab.hash,
            "vocab_size": vocab.size,
            "tokenizer_hash": identity.tokenizer_hash,
            "corpus_hash": identity.corpus_hash,
            "settings": json.loads(json.dumps(settings, sort_keys=True)),
            "settings_hash": settings_hash(settings),
            "encoding": self.encoding.describe(),
            "compression": {"codec": "zstd", "level": self.compression_level},
        } | ({"teacher_numerics": identity.teacher_numerics} if identity.teacher_numerics is not None else {})
        self._identity = identity_hash(self.manifest)
        self._open_directory()
        self._shard: ShardFile | None = None
        self._jobs = _Jobs(int(encode_threads))
        self._pending: list[Future] = []  # the next chunk's documents (Future[_Encoded]), in order
        self._encoding: deque[tuple[Future, int]] = deque()  # documents handed to the threads (and their values)
        self._values_in_flight = 0
        self._coding: deque[tuple[Future, int]] = deque()  # the shard's chunks being coded (and their documents)
        self._pending_bytes = 0
        self._shard_raw_bytes = 0
        self.num_written = 0
        self._closed = False

    # -- setup / resume
    def _open_directory(self) -> None:
        check_store_files(self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        manifest_path = self.directory / MANIFEST
        if manifest_path.exists():
            existing = read_manifest(self.directory)
            differ = [k for k in IDENTITY_FIELDS if existing.get(k) != self.manifest.get(k)]
            if {"stream", "reserved_symbols"} & set(differ) and "format_version" in differ:  # the version follows
                differ.remove("format_version")
            if differ:
                detail = "; ".join(self._difference(k, existing) for k in differ)
                raise DifferentStore(
                    f"{self.directory} holds a different store ({', '.join(differ)} differ): {detail}",
                    fields=differ,
                    finished=bool(shard_sequences(self.directory)),
                )
            vocab_path = self.directory / VOCAB_FILE
            if not vocab_path.is_file():
                write_atomic(vocab_path, vocab_to_bytes(self.vocab), self.writer_id)
        else:  # the manifest first: a store file in a directory without one is not a store's
            text = json.dumps(self.manifest, indent=2, sort_keys=True) + "\n"
            write_atomic(manifest_path, text.encode(), self.writer_id)
            write_atomic(self.directory / VOCAB_FILE, vocab_to_bytes(self.vocab), self.writer_id)
        fsync_directory(self.directory)
        sequences = shard_sequences(self.directory).get(self.writer_id, [])  # finished shards
        if self.source_pieces is not None:  # before anything of this writer's is touched
            keep_source_record(self.directory, self.writer_id, self.source_pieces, len(sequences))

        for tmp in PARTIAL_SHARD.paths(self.directory, self.writer_id):
            tmp.unlink()
        finished = read_completion(self.directory, self.writer_id)
        completion_path(self.directory, self.writer_id).unlink(missing_ok=True)  # writing again: not finished
        check_sequence(self.directory, self.writer_id, sequences)
        existing = [ShardReader(self.directory / SHARD(self.writer_id, s), self.encoding) for s in sequences]
        check_writer(self.directory, self.writer_id, existing, self._identity)
        self.num_existing_documents = sum(r.num_docs for r in existing)
        self._kl_bits = _kl_bits_so_far(finished, self.num_existing_documents)
        self.existing_text_bytes = sum(int(r.docs["text_bytes"].sum()) for r in existing)
        self._next_sequence = len(sequences)
        self._writer_documents = self.num_existing_documents  # documents in this writer's complete shards

    def _difference(self, field: str, existing: dict) -> str:
        if field == "stream":
            held = manifest_stream(existing)
            return f"stream: the store holds the {held.shown} stream, this run writes the {self.stream.shown} stream"
        return _differences(field, existing.get(field), self.manifest.get(field))

    @property
    def trie(self) -> VocabTrie:
        if self._trie is None:
            self._trie = build_trie(self.vocab)
        return self._trie

    # -- adding documents
    def add_distributions(
        self, distributions, key: str | None = None, text_bytes: int | None = None, token_ids=None, roles=None
    ) -> float:
        """Add a :class:`distill.conversion.converter.DocumentDistributions`. Give ``token_ids`` when the
        vocabulary has several ids with one byte string (else the lowest such id is stored).
        Returns the log-likelihood of the document under its values as a reader decodes them
        (what ``train`` and ``score`` read)."""
        return self.submit_distributions(distributions, key, text_bytes, token_ids, roles).stored_log_likelihood()

    def submit_distributions(
        self, distributions, key: str | None = None, text_bytes: int | None = None, token_ids=None, roles=None
    ) -> PendingDocument:
        """:meth:`add_distributions` without waiting for the encoding: the document's values must
        not change until :meth:`PendingDocument.done`."""
        layout = distributions.layout
        if StreamKind.of_layout(layout) is not self.stream:
            raise ValueError(
                f"a document of the {StreamKind.of_layout(layout).shown} stream for a store of the "
                f"{self.stream.shown} stream"
            )
        if token_ids is None:
            if layout.fused:  # a first token that is all dummy prefix has no symbol in the fused stream
                raise ValueError("a fused-stream document needs its token_ids")
            token_ids = _token_ids_of_layout(layout, self.trie)
        token_ids = np.asarray(token_ids, dtype=np.int64)
        return self._add(token_ids, distributions.values, distributions.dropped_mass, text_bytes, key, layout, roles)

    def add(
        self, token_ids, values, dropped_mass, text_bytes: int | None = None, key: str | None = None, roles=None
    ) -> None:
        """Add one document: teacher token ids (m,), exact values (S,) in support order, dropped
        special mass (m+1,), its number of text bytes and an optional key; in a chat store the
        role of each target (P,) (0 template, 1 system, 2 user, 3 assistant)."""
        token_ids = np.asarray(token_ids, dtype=np.int64)
        try:
            layout = self.stream.layout(self.trie, token_ids)
        except ValueError as exc:
            raise UserError(f"document {self.num_written} ({key or 'no key'}): {exc}") from None
        self._add(token_ids, values, dropped_mass, text_bytes, key, layout, roles).stored_log_likelihood()

    def _add(
        self, token_ids, values, dropped_mass, text_bytes, key, layout: StreamLayout, roles=None
    ) -> PendingDocument:
        if self._closed:
            raise RuntimeError("StoreWriter is closed")
        if self._pending_bytes >= self.chunk_bytes:  # flushed now, when the caller's float64 values are gone
            self._flush_chunk()
        offsets = layout.offsets
        values = np.asarray(values, dtype=np.float64)
        dropped_mass = np.asarray(dropped_mass, dtype=np.float64)
        where = f"document {self.num_written} ({key or 'no key'})"
        held = layout.num_text_bytes()
        if text_bytes is None:
            text_bytes = held
        elif int(text_bytes) != held:
            raise UserError(f"{where}: {text_bytes} text bytes given, its tokens hold {held}")
        key = key or None  # an empty key is stored as no key
        if len(values) != offsets[-1]:
            raise UserError(f"{where}: {len(values)} values but its supports hold {offsets[-1]}")
        if len(dropped_mass) != len(token_ids) + 1:
            raise UserError(f"{where}: dropped mass needs m+1 = {len(token_ids) + 1} rows, got {len(dropped_mass)}")
        if len(values) and not (np.isfinite(values.max()) and 0 <= values.min()):  # NaN, inf: not finite
            raise UserError(f"{where}: values must be finite probabilities")
        if not np.all(np.isfinite(dropped_mass)) or (len(dropped_mass) and dropped_mass.min() < 0):
            raise UserError(f"{where}: dropped mass must be finite and non-negative")
        if self.chat != (roles is not None):
            raise UserError(f"{where}: {'a chat store needs' if self.chat else 'a store of plain text takes no'} roles")
        if roles is not None:
            roles = np.asarray(roles)
            if len(roles) != layout.num_positions or (
                len(roles) and not 0 <= int(roles.min()) <= int(roles.max()) <= 3
            ):
                raise UserError(f"{where}: roles must be one of 0..3 per target ({layout.num_positions})")
            roles = roles.astype(np.uint8)
        size = self._raw_size(token_ids, layout, key, roles)
        encoded = self._jobs.submit(
            self._encode_document, token_ids, values, dropped_mass, int(text_bytes), key, layout, roles, size
        )
        self._pending.append(encoded)
        self._encoding.append((encoded, len(values)))
        self._values_in_flight += len(values)
        self._pending_bytes += size
        self._shard_raw_bytes += size
        self.num_written += 1
        self._write_coded_chunks(self._jobs.threads)
        self._wait_for_encoding(VALUES_IN_FLIGHT_PER_THREAD * self._jobs.threads)
        shard_docs = (self._shard.num_docs if self._shard else 0) + len(self._pending) + self._coding_documents()
        if (self.docs_per_shard and shard_docs >= self.docs_per_shard) or self._shard_raw_bytes >= self.shard_bytes:
            self._finish_shard()
        return PendingDocument(encoded)

    def _raw_size(self, token_ids, layout: StreamLayout, key: str | None, roles) -> int:
        """The raw bytes the document takes in its chunk (:meth:`EncodedDocument.raw_size`), known
        before it is encoded, so that the chunks are cut where they would be without threads."""
        encoding = self.encoding
        values, positions = layout.num_values * encoding.value_width, layout.num_positions * encoding.position_width
        key_bytes = len((key or "").encode())
        role_bytes = 0 if roles is None else len(roles)
        return 4 * len(token_ids) + values + positions + 4 * (len(token_ids) + 1) + key_bytes + role_bytes

    def _encode_document(self, token_ids, values, dropped_mass, text_bytes, key, layout, roles, size) -> _Encoded:
        """An encoder thread's job: the document's codes, as stored, its stored log-likelihood and KL."""
        value_bytes, position_bytes = self.encoding.encode(values, layout.offsets, target_indices(layout))
        stored_log_likelihood, kl = self._stored_figures(value_bytes, position_bytes, layout, values)
        doc = EncodedDocument(
            token_ids=token_ids.astype(np.uint32),
            value_bytes=value_bytes,
            position_bytes=position_bytes,
            dropped_mass=dropped_mass.astype(np.float32),
            text_bytes=text_bytes,
            key=key,
            layout=layout if self.encoding.needs_contexts else None,  # its chunk's contexts come from it
            roles=roles,
        )
        if doc.raw_size() != size:
            raise RuntimeError(f"a document of {doc.raw_size()} raw bytes, {size} were expected")
        return _Encoded(doc, stored_log_likelihood, kl)

    def _wait_for_encoding(self, at_most: int) -> None:
        """Wait until the documents handed to the threads and not encoded yet hold at most ``at_most``
        float64 values (they live until then), or are the newest alone."""
        while self._encoding and (
            self._encoding[0][0].done() or (len(self._encoding) > 1 and self._values_in_flight > at_most)
        ):
            encoded, values = self._encoding.popleft()
            kl = encoded.result().kl_bits
            self._kl_bits = None if self._kl_bits is None else self._kl_bits + kl
            self._values_in_flight -= values

    def _coding_documents(self) -> int:
        return sum(documents for _, documents in self._coding)

    def _stored_figures(self, value_bytes, position_bytes, layout: StreamLayout, exact) -> tuple[float, float]:
        """The document's log-likelihood under its values as a reader decodes them and KL(exact ||
        decoded) in bits summed over its positions, decoded ``DECODE_RUN_VALUES`` at a time: a long
        document needs no float32 copy of its values."""
        taken = np.empty(layout.num_positions, np.float32)  # what every encoding decodes to
        kl = 0.0
        for run in layout.position_runs(DECODE_RUN_VALUES):
            first, last = layout.offsets[run.start], layout.offsets[run.stop]
            offsets = layout.offsets[run.start : run.stop + 1] - first
            decoded = self.encoding.decode(
                value_bytes[first:last], position_bytes[run.start : run.stop], offsets, target_indices(layout, run)
            )
            taken[run.start : run.stop] = target_values(layout, decoded, run)
            kl += kl_bits(exact[first:last], decoded)
        return log_likelihood(taken), kl

    def _flush_chunk(self) -> None:
        """Hand the pending documents to the threads as the next chunk of the shard."""
        if not self._pending:
            return
        if self._shard is None:
            record = ShardRecord(self.writer_id, self._next_sequence, self._writer_documents, self._identity)
            path = self.directory / SHARD(self.writer_id, self._next_sequence)
            self._shard = ShardFile(
                path, self.compression_level, record, self.encoding, self.manifest["format_version"]
            )
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        self._coding.append((self._jobs.submit(self._code_chunk, pending, self._shard), len(pending)))
        self._write_coded_chunks(self._jobs.threads)

    def _code_chunk(self, pending: list[Future], shard: ShardFile) -> CodedChunk:
        """An encoder thread's job: the chunk of these documents, once they are encoded, compressed."""
        docs = [encoded.result().document for encoded in pending]
        contexts = self._chunk_contexts(docs) if self.encoding.needs_contexts else None
        return shard.code_chunk(docs, contexts)

    def _write_coded_chunks(self, at_most: int) -> None:
        """Write the coded chunks at the front, in order, and wait until at most ``at_most`` are
        being coded."""
        while self._coding and (self._coding[0][0].done() or len(self._coding) > at_most):
            self._shard.write_coded(self._coding.popleft()[0].result())

    def _chunk_contexts(self, docs: list[EncodedDocument]) -> np.ndarray:
        """The model contexts of every value of the chunk, from each document's stream layout (as the
        reader rebuilds it from its token ids). Computed when the chunk is coded, so that a pending
        document keeps its stored bytes and its layout, not its contexts."""
        contexts = np.empty(sum(len(d.value_bytes) for d in docs), np.int16)
        start = 0
        for doc in docs:
            self.encoding.contexts(doc.layout, contexts[start:])
            start += doc.layout.num_values
        return contexts

    def _finish_shard(self) -> None:
        self._flush_chunk()
        self._write_coded_chunks(0)
        if self._shard is not None:
            self._shard.finish()
            self._writer_documents += self._shard.num_docs
            self._shard = None
            self._next_sequence += 1
        self._shard_raw_bytes = 0

    def close(self) -> None:
        """Write what is pending as a final shard and record that this writer finished."""
        if not self._closed:
            self._finish_shard()
            self._wait_for_encoding(0)  # every document is encoded: their KL is counted
            completion = Completion(self.writer_id, self._next_sequence, self._writer_documents, self._kl_bits)
            write_completion(self.directory, completion)
            fsync_directory(self.directory)
            self._closed = True
            self._jobs.shutdown()

    def abandon(self) -> None:
        """Stop without finishing the current shard (its ``.tmp`` stays, as after a crash)."""
        self._jobs.shutdown()
        if self._shard is not None:
            self._shard.abandon()
        self._closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abandon()


def _kl_bits_so_far(finished: Completion | None, documents: int) -> float | None:
    """The KL of a writer's documents already stored: 0 for none; what its completion record
    says if it covers them all; else unknown (a run that stopped, or a store written before
    completion records held it), and the writer's own record will not say it."""
    if documents == 0:
        return 0.0
    if finished is not None and finished.documents == documents:
        return finished.kl_bits
    return None


def _relative_to(source: str | None, directory: Path) -> str | None:
    """A local path as seen from the store (so the manifest does not depend on where both sit);
    a Hub id as it is."""
    if not source or not Path(source).exists():
        return source or None
    return os.path.relpath(Path(source).resolve(), Path(directory).resolve())


def _token_ids_of_layout(layout: StreamLayout, trie: VocabTrie) -> np.ndarray:
    """Token ids of a stream: for each token, the lowest id whose byte string it is (the node of
    the position whose input is the token's last byte)."""
    ends = np.flatnonzero(layout.symbols.astype(np.int64) == EOT)
    token_nodes = layout.position_node[ends - 1]
    first_id = np.full(trie.num_nodes, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_id, trie.token_node[trie.order], trie.order)
    return first_id[token_nodes]
