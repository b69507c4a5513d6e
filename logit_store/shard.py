"""The shard file (``shard-RRRRR-NNNNN.bds``): chunks of whole documents, an index, a trailer.

Layout (all integers little-endian; FORMAT.md is the normative description)::

    header   16 B   b"BDSHARD\\0", u32 format version, u32 0
    chunk 0  zstd frame (content checksum on) of the chunk's raw bytes
    ...
    index    chunk table (CHUNK_DTYPE × num_chunks) then document table (DOC_DTYPE × num_docs)
    trailer  64 B   u64 index offset, u64 index length, u64 num_chunks, u64 num_docs,
                    16 B blake2b(index), 8 B blake2b(first 48 trailer bytes), b"BDSHEND\\0"

A chunk's raw bytes are byte planes over all its documents, in this order: token ids (uint32,
4 planes), value bytes (k planes), position bytes (j planes), dropped mass (float32, 4 planes,
m+1 per document), then the documents' keys (UTF-8, concatenated).
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import zstandard

from distill.errors import UserError

FORMAT_VERSION = 1
SHARD_MAGIC = b"BDSHARD\0"
TRAILER_MAGIC = b"BDSHEND\0"
HEADER_SIZE = 16
TRAILER_SIZE = 64

CHUNK_DTYPE = np.dtype(
    [("offset", "<u8"), ("length", "<u8"), ("raw_length", "<u8"), ("first_doc", "<u8"),
     ("num_docs", "<u8"), ("checksum", "V16")]
)  # fmt: skip
DOC_DTYPE = np.dtype(
    [("chunk", "<u8"), ("tokens", "<u8"), ("values", "<u8"), ("positions", "<u8"),
     ("text_bytes", "<u8"), ("key_length", "<i8")]
)  # fmt: skip


def checksum(data: bytes, size: int = 16) -> bytes:
    return hashlib.blake2b(data, digest_size=size).digest()


def shuffle_planes(arrays: list[np.ndarray], width: int) -> bytes:
    """Concatenate (n_i, width) uint8 arrays and write them column by column (byte planes)."""
    if width == 0:
        return b""
    stacked = np.concatenate([a.reshape(-1, width) for a in arrays]) if arrays else np.zeros((0, width), np.uint8)
    return np.ascontiguousarray(stacked.T).tobytes()


def unshuffle_planes(buffer: memoryview, count: int, width: int) -> np.ndarray:
    if width == 0:
        return np.zeros((count, 0), np.uint8)
    planes = np.frombuffer(buffer, dtype=np.uint8, count=count * width).reshape(width, count)
    return np.ascontiguousarray(planes.T)


@dataclass
class EncodedDocument:
    """One document as stored: what the writer produces and the content hash reads."""

    token_ids: np.ndarray  # (m,) uint32
    value_bytes: np.ndarray  # (S, k) uint8
    position_bytes: np.ndarray  # (P, j) uint8
    dropped_mass: np.ndarray  # (m+1,) float32
    text_bytes: int
    key: str | None

    @property
    def num_positions(self) -> int:
        return len(self.position_bytes)

    def raw_size(self) -> int:
        return (
            4 * len(self.token_ids) + self.value_bytes.size + self.position_bytes.size
            + 4 * len(self.dropped_mass) + len((self.key or "").encode())
        )  # fmt: skip


def build_chunk(docs: list[EncodedDocument], value_width: int, position_width: int) -> bytes:
    tokens = [d.token_ids.astype("<u4").view(np.uint8).reshape(-1, 4) for d in docs]
    dropped = [d.dropped_mass.astype("<f4").view(np.uint8).reshape(-1, 4) for d in docs]
    parts = [
        shuffle_planes(tokens, 4),
        shuffle_planes([d.value_bytes for d in docs], value_width),
        shuffle_planes([d.position_bytes for d in docs], position_width),
        shuffle_planes(dropped, 4),
        b"".join((d.key or "").encode("utf-8") for d in docs),
    ]
    return b"".join(parts)


class ShardFile:
    """Writes one shard to ``<final>.tmp``; :meth:`finish` appends the index and renames it."""

    def __init__(self, final_path: Path, compression_level: int):
        self.final_path = Path(final_path)
        self.tmp_path = self.final_path.with_name(self.final_path.name + ".tmp")
        self._file = open(self.tmp_path, "wb")
        self._file.write(SHARD_MAGIC + struct.pack("<II", FORMAT_VERSION, 0))
        self._offset = HEADER_SIZE
        self._compressor = zstandard.ZstdCompressor(level=compression_level, write_checksum=True, threads=0)
        self.chunks: list[tuple] = []
        self.docs: list[tuple] = []

    @property
    def num_docs(self) -> int:
        return len(self.docs)

    @property
    def bytes_written(self) -> int:
        return self._offset

    def write_chunk(self, docs: list[EncodedDocument], value_width: int, position_width: int) -> None:
        raw = build_chunk(docs, value_width, position_width)
        frame = self._compressor.compress(raw)
        chunk = len(self.chunks)
        self.chunks.append((self._offset, len(frame), len(raw), len(self.docs), len(docs), checksum(frame)))
        for d in docs:
            key_length = -1 if d.key is None else len(d.key.encode("utf-8"))
            self.docs.append((chunk, len(d.token_ids), len(d.value_bytes), d.num_positions, d.text_bytes, key_length))
        self._file.write(frame)
        self._offset += len(frame)

    def finish(self) -> None:
        index = np.array(self.chunks, dtype=CHUNK_DTYPE).tobytes() + np.array(self.docs, dtype=DOC_DTYPE).tobytes()
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


@dataclass
class ChunkData:
    """A decompressed chunk, split into per-document pieces by the document table."""

    token_ids: np.ndarray  # (T,) uint32, all documents
    value_bytes: np.ndarray  # (S, k)
    position_bytes: np.ndarray  # (P, j)
    dropped_mass: np.ndarray  # (T + n,) float32
    keys: bytes
    token_start: np.ndarray  # (n+1,) cumulative counts per document in the chunk
    value_start: np.ndarray
    position_start: np.ndarray
    key_start: np.ndarray
    key_length: np.ndarray

    def document(self, d: int, text_bytes: int) -> EncodedDocument:
        t0, t1 = self.token_start[d], self.token_start[d + 1]
        key = None
        if self.key_length[d] >= 0:
            key = self.keys[self.key_start[d] : self.key_start[d + 1]].decode("utf-8", errors="replace")
        return EncodedDocument(
            token_ids=self.token_ids[t0:t1],
            value_bytes=self.value_bytes[self.value_start[d] : self.value_start[d + 1]],
            position_bytes=self.position_bytes[self.position_start[d] : self.position_start[d + 1]],
            dropped_mass=self.dropped_mass[t0 + d : t1 + d + 1],
            text_bytes=int(text_bytes),
            key=key,
        )


class ShardReader:
    """The index of one complete shard (read and checked on open) and access to its chunks."""

    def __init__(self, path: Path, value_width: int, position_width: int):
        self.path = Path(path)
        self.name = self.path.name
        self.value_width = value_width
        self.position_width = position_width
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as handle:
                header = handle.read(HEADER_SIZE)
                if size < HEADER_SIZE + TRAILER_SIZE:
                    raise UserError(f"shard {self.name} is truncated ({size} bytes, no room for its footer)")
                handle.seek(size - TRAILER_SIZE)
                trailer = handle.read(TRAILER_SIZE)
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
                if version != FORMAT_VERSION:
                    raise UserError(f"shard {self.name}: unknown shard format version {version} (this reader knows {FORMAT_VERSION})")
                offset, length, num_chunks, num_docs = struct.unpack("<QQQQ", head[:32])
                expected = num_chunks * CHUNK_DTYPE.itemsize + num_docs * DOC_DTYPE.itemsize
                if offset + length + TRAILER_SIZE != size or length != expected:
                    raise UserError(f"shard {self.name}: index/footer corrupt (index bounds do not match the file)")
                handle.seek(offset)
                index = handle.read(length)
        except OSError as exc:
            raise UserError(f"cannot read shard {self.path}: {exc.strerror or exc}") from None
        if checksum(index) != head[32:48]:
            raise UserError(f"shard {self.name}: index/footer corrupt (index checksum mismatch)")
        split = num_chunks * CHUNK_DTYPE.itemsize
        self.chunks = np.frombuffer(index[:split], dtype=CHUNK_DTYPE)
        self.docs = np.frombuffer(index[split:], dtype=DOC_DTYPE)
        self.index_offset = offset
        self.size = size
        self._check_index()

    def _check_index(self) -> None:
        end = HEADER_SIZE
        for c, chunk in enumerate(self.chunks):
            first, n = int(chunk["first_doc"]), int(chunk["num_docs"])
            if int(chunk["offset"]) != end or first + n > len(self.docs) or n == 0:
                raise UserError(f"shard {self.name}: index/footer corrupt (chunk {c} entry inconsistent)")
            if np.any(self.docs["chunk"][first : first + n] != c):
                raise UserError(f"shard {self.name}: index/footer corrupt (documents of chunk {c} inconsistent)")
            end += int(chunk["length"])
        if end != self.index_offset or int(self.chunks["num_docs"].sum()) != len(self.docs):
            raise UserError(f"shard {self.name}: index/footer corrupt (chunks do not tile the file)")

    @property
    def num_docs(self) -> int:
        return len(self.docs)

    def read_chunk(self, c: int) -> ChunkData:
        chunk = self.chunks[c]
        where = f"shard {self.name} chunk {c}"
        try:
            with open(self.path, "rb") as handle:
                handle.seek(int(chunk["offset"]))
                frame = handle.read(int(chunk["length"]))
        except OSError as exc:
            raise UserError(f"cannot read {where}: {exc.strerror or exc}") from None
        if len(frame) != int(chunk["length"]):
            raise UserError(f"{where}: truncated")
        if checksum(frame) != bytes(chunk["checksum"]):
            raise UserError(f"{where}: corrupt (checksum mismatch)")
        try:
            raw = zstandard.ZstdDecompressor().decompress(frame, max_output_size=int(chunk["raw_length"]))
        except zstandard.ZstdError as exc:
            raise UserError(f"{where}: corrupt (zstd: {exc})") from None
        if len(raw) != int(chunk["raw_length"]):
            raise UserError(f"{where}: corrupt (decompressed size differs from the index)")
        first, n = int(chunk["first_doc"]), int(chunk["num_docs"])
        docs = self.docs[first : first + n]
        counts = {name: np.concatenate([[0], np.cumsum(docs[name].astype(np.int64))]) for name in ("tokens", "values", "positions")}
        key_length = docs["key_length"].astype(np.int64)
        key_start = np.concatenate([[0], np.cumsum(np.maximum(key_length, 0))])
        t, s, p = int(counts["tokens"][-1]), int(counts["values"][-1]), int(counts["positions"][-1])
        expected = 4 * t + s * self.value_width + p * self.position_width + 4 * (t + n) + int(key_start[-1])
        if expected != len(raw):
            raise UserError(f"{where}: corrupt (its size does not match its documents)")
        view = memoryview(raw)
        at = 0
        tokens = unshuffle_planes(view[at:], t, 4).view("<u4").reshape(-1)
        at += 4 * t
        values = unshuffle_planes(view[at:], s, self.value_width)
        at += s * self.value_width
        positions = unshuffle_planes(view[at:], p, self.position_width)
        at += p * self.position_width
        dropped = unshuffle_planes(view[at:], t + n, 4).view("<f4").reshape(-1)
        at += 4 * (t + n)
        return ChunkData(
            token_ids=tokens, value_bytes=values, position_bytes=positions, dropped_mass=dropped,
            keys=bytes(view[at:]), token_start=counts["tokens"], value_start=counts["values"],
            position_start=counts["positions"], key_start=key_start, key_length=key_length,
        )  # fmt: skip
