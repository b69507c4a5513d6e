"""The shard file (``shard-RRRRR-NNNNN.bds``): chunks of whole documents, an index, a trailer.

Layout (all integers little-endian; FORMAT.md is the normative description)::

    header   16 B   b"BDSHARD\\0", u32 format version (1, 2 or 3: the manifest's), u32 0
    chunk 0  zstd frame (content checksum on) of the chunk's raw bytes (logit_store/chunk.py)
    ...
    index    [v2: shard record, 32 B] chunk table (CHUNK_DTYPE × num_chunks),
             document table (DOC_DTYPE × num_docs)
    trailer  64 B   u64 index offset, u64 index length, u64 num_chunks, u64 num_docs,
                    16 B blake2b(index), 8 B blake2b(first 48 trailer bytes), b"BDSHEND\\0"

Every size read from a file is checked against the file, the index and a cap before anything
is allocated; the zstd frame's declared content size must equal the index's raw length.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol

import numpy as np
import zstandard

from common.errors import UserError
from common.files import open_regular
from logit_store.chunk import (
    ChunkData,
    EncodedDocument,
    LayoutOf,
    build_chunk,
    parse_chunk,
)
from logit_store.encodings import Encoding
from logit_store.file_names import PARTIAL_SHARD
from logit_store.manifest import FORMAT_VERSION, READABLE_VERSIONS
from logit_store.vocab_file import decompress_bounded

SHARD_MAGIC = b"BDSHARD\0"
TRAILER_MAGIC = b"BDSHEND\0"
HEADER_SIZE = 16
TRAILER_SIZE = 64
MAX_CHUNK_RAW = 1 << 28  # raw bytes of one chunk: a writer refuses more, a reader never allocates more

CHUNK_DTYPE = np.dtype(
    [
        ("offset", "<u8"),
        ("length", "<u8"),
        ("raw_length", "<u8"),
        ("first_doc", "<u8"),
        ("num_docs", "<u8"),
        ("checksum", "V16"),
    ]
)
DOC_DTYPE = np.dtype(
    [
        ("chunk", "<u8"),
        ("tokens", "<u8"),
        ("values", "<u8"),
        ("positions", "<u8"),
        ("text_bytes", "<u8"),
        ("key_length", "<i8"),
    ]
)
# v2: who wrote the shard, where it sits in the writer's sequence, and for which manifest
RECORD_DTYPE = np.dtype([("writer_id", "<u4"), ("sequence", "<u4"), ("first_document", "<u8"), ("identity", "V16")])


def checksum(data: bytes, size: int = 16) -> bytes:
    return hashlib.blake2b(data, digest_size=size).digest()


@dataclass(frozen=True)
class CodedChunk:
    """A chunk ready to be appended: its documents and its zstd frame."""

    docs: list[EncodedDocument]
    frame: bytes
    raw_length: int


@dataclass(frozen=True)
class ShardRecord:
    writer_id: int
    sequence: int
    first_document: int  # documents of this writer in its earlier shards
    identity: bytes  # manifest.identity_hash of the store it was written for


class ShardFile:
    """Writes one shard to ``<final>.tmp``; :meth:`finish` appends the index and renames it."""

    def __init__(
        self,
        final_path: Path,
        compression_level: int,
        record: ShardRecord,
        encoding: Encoding,
        version: int = FORMAT_VERSION,
    ):
        self.final_path = Path(final_path)
        self.version = version
        self.tmp_path = self.final_path.with_name(PARTIAL_SHARD(record.writer_id, record.sequence))
        self.record = record
        self.encoding = encoding
        self._file = open(self.tmp_path, "wb")  # noqa: SIM115 - open until finish() or abandon()
        self._file.write(SHARD_MAGIC + struct.pack("<II", version, 0))
        self._offset = HEADER_SIZE
        self.compression_level = compression_level
        self.chunks: list[tuple] = []
        self.docs: list[tuple] = []

    @property
    def num_docs(self) -> int:
        return len(self.docs)

    def code_chunk(self, docs: list[EncodedDocument], contexts: np.ndarray | None = None) -> CodedChunk:
        """The chunk of ``docs`` built and compressed; touches nothing of the shard's, so that
        several chunks may be coded at once on other threads (each with its own compressor)."""
        raw = build_chunk(docs, self.encoding, self.version, contexts)
        if len(raw) > MAX_CHUNK_RAW:
            raise UserError(
                f"a chunk of {len(raw):,} raw bytes exceeds the format's {MAX_CHUNK_RAW:,} (a document too long)"
            )
        compressor = zstandard.ZstdCompressor(level=self.compression_level, write_checksum=True, threads=0)
        return CodedChunk(docs, compressor.compress(raw), len(raw))

    def write_coded(self, coded: CodedChunk) -> None:
        """Append a coded chunk (chunks go in the order they are appended) and index its documents."""
        docs, frame = coded.docs, coded.frame
        chunk = len(self.chunks)
        self.chunks.append((self._offset, len(frame), coded.raw_length, len(self.docs), len(docs), checksum(frame)))
        for d in docs:
            key_length = -1 if d.key is None else len(d.key.encode("utf-8"))
            self.docs.append((chunk, len(d.token_ids), len(d.value_bytes), d.num_positions, d.text_bytes, key_length))
        self._file.write(frame)
        self._offset += len(frame)

    def finish(self) -> None:
        r = self.record
        record = np.array([(r.writer_id, r.sequence, r.first_document, r.identity)], dtype=RECORD_DTYPE).tobytes()
        tables = np.array(self.chunks, dtype=CHUNK_DTYPE).tobytes() + np.array(self.docs, dtype=DOC_DTYPE).tobytes()
        index = record + tables
        head = struct.pack("<QQQQ", self._offset, len(index), len(self.chunks), len(self.docs)) + checksum(index)
        self._file.write(index + head + checksum(head, 8) + TRAILER_MAGIC)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.tmp_path, self.final_path)
        fsync_directory(self.final_path.parent)

    def abandon(self) -> None:
        """Close without finishing: the ``.tmp`` file stays, as after a crash."""
        if not self._file.closed:
            self._file.close()


def fsync_directory(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _index_in_ends(ends: bytes, size: int, offset: int, length: int) -> bytes:
    """The index a trailer places at ``offset`` of a ``size``-byte file, read from the file's ends
    (header, index, trailer); empty if the ends do not hold it there."""
    tail = ends[HEADER_SIZE:-TRAILER_SIZE]
    return tail[len(tail) - length :] if offset == size - TRAILER_SIZE - length and length <= len(tail) else b""


class RemoteShard(Protocol):
    """A shard not yet on disk: its size and ends (header, index, trailer) known, its bytes fetched
    (and checked) on first read."""

    size: int
    ends: bytes

    def local_path(self) -> Path: ...


class ShardReader:
    """The index of one complete shard (read and checked on open) and access to its chunks. A
    ``remote`` shard's index is read from its known ends, its chunks from the file it fetches."""

    def __init__(self, path: Path, encoding: Encoding, remote: RemoteShard | None = None):
        self.path = Path(path)
        self.name = self.path.name
        self.encoding = encoding
        self.remote = remote
        if remote is None:
            size, header, trailer, read_index = self._ends_on_disk()
        else:
            size, header, trailer = remote.size, remote.ends[:HEADER_SIZE], remote.ends[-TRAILER_SIZE:]
            read_index = partial(_index_in_ends, remote.ends, size)
        try:
            head, index = self._read_index(size, header, trailer, read_index)
        except OSError as exc:
            raise UserError(f"cannot read shard {self.path}: {exc.strerror or exc}") from None
        self._parse_index(head, index)
        self.size = size
        self._check_index()

    def _ends_on_disk(self):
        try:
            size = self.path.stat().st_size
            with open_regular(self.path) as handle:
                header = handle.read(HEADER_SIZE)
                handle.seek(max(0, size - TRAILER_SIZE))
                trailer = handle.read(TRAILER_SIZE)
        except OSError as exc:
            raise UserError(f"cannot read shard {self.path}: {exc.strerror or exc}") from None

        def read_index(offset: int, length: int) -> bytes:
            with open_regular(self.path) as handle:
                handle.seek(offset)
                return handle.read(length)

        return size, header, trailer, read_index

    def _read_index(self, size: int, header: bytes, trailer: bytes, read_index) -> tuple[bytes, bytes]:
        """The trailer's first 48 bytes and the index, each checked against the file's size."""
        if size < HEADER_SIZE + TRAILER_SIZE:
            raise UserError(f"shard {self.name} is truncated ({size} bytes, no room for its footer)")
        if trailer[-8:] != TRAILER_MAGIC:
            raise UserError(
                f"shard {self.name} is truncated or its footer is corrupt (no end marker in the last bytes)"
            )
        if header[:8] != SHARD_MAGIC:
            raise UserError(f"shard {self.name}: header corrupt (not a bytedistill shard)")
        version = struct.unpack("<I", header[8:12])[0]
        head = trailer[:48]
        if checksum(head, 8) != trailer[48:56]:
            raise UserError(f"shard {self.name}: index/footer corrupt (footer checksum mismatch)")
        if version not in READABLE_VERSIONS:
            known = ", ".join(map(str, READABLE_VERSIONS))
            raise UserError(f"shard {self.name}: unknown shard format version {version} (this reader knows {known})")
        offset, length, num_chunks, num_docs = struct.unpack("<QQQQ", head[:32])
        record_size = RECORD_DTYPE.itemsize if version >= 2 else 0
        expected = record_size + num_chunks * CHUNK_DTYPE.itemsize + num_docs * DOC_DTYPE.itemsize
        if offset + length + TRAILER_SIZE != size or length != expected:
            raise UserError(f"shard {self.name}: index/footer corrupt (index bounds do not match the file)")
        index = read_index(offset, length)
        if checksum(index) != head[32:48]:
            raise UserError(f"shard {self.name}: index/footer corrupt (index checksum mismatch)")
        self.version = version
        return head, index

    def _parse_index(self, head: bytes, index: bytes) -> None:
        offset, _, num_chunks, _ = struct.unpack("<QQQQ", head[:32])
        record_size = RECORD_DTYPE.itemsize if self.version >= 2 else 0
        self.record = None
        if self.version >= 2:
            r = np.frombuffer(index[:record_size], dtype=RECORD_DTYPE)[0]
            self.record = ShardRecord(
                int(r["writer_id"]), int(r["sequence"]), int(r["first_document"]), bytes(r["identity"])
            )
        split = record_size + num_chunks * CHUNK_DTYPE.itemsize
        self.chunks = np.frombuffer(index[record_size:split], dtype=CHUNK_DTYPE)
        self.docs = np.frombuffer(index[split:], dtype=DOC_DTYPE)
        self.index_offset = offset

    def _check_index(self) -> None:
        end = HEADER_SIZE
        for c, chunk in enumerate(self.chunks):
            first, n = int(chunk["first_doc"]), int(chunk["num_docs"])
            if int(chunk["offset"]) != end or first + n > len(self.docs) or n == 0:
                raise UserError(f"shard {self.name}: index/footer corrupt (chunk {c} entry inconsistent)")
            if np.any(self.docs["chunk"][first : first + n] != c):
                raise UserError(f"shard {self.name}: index/footer corrupt (documents of chunk {c} inconsistent)")
            if int(chunk["raw_length"]) > MAX_CHUNK_RAW:
                raise UserError(f"shard {self.name}: index/footer corrupt (chunk {c} larger than the format allows)")
            docs = self.docs[first : first + n]
            sizes = [docs[f].astype(np.uint64) for f in ("tokens", "values", "positions", "text_bytes")]
            keys = docs["key_length"]
            bad_keys = (keys < -1) | (keys > MAX_CHUNK_RAW) | ((keys == 0) & (self.version >= 2))  # v2: no empty keys
            if any(np.any(x > MAX_CHUNK_RAW) for x in sizes) or np.any(bad_keys):
                raise UserError(f"shard {self.name}: index/footer corrupt (document sizes of chunk {c} out of range)")
            end += int(chunk["length"])
        if end != self.index_offset or int(self.chunks["num_docs"].sum()) != len(self.docs):
            raise UserError(f"shard {self.name}: index/footer corrupt (chunks do not tile the file)")

    @property
    def num_docs(self) -> int:
        return len(self.docs)

    def read_chunk(self, c: int, layout_of: LayoutOf | None = None) -> ChunkData:
        chunk = self.chunks[c]
        where = f"shard {self.name} chunk {c}"
        try:
            path = self.path if self.remote is None else self.remote.local_path()
            with open_regular(path) as handle:
                handle.seek(int(chunk["offset"]))
                frame = handle.read(int(chunk["length"]))
        except OSError as exc:
            raise UserError(f"cannot read {where}: {exc.strerror or exc}") from None
        if len(frame) != int(chunk["length"]):
            raise UserError(f"{where}: truncated")
        if checksum(frame) != bytes(chunk["checksum"]):
            raise UserError(f"{where}: corrupt (checksum mismatch)")
        raw_length = int(chunk["raw_length"])
        try:
            declared = zstandard.frame_content_size(frame)
        except zstandard.ZstdError:
            raise UserError(f"{where}: corrupt (not a zstd frame)") from None
        if declared != raw_length:
            raise UserError(f"{where}: corrupt (frame size {declared} differs from the index's {raw_length})")
        raw = decompress_bounded(frame, raw_length, where)
        if len(raw) != raw_length:
            raise UserError(f"{where}: corrupt (decompressed size differs from the index)")
        first, n = int(chunk["first_doc"]), int(chunk["num_docs"])
        return parse_chunk(raw, self.docs[first : first + n], self.encoding, self.version, layout_of, where)
