"""Reading one store directory (:class:`LogitStore`) and the reader API it shares with
:class:`logit_store.multi.MultiStore`."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numba
import numpy as np

from bytestream.stream import StreamLayout, target_indices, target_values
from bytestream.stream_kind import StreamKind
from bytestream.trie import VocabTrie, build_trie
from bytestream.vocab import TeacherVocab
from common.errors import UserError
from common.files import read_regular
from logit_store.chunk import ChunkData, EncodedDocument
from logit_store.encodings import stored_encoding
from logit_store.file_names import MANIFEST, SHARD, VOCAB_FILE
from logit_store.hub import hub_shards
from logit_store.hub_files import read_file_list
from logit_store.integrity import (
    WriterStates,
    check_sequence,
    check_writer,
    completed_writers,
    shard_sequences,
    writer_states,
)
from logit_store.manifest import identity_hash, manifest_reserved_symbols, manifest_stream, read_manifest
from logit_store.shard import ShardReader
from logit_store.vocab_file import vocab_from_bytes


@dataclass
class StoredDocument:
    token_ids: np.ndarray  # (m,) int64
    layout: StreamLayout
    values: np.ndarray  # (S,) float32, normalised per position
    dropped_mass: np.ndarray  # (m+1,) float32
    text_bytes: int
    key: str | None
    roles: np.ndarray | None = None  # (L−1,) uint8 per target: 0 template, 1 system, 2 user, 3 assistant (chat stores)

    @property
    def num_positions(self) -> int:
        return self.layout.num_positions

    def dense(self) -> np.ndarray:
        """(L−1, A) float32 probabilities over the stream's alphabet (zeros off the support)."""
        return densify(self.layout, self.values)

    def target_probabilities(self) -> np.ndarray:
        return target_values(self.layout, self.values)


