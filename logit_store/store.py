"""Writing and reading logit stores (docs/DESIGN.md, "Store"; FORMAT.md).

* :class:`StoreWriter` appends documents (teacher token ids + exact values) into shards of one
  writer id; shards appear atomically; reopening an identical store resumes.
* :class:`LogitStore` reads one store directory; :class:`MultiStore` (:func:`open_stores`) reads
  several with the same vocabulary as one.
* :func:`store_content_hash` hashes the stored documents, independent of sharding and chunking.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import zstandard

from distill.alphabet import ALPHABET_SIZE
from distill.errors import UserError
from distill.stream import StreamLayout, stream_layout
from distill.trie import VocabTrie, build_trie
from distill.vocab import TeacherVocab
from logit_store.encodings import DEFAULT_ENCODING, Encoding, get_encoding
from logit_store.shard import FORMAT_VERSION, EncodedDocument, ShardFile, ShardReader, fsync_directory

MANIFEST = "manifest.json"
VOCAB_FILE = "vocab.bin"
VOCAB_MAGIC = b"BDVOCAB\0"
FORMAT_NAME = "bytedistill-logit-store"
SHARD_PATTERN = re.compile(r"^shard-(\d{5})-(\d{5})\.bds$")
# manifest fields that must agree for a writer to append to an existing store
IDENTITY_FIELDS = ("format_version", "teacher", "vocab_hash", "tokenizer_hash", "corpus_hash", "settings", "encoding")


def shard_name(writer_id: int, sequence: int) -> str:
    return f"shard-{writer_id:05d}-{sequence:05d}.bds"


def settings_hash(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


# ---------------------------------------------------------------- vocab.bin


def vocab_to_bytes(vocab: TeacherVocab) -> bytes:
    header = json.dumps(
        {
            "name": vocab.name, "family": vocab.family, "size": vocab.size,
            "special_ids": list(vocab.special_ids), "end_of_text_ids": list(vocab.end_of_text_ids),
            "prefix_ids": list(vocab.prefix_ids), "adds_prefix_space": vocab.adds_prefix_space,
        },
        sort_keys=True,
    ).encode()  # fmt: skip
    lengths = np.array([len(b) for b in vocab.token_bytes], dtype="<u4").tobytes()
    body = struct.pack("<I", len(header)) + header + lengths + b"".join(vocab.token_bytes)
    packed = zstandard.ZstdCompressor(level=9).compress(body)
    return VOCAB_MAGIC + packed + hashlib.blake2b(body, digest_size=16).digest()


def vocab_from_bytes(data: bytes, where: str) -> TeacherVocab:
    if data[:8] != VOCAB_MAGIC or len(data) < 28:
        raise UserError(f"{where} is not a bytedistill vocabulary file")
    try:
        body = zstandard.ZstdDecompressor().decompress(data[8:-16])
    except zstandard.ZstdError:
        raise UserError(f"{where} is corrupt (cannot decompress)") from None
    if hashlib.blake2b(body, digest_size=16).digest() != data[-16:]:
        raise UserError(f"{where} is corrupt (checksum mismatch)")
    (header_len,) = struct.unpack("<I", body[:4])
    header = json.loads(body[4 : 4 + header_len])
    size = int(header["size"])
    at = 4 + header_len
    lengths = np.frombuffer(body[at : at + 4 * size], dtype="<u4").astype(np.int64)
    at += 4 * size
    ends = at + np.cumsum(lengths)
    starts = ends - lengths
    token_bytes = tuple(body[s:e] for s, e in zip(starts.tolist(), ends.tolist()))
    return TeacherVocab(
        token_bytes=token_bytes, special_ids=tuple(header["special_ids"]),
        end_of_text_ids=tuple(header["end_of_text_ids"]), family=header["family"],
        prefix_ids=tuple(header["prefix_ids"]), name=header["name"],
        adds_prefix_space=bool(header["adds_prefix_space"]),
    )  # fmt: skip


def read_manifest(directory: Path) -> dict:
    path = Path(directory) / MANIFEST
    if not Path(directory).is_dir():
        raise UserError(f"logit store not found: {directory} is not a directory")
    if not path.is_file():
        raise UserError(f"{directory} is not a logit store: {MANIFEST} is missing")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise UserError(f"{path} is not a bytedistill logit-store manifest")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise UserError(f"{path}: unknown store format version {version!r} (this reader knows {FORMAT_VERSION})")
    return manifest


def _write_atomic(path: Path, data: bytes, unique: str) -> None:
    tmp = path.with_name(f"{path.name}.{unique}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _differences(name: str, stored, new) -> str:
    """Every differing leaf field of two manifest values, named by its dotted path."""
    if isinstance(stored, dict) and isinstance(new, dict):
        keys = sorted(k for k in stored.keys() | new.keys() if stored.get(k) != new.get(k))
        return "; ".join(_differences(f"{name}.{k}", stored.get(k), new.get(k)) for k in keys)
    return f"{name}: store has {stored!r}, this run has {new!r}"


# ---------------------------------------------------------------- writer


class StoreWriter:
    """Writes documents into ``directory`` as shards ``shard-<writer_id>-<seq>.bds``.

    If the directory already holds a store with the same identity (vocabulary, teacher,
    tokenizer/corpus hashes, settings, encoding), the writer resumes: complete shards of this
    ``writer_id`` are kept, its partial ``.tmp`` files are deleted, and
    :attr:`num_existing_documents` says how many of its documents are stored, so the caller
    skips that many and continues. A differing identity raises :class:`UserError`.

    A shard is closed after ``docs_per_shard`` documents or ``shard_bytes`` raw (uncompressed)
    bytes, whichever comes first; a chunk after ``chunk_bytes`` raw bytes. Both depend only on
    the documents, so an interrupted and resumed write gives the same shards.
    """

    def __init__(
        self,
        directory: str | Path,
        vocab: TeacherVocab,
        *,
        encoding: str | Encoding = DEFAULT_ENCODING,
        encoding_params: dict | None = None,
        teacher: str = "",
        settings: dict | None = None,
        corpus_hash: str | None = None,
        tokenizer_hash: str | None = None,
        writer_id: int = 0,
        docs_per_shard: int | None = None,
        shard_bytes: int = 1 << 30,
        chunk_bytes: int = 2 << 20,
        compression_level: int = 9,
        trie: VocabTrie | None = None,
    ):
        if not 0 <= writer_id <= 99999:
            raise UserError(f"writer id must be in 0..99999, got {writer_id}")
        self.directory = Path(directory)
        self.vocab = vocab
        self.encoding = encoding if isinstance(encoding, Encoding) else get_encoding(encoding, encoding_params)
        self.writer_id = int(writer_id)
        self.docs_per_shard = docs_per_shard
        self.shard_bytes = int(shard_bytes)
        self.chunk_bytes = int(chunk_bytes)
        self.compression_level = int(compression_level)
        self._trie = trie
        settings = dict(settings or {})
        try:
            json.dumps(settings, sort_keys=True)
        except TypeError as exc:
            raise UserError(f"store settings must be JSON-serialisable: {exc}") from None
        self.manifest = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "teacher": teacher or vocab.name,
            "vocab_hash": vocab.hash,
            "vocab_size": vocab.size,
            "tokenizer_hash": tokenizer_hash,
            "corpus_hash": corpus_hash,
            "settings": json.loads(json.dumps(settings, sort_keys=True)),
            "settings_hash": settings_hash(settings),
            "encoding": self.encoding.describe(),
            "compression": {"codec": "zstd", "level": self.compression_level},
        }
        self._open_directory()
        self._shard: ShardFile | None = None
        self._pending: list[EncodedDocument] = []
        self._pending_bytes = 0
        self._shard_raw_bytes = 0
        self.num_written = 0
        self._closed = False

    # -- setup / resume
    def _open_directory(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        manifest_path = self.directory / MANIFEST
        if manifest_path.exists():
            existing = read_manifest(self.directory)
            differ = [k for k in IDENTITY_FIELDS if existing.get(k) != self.manifest.get(k)]
            if differ:
                detail = "; ".join(_differences(k, existing.get(k), self.manifest.get(k)) for k in differ)
                raise UserError(f"{self.directory} holds a different store ({', '.join(differ)} differ): {detail}")
            vocab_path = self.directory / VOCAB_FILE
            if not vocab_path.is_file():
                _write_atomic(vocab_path, vocab_to_bytes(self.vocab), f"w{self.writer_id}")
        else:
            _write_atomic(self.directory / VOCAB_FILE, vocab_to_bytes(self.vocab), f"w{self.writer_id}")
            text = json.dumps(self.manifest, indent=2, sort_keys=True) + "\n"
            _write_atomic(manifest_path, text.encode(), f"w{self.writer_id}")
        fsync_directory(self.directory)

        prefix = f"shard-{self.writer_id:05d}-"
        for tmp in self.directory.glob(prefix + "*.tmp"):
            tmp.unlink()
        sequences = []
        for path in self.directory.glob(prefix + "*.bds"):
            match = SHARD_PATTERN.match(path.name)
            if match:
                sequences.append(int(match.group(2)))
        sequences.sort()
        if sequences != list(range(len(sequences))):
            raise UserError(
                f"{self.directory}: shards of writer {self.writer_id} are not a complete sequence "
                f"(found {sequences[:10]}); remove the stray ones"
            )
        value_width, position_width = self.encoding.value_width, self.encoding.position_width
        existing = [ShardReader(self.directory / shard_name(self.writer_id, s), value_width, position_width) for s in sequences]
        self.num_existing_documents = sum(r.num_docs for r in existing)
        self.existing_text_bytes = sum(int(r.docs["text_bytes"].sum()) for r in existing)
        self._next_sequence = len(sequences)

    @property
    def trie(self) -> VocabTrie:
        if self._trie is None:
            self._trie = build_trie(self.vocab)
        return self._trie

    # -- adding documents
    def add_distributions(
        self, distributions, key: str | None = None, text_bytes: int | None = None, token_ids=None
    ) -> None:
        """Add a :class:`distill.convert.DocumentDistributions`. Give ``token_ids`` when the
        vocabulary has several ids with one byte string (else the lowest such id is stored)."""
        layout = distributions.layout
        if token_ids is None:
            token_ids = _token_ids_of_layout(layout, self.trie)
        token_ids = np.asarray(token_ids, dtype=np.int64)
        if text_bytes is None:
            text_bytes = _text_bytes(layout, self.vocab)
        self._add(token_ids, distributions.values, distributions.dropped_mass, text_bytes, key, layout.offsets)

    def add(self, token_ids, values, dropped_mass, text_bytes: int | None = None, key: str | None = None) -> None:
        """Add one document: teacher token ids (m,), exact values (S,) in support order, dropped
        special mass (m+1,), its number of text bytes and an optional key."""
        token_ids = np.asarray(token_ids, dtype=np.int64)
        try:
            layout = stream_layout(self.trie, token_ids)
        except ValueError as exc:
            raise UserError(f"document {self.num_written} ({key or 'no key'}): {exc}") from None
        if text_bytes is None:
            text_bytes = _text_bytes(layout, self.vocab)
        self._add(token_ids, values, dropped_mass, text_bytes, key, layout.offsets)

    def _add(self, token_ids, values, dropped_mass, text_bytes, key, offsets) -> None:
        if self._closed:
            raise RuntimeError("StoreWriter is closed")
        values = np.asarray(values, dtype=np.float64)
        dropped_mass = np.asarray(dropped_mass, dtype=np.float64)
        where = f"document {self.num_written} ({key or 'no key'})"
        if len(values) != offsets[-1]:
            raise UserError(f"{where}: {len(values)} values but its supports hold {offsets[-1]}")
        if len(dropped_mass) != len(token_ids) + 1:
            raise UserError(f"{where}: dropped mass needs m+1 = {len(token_ids) + 1} rows, got {len(dropped_mass)}")
        if not np.all(np.isfinite(values)) or (len(values) and values.min() < 0):
            raise UserError(f"{where}: values must be finite probabilities")
        value_bytes, position_bytes = self.encoding.encode(values, offsets)
        doc = EncodedDocument(
            token_ids=token_ids.astype(np.uint32), value_bytes=value_bytes, position_bytes=position_bytes,
            dropped_mass=dropped_mass.astype(np.float32), text_bytes=int(text_bytes), key=key,
        )  # fmt: skip
        self._pending.append(doc)
        size = doc.raw_size()
        self._pending_bytes += size
        self._shard_raw_bytes += size
        self.num_written += 1
        if self._pending_bytes >= self.chunk_bytes:
            self._flush_chunk()
        shard_docs = (self._shard.num_docs if self._shard else 0) + len(self._pending)
        if (self.docs_per_shard and shard_docs >= self.docs_per_shard) or self._shard_raw_bytes >= self.shard_bytes:
            self._finish_shard()

    def _flush_chunk(self) -> None:
        if not self._pending:
            return
        if self._shard is None:
            self._shard = ShardFile(self.directory / shard_name(self.writer_id, self._next_sequence), self.compression_level)
        self._shard.write_chunk(self._pending, self.encoding.value_width, self.encoding.position_width)
        self._pending = []
        self._pending_bytes = 0

    def _finish_shard(self) -> None:
        self._flush_chunk()
        if self._shard is not None:
            self._shard.finish()
            self._shard = None
            self._next_sequence += 1
        self._shard_raw_bytes = 0

    def close(self) -> None:
        """Write what is pending as a final shard."""
        if not self._closed:
            self._finish_shard()
            self._closed = True

    def abandon(self) -> None:
        """Stop without finishing the current shard (its ``.tmp`` stays, as after a crash)."""
        if self._shard is not None:
            self._shard.abandon()
        self._closed = True

    def __enter__(self) -> "StoreWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abandon()


def _token_ids_of_layout(layout: StreamLayout, trie: VocabTrie) -> np.ndarray:
    """Token ids of a stream: for each token, the lowest id whose byte string it is (the node of
    the position whose input is the token's last byte)."""
    ends = np.flatnonzero(layout.symbols.astype(np.int64) == 256)
    token_nodes = layout.position_node[ends - 1]
    first_id = np.full(trie.num_nodes, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_id, trie.token_node[trie.order], trie.order)
    return first_id[token_nodes]


def _text_bytes(layout: StreamLayout, vocab: TeacherVocab) -> int:
    return int(np.count_nonzero(layout.symbols < 256))  # a dummy prefix space is context, not stream


# ---------------------------------------------------------------- reader


@dataclass
class StoredDocument:
    token_ids: np.ndarray  # (m,) int64
    layout: StreamLayout
    values: np.ndarray  # (S,) float32, normalised per position
    dropped_mass: np.ndarray  # (m+1,) float32
    text_bytes: int
    key: str | None

    @property
    def num_positions(self) -> int:
        return self.layout.num_positions

    def dense(self) -> np.ndarray:
        """(L−1, 260) float32 probabilities over the alphabet (zeros off the support)."""
        return densify(self.layout, self.values)

    def target_probabilities(self) -> np.ndarray:
        from distill.convert import _target_values

        return _target_values(self.layout.symbols, self.layout.offsets, self.layout.support, self.values)


def densify(layout: StreamLayout, values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    if out is None:
        out = np.zeros((layout.num_positions, ALPHABET_SIZE), dtype=np.float32)
    rows = np.repeat(np.arange(layout.num_positions), np.diff(layout.offsets))
    out[rows, layout.support.astype(np.int64)] = values
    return out


class _StoreBase:
    """Shared reader API of :class:`LogitStore` and :class:`MultiStore`."""

    def __len__(self) -> int:
        return self.num_documents

    def __iter__(self):
        return self.iter_documents()

    def iter_documents(self, shuffle: bool = False, seed: int = 0, with_values: bool = True):
        """Documents in store order, or in a seeded block-shuffled order (chunks shuffled, then
        documents within each chunk) that reads every chunk once."""
        for i in self.document_order(shuffle, seed):
            yield self.document(int(i)) if with_values else self.document_tokens(int(i))

    def document_order(self, shuffle: bool = False, seed: int = 0) -> np.ndarray:
        n = self.num_documents
        if not shuffle:
            return np.arange(n)
        rng = np.random.default_rng(seed)
        chunks = self.document_chunks()
        num_chunks = int(chunks.max()) + 1 if n else 0
        chunk_rank = rng.permutation(num_chunks)
        within = rng.random(n)
        return np.lexsort((within, chunk_rank[chunks]))

    def dense(self, i: int) -> np.ndarray:
        return self.document(i).dense()


class LogitStore(_StoreBase):
    """A logit-store directory opened for reading."""

    def __init__(self, directory: str | Path, expected_vocab_hash: str | None = None, cache_chunks: int = 4):
        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory)
        self.vocab_hash = self.manifest["vocab_hash"]
        if expected_vocab_hash is not None and expected_vocab_hash != self.vocab_hash:
            raise UserError(
                f"{self.directory}: vocabulary hash {self.vocab_hash[:16]}… differs from the expected "
                f"{expected_vocab_hash[:16]}… (a store of another teacher/tokenizer)"
            )
        enc = self.manifest.get("encoding") or {}
        self.encoding = get_encoding(enc.get("name", ""), enc.get("params"))
        self.teacher = self.manifest.get("teacher", "")
        names = sorted(p.name for p in self.directory.iterdir() if SHARD_PATTERN.match(p.name))
        self.shards = [
            ShardReader(self.directory / name, self.encoding.value_width, self.encoding.position_width) for name in names
        ]
        counts = np.array([s.num_docs for s in self.shards], dtype=np.int64)
        self._shard_start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        chunk_counts = np.array([len(s.chunks) for s in self.shards], dtype=np.int64)
        self._chunk_start = np.concatenate([[0], np.cumsum(chunk_counts)]).astype(np.int64)
        self.num_documents = int(self._shard_start[-1])
        self._cache: OrderedDict = OrderedDict()
        self._cache_size = cache_chunks

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_cache"] = OrderedDict()
        return state

    @cached_property
    def vocab(self) -> TeacherVocab:
        path = self.directory / VOCAB_FILE
        if not path.is_file():
            raise UserError(f"{self.directory}: {VOCAB_FILE} is missing")
        vocab = vocab_from_bytes(path.read_bytes(), str(path))
        if vocab.hash != self.vocab_hash:
            raise UserError(f"{path} does not match the manifest's vocab_hash (corrupt or replaced)")
        return vocab

    @cached_property
    def trie(self) -> VocabTrie:
        return build_trie(self.vocab)

    def set_trie(self, trie: VocabTrie) -> None:
        self.__dict__["trie"] = trie

    def _locate(self, i: int) -> tuple[int, int]:
        if not 0 <= i < self.num_documents:
            raise IndexError(f"document {i} out of range (store has {self.num_documents})")
        s = int(np.searchsorted(self._shard_start, i, side="right") - 1)
        return s, i - int(self._shard_start[s])

    def _chunk(self, s: int, c: int):
        key = (s, c)
        data = self._cache.get(key)
        if data is None:
            data = self.shards[s].read_chunk(c)
            self._cache[key] = data
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return data

    def encoded_document(self, i: int) -> EncodedDocument:
        s, d = self._locate(i)
        entry = self.shards[s].docs[d]
        c = int(entry["chunk"])
        first = int(self.shards[s].chunks[c]["first_doc"])
        return self._chunk(s, c).document(d - first, int(entry["text_bytes"]))

    def document_tokens(self, i: int) -> np.ndarray:
        """Only the teacher token ids of document ``i`` (no values decoded)."""
        return self.encoded_document(i).token_ids.astype(np.int64)

    def document(self, i: int) -> StoredDocument:
        enc = self.encoded_document(i)
        token_ids = enc.token_ids.astype(np.int64)
        where = f"{self.directory.name}: document {i}"
        try:
            layout = stream_layout(self.trie, token_ids)
        except ValueError as exc:
            raise UserError(f"{where}: corrupt token ids ({exc})") from None
        if layout.num_values != len(enc.value_bytes) or layout.num_positions != len(enc.position_bytes):
            raise UserError(f"{where}: stored values do not match its tokens' supports (corrupt)")
        values = self.encoding.decode(enc.value_bytes, enc.position_bytes, layout.offsets)
        return StoredDocument(token_ids, layout, values, enc.dropped_mass.copy(), enc.text_bytes, enc.key)

    def document_chunks(self) -> np.ndarray:
        """(N,) global chunk number of every document."""
        parts = [s.docs["chunk"].astype(np.int64) + self._chunk_start[k] for k, s in enumerate(self.shards)]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def chunk_spans(self) -> list[tuple[int, int]]:
        """(first global document index, number of documents) of every chunk, in document order."""
        return [
            (start + int(chunk["first_doc"]), int(chunk["num_docs"]))
            for shard, start in zip(self.shards, self._shard_start.tolist())
            for chunk in shard.chunks
        ]

    def document_positions(self) -> np.ndarray:
        parts = [s.docs["positions"].astype(np.int64) for s in self.shards]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def stats(self) -> dict:
        docs = [s.docs for s in self.shards]
        total = lambda field: int(sum(int(d[field].sum()) for d in docs))  # noqa: E731
        size = sum(s.size for s in self.shards)
        for name in (MANIFEST, VOCAB_FILE):
            if (self.directory / name).exists():
                size += (self.directory / name).stat().st_size
        text = total("text_bytes")
        shard_bytes = sum(s.size for s in self.shards)
        return {
            "documents": self.num_documents,
            "text_bytes": text,
            "positions": total("positions"),
            "tokens": total("tokens"),
            "values": total("values"),
            "shards": len(self.shards),
            "chunks": int(self._chunk_start[-1]),
            "size_on_disk": size,
            "bytes_per_text_byte": size / text if text else None,
            "shard_bytes": shard_bytes,  # without the one-off manifest and vocabulary files
            "shard_bytes_per_text_byte": shard_bytes / text if text else None,
            "encoding": self.encoding.name,
            "encoding_params": self.encoding.params,
            "teacher": self.teacher,
            "vocab_hash": self.vocab_hash,
        }


class MultiStore(_StoreBase):
    """Several stores with the same vocabulary, read as one (documents in the given order)."""

    def __init__(self, stores: list[LogitStore]):
        if not stores:
            raise UserError("no logit stores given")
        first = stores[0]
        for other in stores[1:]:
            if other.vocab_hash != first.vocab_hash:
                raise UserError(
                    f"stores {first.directory} and {other.directory} have different vocabularies "
                    f"({first.vocab_hash[:12]}… vs {other.vocab_hash[:12]}…); they cannot be read together"
                )
        self.stores = list(stores)
        self.vocab_hash = first.vocab_hash
        counts = [s.num_documents for s in self.stores]
        self._start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_documents = int(self._start[-1])
        trie = first.trie
        for s in self.stores[1:]:
            s.set_trie(trie)

    @property
    def vocab(self) -> TeacherVocab:
        return self.stores[0].vocab

    @property
    def trie(self) -> VocabTrie:
        return self.stores[0].trie

    def _locate(self, i: int) -> tuple[LogitStore, int]:
        if not 0 <= i < self.num_documents:
            raise IndexError(f"document {i} out of range ({self.num_documents} documents)")
        k = int(np.searchsorted(self._start, i, side="right") - 1)
        return self.stores[k], i - int(self._start[k])

    def document(self, i: int) -> StoredDocument:
        store, j = self._locate(i)
        return store.document(j)

    def document_tokens(self, i: int) -> np.ndarray:
        store, j = self._locate(i)
        return store.document_tokens(j)

    def encoded_document(self, i: int) -> EncodedDocument:
        store, j = self._locate(i)
        return store.encoded_document(j)

    def document_chunks(self) -> np.ndarray:
        parts, offset = [], 0
        for s in self.stores:
            chunks = s.document_chunks()
            parts.append(chunks + offset)
            offset += int(s._chunk_start[-1])
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def chunk_spans(self) -> list[tuple[int, int]]:
        return [(int(start) + first, count) for s, start in zip(self.stores, self._start) for first, count in s.chunk_spans()]

    def document_positions(self) -> np.ndarray:
        return np.concatenate([s.document_positions() for s in self.stores])

    def stats(self) -> dict:
        each = [s.stats() for s in self.stores]
        out = {k: sum(e[k] for e in each) for k in ("documents", "text_bytes", "positions", "tokens", "values", "shards", "chunks", "size_on_disk", "shard_bytes")}
        out["bytes_per_text_byte"] = out["size_on_disk"] / out["text_bytes"] if out["text_bytes"] else None
        out["shard_bytes_per_text_byte"] = out["shard_bytes"] / out["text_bytes"] if out["text_bytes"] else None
        out["encoding"] = sorted({e["encoding"] for e in each})
        out["teacher"] = sorted({e["teacher"] for e in each})
        out["vocab_hash"] = self.vocab_hash
        return out


def open_stores(paths, expected_vocab_hash: str | None = None) -> MultiStore:
    """Open one or more store directories as one :class:`MultiStore`."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    return MultiStore([LogitStore(p, expected_vocab_hash=expected_vocab_hash) for p in paths])


def as_store(stores) -> LogitStore | MultiStore:
    """A store, a path, or a list of stores/paths → something with the reader API."""
    if isinstance(stores, (LogitStore, MultiStore)):
        return stores
    if isinstance(stores, (str, Path)):
        return LogitStore(stores)
    opened = [s if isinstance(s, LogitStore) else LogitStore(s) for s in stores]
    return opened[0] if len(opened) == 1 else MultiStore(opened)


def store_content_hash(directory_or_store) -> str:
    """SHA-256 over the vocabulary hash, the encoding, and every stored document in order
    (its counts, token ids, encoded values, dropped mass, text bytes and key): independent of
    how documents are split into shards and chunks, and of the compression level."""
    store = as_store(directory_or_store)
    stores = store.stores if isinstance(store, MultiStore) else [store]
    h = hashlib.sha256(b"bytedistill-store-content-v1\0")
    h.update(store.vocab_hash.encode())
    for s in stores:
        h.update(json.dumps(s.encoding.describe(), sort_keys=True).encode())
    for i in range(len(store)):
        d = store.encoded_document(i)
        key = None if d.key is None else d.key.encode("utf-8")
        h.update(struct.pack("<QQQQq", len(d.token_ids), len(d.value_bytes), d.num_positions, d.text_bytes, -1 if key is None else len(key)))
        for part in (d.token_ids.astype("<u4"), d.value_bytes, d.position_bytes, d.dropped_mass.astype("<f4")):
            h.update(np.ascontiguousarray(part).tobytes())
        h.update(key or b"")
    return h.hexdigest()
