"""A chunk: the raw bytes of a run of whole documents (FORMAT.md, "Shard file").

Arrays are stored as byte planes (all bytes 0 of every element, then all bytes 1, …), which is
what lets zstd compress them. Format 1 and 2 differ in the value section (2: the encoding packs
it, possibly entropy-coded, behind its length) and the dropped mass (1: float32, 2: bfloat16).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from bytestream.stream import StreamLayout
from common.errors import UserError
from logit_store.encodings import Encoding


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


def to_bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 → the upper 16 bits, rounded to nearest even (finite, non-negative inputs)."""
    bits = np.ascontiguousarray(values, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2")


def from_bfloat16(halves: np.ndarray) -> np.ndarray:
    return (halves.astype("<u4") << 16).view("<f4")


@dataclass
class EncodedDocument:
    """One document as stored: what the writer produces and the content hash reads."""

    token_ids: np.ndarray  # (m,) uint32
    value_bytes: np.ndarray  # (S, k) uint8
    position_bytes: np.ndarray  # (P, j) uint8
    dropped_mass: np.ndarray  # (m+1,) float32
    text_bytes: int
    key: str | None
    layout: StreamLayout | None = None  # its stream layout, where its chunk's contexts need it (not stored)
    roles: np.ndarray | None = None  # (P,) uint8: each target's role (version 4, a chat store)

    @property
    def num_positions(self) -> int:
        return len(self.position_bytes)

    def raw_size(self) -> int:
        return (
            4 * len(self.token_ids)
            + self.value_bytes.size
            + self.position_bytes.size
            + 4 * len(self.dropped_mass)
            + len((self.key or "").encode())
            + (0 if self.roles is None else len(self.roles))
        )


def build_chunk(
    docs: list[EncodedDocument], encoding: Encoding, version: int, contexts: np.ndarray | None = None
) -> bytes:
    """The chunk's raw bytes; ``contexts``: the (S,) model contexts of all its values, for an
    entropy-coded encoding (computed when the chunk is built, never kept per document; the coder
    chains them in place)."""
    tokens = [d.token_ids.astype("<u4").view(np.uint8).reshape(-1, 4) for d in docs]
    dropped = np.concatenate([d.dropped_mass for d in docs]).astype("<f4")
    if version == 1:
        values = shuffle_planes([d.value_bytes for d in docs], encoding.value_width)
        dropped_planes = shuffle_planes([dropped.view(np.uint8).reshape(-1, 4)], 4)
    else:
        packed = encoding.pack_values(np.concatenate([d.value_bytes for d in docs]), contexts)
        values = struct.pack("<Q", len(packed)) + packed
        dropped_planes = shuffle_planes([to_bfloat16(dropped).view(np.uint8).reshape(-1, 2)], 2)
    parts = [
        shuffle_planes(tokens, 4),
        values,
        shuffle_planes([d.position_bytes for d in docs], encoding.position_width),
        dropped_planes,
        b"".join((d.key or "").encode("utf-8") for d in docs),
    ]
    if version >= 4:  # a chat store: each target's role
        parts.append(b"".join(np.asarray(d.roles, np.uint8).tobytes() for d in docs))
    return b"".join(parts)


@dataclass
class ChunkData:
    """A decoded chunk, split into per-document pieces by the document table. Values are
    decoded on first use (reading only token ids never decodes them)."""

    token_ids: np.ndarray  # (T,) uint32, all documents
    decode_values: Callable[[], tuple[np.ndarray, list | None]]  # → (S, k) value bytes, layouts if it made them
    position_bytes: np.ndarray  # (P, j)
    dropped_mass: np.ndarray  # (T + n,) float32
    keys: bytes
    roles: np.ndarray | None  # (P,) uint8 (version 4), else None
    token_start: np.ndarray  # (n+1,) cumulative counts per document in the chunk
    value_start: np.ndarray
    position_start: np.ndarray
    key_start: np.ndarray
    key_length: np.ndarray

    @cached_property
    def _decoded(self) -> tuple[np.ndarray, list | None]:
        return self.decode_values()

    @property
    def value_bytes(self) -> np.ndarray:
        return self._decoded[0]

    def tokens(self, d: int) -> np.ndarray:
        return self.token_ids[self.token_start[d] : self.token_start[d + 1]]

    def document_roles(self, d: int) -> np.ndarray | None:
        """Document ``d``'s role per target (a chat store's; None in any other), no value decoded."""
        return None if self.roles is None else self.roles[self.position_start[d] : self.position_start[d + 1]]

    def document(self, d: int, text_bytes: int) -> EncodedDocument:
        t0, t1 = self.token_start[d], self.token_start[d + 1]
        key = None
        if self.key_length[d] >= 0:
            key = self.keys[self.key_start[d] : self.key_start[d + 1]].decode("utf-8", errors="replace")
        return EncodedDocument(
            token_ids=self.token_ids[t0:t1],
            value_bytes=self.value_bytes[self.value_start[d] : self.value_start[d + 1]],
            layout=None if self._decoded[1] is None else self._decoded[1][d],
            position_bytes=self.position_bytes[self.position_start[d] : self.position_start[d + 1]],
            dropped_mass=self.dropped_mass[t0 + d : t1 + d + 1],
            text_bytes=int(text_bytes),
            key=key,
            roles=None if self.roles is None else self.roles[self.position_start[d] : self.position_start[d + 1]],
        )


LayoutOf = Callable[[np.ndarray], StreamLayout]  # token ids → stream layout (ValueError if impossible)


def parse_chunk(
    raw: bytes, docs: np.ndarray, encoding: Encoding, version: int, layout_of: LayoutOf | None, where: str
) -> ChunkData:
    """Split a chunk's raw bytes by its documents' table entries; every length is checked
    against ``raw`` before it is used."""
    n = len(docs)
    counts = {
        name: np.concatenate([[0], np.cumsum(docs[name].astype(np.int64))])
        for name in ("tokens", "values", "positions")
    }
    key_length = docs["key_length"].astype(np.int64)
    key_start = np.concatenate([[0], np.cumsum(np.maximum(key_length, 0))])
    t, s, p = int(counts["tokens"][-1]), int(counts["values"][-1]), int(counts["positions"][-1])
    k, j = encoding.value_width, encoding.position_width
    view = memoryview(raw)

    def take(size: int, what: str) -> memoryview:
        nonlocal at
        if size < 0 or at + size > len(raw):
            raise UserError(f"{where}: corrupt ({what} runs past the chunk's end)")
        at += size
        return view[at - size : at]

    at = 0
    tokens = unshuffle_planes(take(4 * t, "token ids"), t, 4).view("<u4").reshape(-1)
    if version == 1:
        section = take(s * k, "values")

        def decode_values() -> tuple[np.ndarray, None]:
            return unshuffle_planes(section, s, k), None
    else:
        (packed_length,) = struct.unpack("<Q", take(8, "value length"))
        section = take(packed_length, "values")

        def decode_values() -> tuple[np.ndarray, list | None]:
            if not encoding.needs_contexts:
                return encoding.unpack_values(section, s, None, where), None
            layouts = _chunk_layouts(tokens, counts, layout_of, where)
            return encoding.unpack_values(section, s, layouts, where), layouts

    positions = unshuffle_planes(take(p * j, "positions"), p, j)
    if version == 1:
        dropped = unshuffle_planes(take(4 * (t + n), "dropped mass"), t + n, 4).view("<f4").reshape(-1)
    else:
        halves = unshuffle_planes(take(2 * (t + n), "dropped mass"), t + n, 2).view("<u2").reshape(-1)
        dropped = from_bfloat16(halves)
    keys = bytes(take(int(key_start[-1]), "keys"))
    roles = np.frombuffer(take(p, "roles"), np.uint8) if version >= 4 else None
    if roles is not None and len(roles) and int(roles.max()) > 3:
        raise UserError(f"{where}: corrupt (a role above 3)")
    if at != len(raw):
        raise UserError(f"{where}: corrupt (its size does not match its documents)")
    return ChunkData(
        token_ids=tokens,
        decode_values=decode_values,
        position_bytes=positions,
        dropped_mass=dropped,
        keys=keys,
        roles=roles,
        token_start=counts["tokens"],
        value_start=counts["values"],
        position_start=counts["positions"],
        key_start=key_start,
        key_length=key_length,
    )


def _chunk_layouts(tokens: np.ndarray, counts: dict, layout_of: LayoutOf | None, where: str) -> list[StreamLayout]:
    """The stream layout of every document (each checked against its value count)."""
    if layout_of is None:
        raise ValueError("an entropy-coded chunk needs the vocabulary to be decoded")
    layouts = []
    for d in range(len(counts["tokens"]) - 1):
        expected = int(counts["values"][d + 1] - counts["values"][d])
        try:
            layout = layout_of(tokens[counts["tokens"][d] : counts["tokens"][d + 1]])
        except ValueError as exc:
            raise UserError(f"{where}: corrupt token ids ({exc})") from None
        if layout.num_values != expected:
            raise UserError(
                f"{where}: corrupt token ids ({layout.num_values} values in its supports, the index says {expected})"
            )
        layouts.append(layout)
    return layouts