def densify(layout: StreamLayout, values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """(L−1, A) rows over the stream's alphabet with each position's support values in place (``out`` must hold zeros)."""
    if out is None:
        out = np.zeros((layout.num_positions, layout.alphabet_size), dtype=np.float32)
    if len(values) != layout.num_values or out.shape != (layout.num_positions, layout.alphabet_size):
        raise ValueError(f"{len(values)} values into {out.shape} rows for a layout of {layout.num_values} values")
    _scatter_rows(layout.offsets, layout.support, values, out)
    return out


@numba.njit(cache=True, nogil=True)
def _scatter_rows(offsets, support, values, out):
    for i in range(len(offsets) - 1):
        for at in range(offsets[i], offsets[i + 1]):
            out[i, support[at]] = values[at]


class StoreBase:
    """Shared reader API of :class:`LogitStore` and :class:`MultiStore`."""

    num_documents: int

    def __len__(self) -> int:
        return self.num_documents

    def __iter__(self):
        return self.iter_documents()

    def iter_documents(self, with_values: bool = True):
        """Documents in store order (with their values, or their token ids alone)."""
        for i in range(self.num_documents):
            yield self.document(i) if with_values else self.document_tokens(i)

    def chunk_spans(self) -> list[tuple[int, int]]:
        raise NotImplementedError

    def document(self, i: int) -> StoredDocument:
        raise NotImplementedError

    def document_tokens(self, i: int) -> np.ndarray:
        raise NotImplementedError

    def document_roles(self, i: int) -> np.ndarray | None:
        """Document ``i``'s role per target (a chat store's), None for a store of plain text."""
        raise NotImplementedError


class LogitStore(StoreBase):
    """A logit-store directory opened for reading. Opening checks every shard's index and the
    store's integrity (gap-free writer sequences, shard records, completion records). A Hub copy's
    directory (:mod:`logit_store.hub`) is read the same way, each shard fetched when first read."""

    def __init__(
        self,
        directory: str | Path,
        expected_vocab_hash: str | None = None,
        cache_chunks: int = 4,
        trie: VocabTrie | None = None,
    ):
        """``trie``: the vocabulary's trie if the caller has it (building it for a large vocabulary
        takes a while); else it is built from the store's vocabulary when first needed."""
        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory)
        self.vocab_hash = self.manifest["vocab_hash"]
        if expected_vocab_hash is not None and expected_vocab_hash != self.vocab_hash:
            raise UserError(
                f"{self.directory}: vocabulary hash {self.vocab_hash[:16]}… differs from the expected "
                f"{expected_vocab_hash[:16]}… (a store of another teacher/tokenizer)"
            )
        enc = self.manifest["encoding"]
        try:
            self.encoding = stored_encoding(enc)
        except UserError as exc:
            raise UserError(f"{self.directory / MANIFEST}: {exc}") from None
        self.teacher = self.manifest.get("teacher", "")
        self.stream: StreamKind = manifest_stream(self.manifest)
        self.format_version = int(self.manifest["format_version"])
        self.shards, self.unfinished_writers = self._open_shards()
        # writers the manifest counts that left no shard and no completion record
        self.missing_writers = writer_states(self.directory, self.manifest).missing
        counts = np.array([s.num_docs for s in self.shards], dtype=np.int64)
        self._shard_start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_documents = int(self._shard_start[-1])
        self._cache: OrderedDict = OrderedDict()
        self._cache_size = cache_chunks
        if trie is not None:
            if trie.vocab_size != int(self.manifest.get("vocab_size", trie.vocab_size)):
                raise ValueError(f"a trie of {trie.vocab_size} ids for a store of {self.manifest['vocab_size']}")
            self.__dict__["trie"] = trie  # the cached property's value

    def _open_shards(self) -> tuple[list[ShardReader], list[int]]:
        sequences = shard_sequences(self.directory)
        identity = identity_hash(self.manifest) if self.format_version >= 2 else None
        listing = read_file_list(self.directory)  # a Hub copy: its shards are fetched when first read
        remote = hub_shards(self.directory, listing) if listing is not None else {}
        shards, unfinished = [], []
        for writer_id in sorted(set(sequences) | set(completed_writers(self.directory))):
            check_sequence(self.directory, writer_id, sequences.get(writer_id, []))
            names = [SHARD(writer_id, s) for s in sequences.get(writer_id, [])]
            own = [ShardReader(self.directory / name, self.encoding, remote.get(name)) for name in names]
            for shard in own:
                if shard.version != self.format_version:
                    raise UserError(
                        f"shard {shard.name} has format version {shard.version}, the manifest {self.format_version}"
                    )
            if not check_writer(self.directory, writer_id, own, identity) and self.format_version >= 2:
                unfinished.append(writer_id)
            shards += own
        return shards, unfinished

    @property
    def writer_states(self) -> WriterStates:
        """The writers that have not finished (unfinished or missing): a partial store."""
        return WriterStates(list(self.unfinished_writers), list(self.missing_writers))

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_cache"] = OrderedDict()
        return state

    @cached_property
    def vocab(self) -> TeacherVocab:
        path = self.directory / VOCAB_FILE
        if not path.is_file():
            raise UserError(f"{self.directory}: {VOCAB_FILE} is missing")
        vocab = vocab_from_bytes(read_regular(path), str(path))
        if vocab.hash != self.vocab_hash:
            raise UserError(f"{path} does not match the manifest's vocab_hash (corrupt or replaced)")
        return vocab

    @cached_property
    def trie(self) -> VocabTrie:
        return build_trie(self.vocab)

    def document_location(self, i: int) -> tuple[str, int]:
        """(shard file name, document number within it) of store document ``i``."""
        s, d = self._locate(i)
        return self.shards[s].name, d

    def _locate(self, i: int) -> tuple[int, int]:
        if not 0 <= i < self.num_documents:
            raise IndexError(f"document {i} out of range (store has {self.num_documents})")
        s = int(np.searchsorted(self._shard_start, i, side="right") - 1)
        return s, i - int(self._shard_start[s])

    def _layout_of(self, token_ids: np.ndarray) -> StreamLayout:
        return self.stream.layout(self.trie, token_ids)

    def _chunk(self, s: int, c: int) -> ChunkData:
        key = (s, c)
        data = self._cache.get(key)
        if data is None:
            data = self.shards[s].read_chunk(c, self._layout_of if self.encoding.needs_contexts else None)
            self._cache[key] = data
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return data

    def check_chunks(self) -> int:
        """Read (checksum, decompress, size-check) every chunk; the number of chunks."""
        count = 0
        for s, shard in enumerate(self.shards):
            for c in range(len(shard.chunks)):
                self._chunk(s, c)
                count += 1
        return count

    def encoded_document(self, i: int) -> EncodedDocument:
        s, d = self._locate(i)
        entry = self.shards[s].docs[d]
        c = int(entry["chunk"])
        first = int(self.shards[s].chunks[c]["first_doc"])
        return self._chunk(s, c).document(d - first, int(entry["text_bytes"]))

    def document_tokens(self, i: int) -> np.ndarray:
        """Only the teacher token ids of document ``i`` (no values decoded)."""
        s, d = self._locate(i)
        c = int(self.shards[s].docs[d]["chunk"])
        return self._chunk(s, c).tokens(d - int(self.shards[s].chunks[c]["first_doc"])).astype(np.int64)

    def document_roles(self, i: int) -> np.ndarray | None:
        s, d = self._locate(i)
        c = int(self.shards[s].docs[d]["chunk"])
        return self._chunk(s, c).document_roles(d - int(self.shards[s].chunks[c]["first_doc"]))

    @property
    def reserved_symbols(self) -> list[dict]:
        """The manifest's reserved symbols, ``[{"text", "teacher_id"}, ...]`` ([] for plain text)."""
        return manifest_reserved_symbols(self.manifest)

    def document(self, i: int) -> StoredDocument:
        enc = self.encoded_document(i)
        token_ids = enc.token_ids.astype(np.int64)
        shard, local = self.document_location(i)
        where = f"shard {shard} document {local} (store document {i})"
        layout = enc.layout  # made while decoding the values, for entropy-coded encodings
        if layout is None:
            try:
                layout = self._layout_of(token_ids)
            except ValueError as exc:
                raise UserError(f"{where}: corrupt token ids ({exc})") from None
        if layout.num_values != len(enc.value_bytes) or layout.num_positions != len(enc.position_bytes):
            raise UserError(f"{where}: stored values do not match its tokens' supports (corrupt)")
        if enc.text_bytes != layout.num_text_bytes():
            raise UserError(f"{where}: its text byte count does not match its tokens (corrupt)")
        try:
            values = self.encoding.decode(enc.value_bytes, enc.position_bytes, layout.offsets, target_indices(layout))
        except ValueError as exc:
            raise UserError(f"{where}: corrupt values ({exc})") from None
        return StoredDocument(token_ids, layout, values, enc.dropped_mass.copy(), enc.text_bytes, enc.key, enc.roles)

    def chunk_spans(self) -> list[tuple[int, int]]:
        """(first store document, number of documents) of every chunk, in document order."""
        spans = []
        for start, shard in zip(self._shard_start.tolist(), self.shards):
            spans += [(start + int(c["first_doc"]), int(c["num_docs"])) for c in shard.chunks]
        return spans

    def document_positions(self) -> np.ndarray:
        parts = [s.docs["positions"].astype(np.int64) for s in self.shards]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def stats(self) -> dict:
        docs = [s.docs for s in self.shards]
        total = lambda field: int(sum(int(d[field].sum()) for d in docs))
        shard_bytes = sum(s.size for s in self.shards)
        size = shard_bytes + sum(
            (self.directory / n).stat().st_size for n in (MANIFEST, VOCAB_FILE) if (self.directory / n).exists()
        )
        text = total("text_bytes")
        return {
            "documents": self.num_documents,
            "text_bytes": text,
            "positions": total("positions"),
            "tokens": total("tokens"),
            "values": total("values"),
            "shards": len(self.shards),
            "chunks": sum(len(s.chunks) for s in self.shards),
            "size_on_disk": size,
            "bytes_per_text_byte": size / text if text else None,
            "shard_bytes": shard_bytes,  # without the one-off manifest and vocabulary files
            "shard_bytes_per_text_byte": shard_bytes / text if text else None,
            "encoding": self.encoding.name,
            "encoding_params": self.encoding.params,
            "stream": self.stream.value,
            "teacher": self.teacher,
            "vocab_hash": self.vocab_hash,
            "unfinished_writers": self.unfinished_writers,
            "missing_writers": self.missing_writers,
        }
