"""``vocab.bin``: the teacher vocabulary a store was written with (FORMAT.md, "vocab.bin").

Reading is bounded: the zstd frame's declared content size is checked against a cap before
anything is decompressed, and every length inside is checked against the decompressed body.
"""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np
import zstandard

from bytestream.vocab import TeacherVocab
from common.errors import UserError

VOCAB_MAGIC = b"BDVOCAB\0"
MAX_VOCAB_BODY = 64 << 20  # decompressed vocabulary bytes (Llama-3's is 1.6 MB)
MAX_VOCAB_SIZE = 1 << 22
MAX_TOKEN_BYTES = (
    1 << 16
)  # a bound on what a (crafted) vocab.bin may declare; the kernels size their buffers from the vocabulary


def vocab_to_bytes(vocab: TeacherVocab) -> bytes:
    header = json.dumps(
        {
            "name": vocab.name,
            "family": vocab.family,
            "size": vocab.size,
            "special_ids": list(vocab.special_ids),
            "end_of_text_ids": list(vocab.end_of_text_ids),
            "prefix_ids": list(vocab.prefix_ids),
            "adds_prefix_space": vocab.adds_prefix_space,
        }
        | ({"kept_ids": list(vocab.kept_ids)} if vocab.kept_ids else {}),
        sort_keys=True,
    ).encode()
    lengths = np.array([len(b) for b in vocab.token_bytes], dtype="<u4").tobytes()
    body = struct.pack("<I", len(header)) + header + lengths + b"".join(vocab.token_bytes)
    packed = zstandard.ZstdCompressor(level=9).compress(body)
    return VOCAB_MAGIC + packed + hashlib.blake2b(body, digest_size=16).digest()


def decompress_bounded(frame: bytes, limit: int, where: str) -> bytes:
    """Decompress one zstd frame whose content may not exceed ``limit`` bytes, checking the
    size the frame declares before zstd allocates it."""
    try:
        declared = zstandard.frame_content_size(frame)
    except zstandard.ZstdError:
        raise UserError(f"{where} is corrupt (not a zstd frame)") from None
    if declared > limit:
        raise UserError(f"{where} is corrupt (declares {declared:,} bytes, more than {limit:,})")
    try:
        return zstandard.ZstdDecompressor().decompress(frame, max_output_size=limit)
    except zstandard.ZstdError as exc:
        raise UserError(f"{where} is corrupt (zstd: {exc})") from None


def vocab_from_bytes(data: bytes, where: str) -> TeacherVocab:
    if data[:8] != VOCAB_MAGIC or len(data) < 28:
        raise UserError(f"{where} is not a bytedistill vocabulary file")
    body = decompress_bounded(data[8:-16], MAX_VOCAB_BODY, where)
    if hashlib.blake2b(body, digest_size=16).digest() != data[-16:]:
        raise UserError(f"{where} is corrupt (checksum mismatch)")
    try:
        return _parse_body(body)
    except (ValueError, KeyError, TypeError, struct.error, RecursionError) as exc:
        raise UserError(f"{where} is corrupt ({exc})") from None


def _parse_body(body: bytes) -> TeacherVocab:
    (header_len,) = struct.unpack("<I", body[:4])
    if 4 + header_len > len(body):
        raise ValueError("header longer than the file")
    header = json.loads(body[4 : 4 + header_len])
    size = int(header["size"])
    at = 4 + header_len
    if not 0 < size <= MAX_VOCAB_SIZE or at + 4 * size > len(body):
        raise ValueError(f"vocabulary size {size} does not fit the file")
    lengths = np.frombuffer(body[at : at + 4 * size], dtype="<u4").astype(np.int64)
    at += 4 * size
    if at + int(lengths.sum()) != len(body):
        raise ValueError("token byte lengths do not match the file")
    if size and int(lengths.max()) > MAX_TOKEN_BYTES:
        raise ValueError(f"a token of {int(lengths.max())} bytes (at most {MAX_TOKEN_BYTES} are supported)")
    ends = at + np.cumsum(lengths)
    starts = ends - lengths
    token_bytes = tuple(body[s:e] for s, e in zip(starts.tolist(), ends.tolist()))
    ids = [int(i) for key in ("special_ids", "end_of_text_ids", "prefix_ids") for i in header[key]]
    if any(not 0 <= i < size for i in ids):
        raise ValueError("a special id outside the vocabulary")
    kept = tuple(int(i) for i in header.get("kept_ids", ()))
    if any(i not in set(header["special_ids"]) for i in kept):
        raise ValueError("a kept id that is not special")
    return TeacherVocab(
        token_bytes=token_bytes,
        special_ids=tuple(header["special_ids"]),
        end_of_text_ids=tuple(header["end_of_text_ids"]),
        family=str(header["family"]),
        prefix_ids=tuple(header["prefix_ids"]),
        name=str(header["name"]),
        adds_prefix_space=bool(header["adds_prefix_space"]),
        kept_ids=kept,
    )
