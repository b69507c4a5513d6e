"""Fuzz the store reader: random mutations of a small store's files (bit flips, truncations,
splices, inserted bytes, and crafted indexes, frames and vocabularies with valid checksums),
each read in a subprocess under an address-space limit and a per-case alarm. Every case must end
in a ``UserError`` naming the damaged file (or the manifest), or read exactly the original data;
never another exception, a crash, a hang or a large allocation."""

from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zstandard

from common.errors import UserError
from logit_store import LogitStore, StoreIdentity, StoreWriter
from logit_store.shard import CHUNK_DTYPE, DOC_DTYPE, RECORD_DTYPE, TRAILER_MAGIC
from tests.store_data import tiny_documents, tiny_vocab

V1_STORE = Path(__file__).parent / "data" / "store-v1"
CASES_PER_STORE = 1000
MEMORY_HEADROOM = 1 << 30  # bytes of address space a case may add to the warmed-up process
SECONDS_PER_CASE = 20
INTERESTING = (0, 1, 2, 255, 256, 65535, 1 << 31, (1 << 32) - 1, 1 << 32, 1 << 40, (1 << 63) - 1, (1 << 64) - 1)


def read_all(directory: Path) -> list:
    store = LogitStore(directory)
    out = []
    for i in range(len(store)):
        d = store.document(i)
        out.append((d.token_ids.tobytes(), d.values.tobytes(), d.dropped_mass.tobytes(), d.key, d.text_bytes))
    return out


# -------------------------------------------------------------- crafted files with valid checksums


def _blake(data: bytes, size: int = 16) -> bytes:
    return hashlib.blake2b(data, digest_size=size).digest()


def split_shard(data: bytes):
    offset, length, num_chunks, _ = struct.unpack("<QQQQ", data[-64:-32])
    version = struct.unpack("<I", data[8:12])[0]
    index = data[offset : offset + length]
    at = RECORD_DTYPE.itemsize if version >= 2 else 0
    record, index = index[:at], index[at:]
    chunks = np.frombuffer(index[: num_chunks * CHUNK_DTYPE.itemsize], CHUNK_DTYPE).copy()
    docs = np.frombuffer(index[num_chunks * CHUNK_DTYPE.itemsize :], DOC_DTYPE).copy()
    frames = [data[int(c["offset"]) : int(c["offset"]) + int(c["length"])] for c in chunks]
    return data[:16], record, chunks, docs, frames


def join_shard(header, record, chunks, docs, frames) -> bytes:
    """A shard with these parts and every offset and checksum recomputed."""
    body, at = b"", len(header)
    for c, frame in enumerate(frames):
        chunks[c]["offset"], chunks[c]["length"], chunks[c]["checksum"] = at, len(frame), _blake(frame)
        body += frame
        at += len(frame)
    index = record + chunks.tobytes() + docs.tobytes()
    head = struct.pack("<QQQQ", at, len(index), len(chunks), len(docs)) + _blake(index)
    return header + body + index + head + _blake(head, 8) + TRAILER_MAGIC


def craft_index_field(data: bytes, rng: random.Random) -> bytes:
    header, record, chunks, docs, frames = split_shard(data)
    table = rng.choice([t for t in (chunks, docs) if len(t)])
    field = rng.choice([f for f in table.dtype.names if f != "checksum"])
    row = rng.randrange(len(table))
    value = rng.choice(INTERESTING + (int(table[row][field]) + rng.choice((-1, 1)),))
    info = np.iinfo(table.dtype[field])
    table[row][field] = min(max(value, info.min), info.max)
    if table is chunks and field in ("offset", "length"):  # keep the edit: offsets are not recomputed
        index = record + chunks.tobytes() + docs.tobytes()
        start = len(data) - 64 - len(index)
        head = struct.pack("<QQQQ", start, len(index), len(chunks), len(docs)) + _blake(index)
        return data[:start] + index + head + _blake(head, 8) + TRAILER_MAGIC
    return join_shard(header, record, chunks, docs, frames)


def craft_frame(data: bytes, rng: random.Random, bomb: bytes) -> bytes:
    """A chunk's frame replaced: a decompression bomb, or the raw bytes cut or extended (with the
    index's raw length following or not)."""
    header, record, chunks, docs, frames = split_shard(data)
    c = rng.randrange(len(frames))
    if rng.random() < 0.3:
        frames[c] = bomb
        if rng.random() < 0.5:
            chunks[c]["raw_length"] = zstandard.frame_content_size(bomb)
    else:
        raw = zstandard.ZstdDecompressor().decompress(frames[c])
        cut = rng.randrange(len(raw) + 1)
        raw = raw[:cut] + (bytes(rng.randrange(256) for _ in range(rng.randrange(40))) if rng.random() < 0.5 else b"")
        frames[c] = zstandard.ZstdCompressor(write_checksum=True).compress(raw)
        if rng.random() < 0.7:
            chunks[c]["raw_length"] = len(raw)
    return join_shard(header, record, chunks, docs, frames)


def craft_vocab(data: bytes, rng: random.Random) -> bytes:
    body = bytearray(zstandard.ZstdDecompressor().decompress(data[8:-16]))
    choice = rng.random()
    if choice < 0.3:  # the declared size of a frame far beyond the cap
        frame = zstandard.ZstdCompressor().compress(b"\0" * 1000)
        return data[:8] + frame[:4] + bytes([frame[4] | 0xC0]) + frame[5:] + data[-16:]
    if choice < 0.6:
        struct.pack_into("<I", body, rng.choice((0, 4 + struct.unpack("<I", body[:4])[0])), rng.choice(INTERESTING[:8]))
    else:
        body[rng.randrange(len(body))] = rng.randrange(256)
    body = bytes(body)
    return data[:8] + zstandard.ZstdCompressor().compress(body) + _blake(body)


# -------------------------------------------------------------- random damage


def damage(name: str, data: bytes, rng: random.Random, bomb: bytes) -> bytes:
    kind = rng.random()
    if name.endswith(".bds") and kind < 0.35:
        return craft_index_field(data, rng) if rng.random() < 0.6 else craft_frame(data, rng, bomb)
    if name == "vocab.bin" and kind < 0.35:
        return craft_vocab(data, rng)
    out = bytearray(data)
    if kind < 0.6 and out:
        for _ in range(rng.choice((1, 1, 2, 8))):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    elif kind < 0.75:
        out = out[: rng.randrange(len(out) + 1)]
    elif kind < 0.9 and out:
        a, b = sorted(rng.randrange(len(out)) for _ in range(2))
        at = rng.randrange(len(out))
        out[at:at] = out[a:b]
    else:
        at = rng.randrange(len(out) + 1)
        out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    return bytes(out)


def _alarm(signum, frame):
    raise TimeoutError("a read took too long (hang)")


def fuzz(directory: Path, cases: int, seed: int) -> list[str]:
    """Run the cases on ``directory`` (restored after each); problems found, as lines."""
    reference = read_all(directory)
    files = sorted(p.name for p in directory.iterdir())
    bomb = zstandard.ZstdCompressor(level=19).compress(b"\0" * (200 << 20))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as handle:
        in_use = int(handle.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (in_use + MEMORY_HEADROOM, hard))
    signal.signal(signal.SIGALRM, _alarm)
    rng = random.Random(seed)
    problems = []
    for case in range(cases):
        name = rng.choice(files)
        path = directory / name
        original = path.read_bytes()
        path.write_bytes(damage(name, original, rng, bomb))
        signal.alarm(SECONDS_PER_CASE)
        try:
            if read_all(directory) != reference:
                problems.append(f"case {case} ({name}): read different data without an error")
        except UserError as exc:
            message = str(exc)
            named = name in message or ("manifest" in message and name == "manifest.json")
            if not named or "\n" in message:
                problems.append(f"case {case} ({name}): error does not name the file: {message}")
        except BaseException as exc:  # noqa: BLE001 - anything else is what the fuzz test looks for
            problems.append(f"case {case} ({name}): {type(exc).__name__}: {exc}")
        finally:
            signal.alarm(0)
            path.write_bytes(original)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    return problems


def write_store(directory: Path, encoding: str) -> Path:
    vocab = tiny_vocab()
    identity = StoreIdentity(vocab, encoding=encoding, teacher="tiny")
    with StoreWriter(directory, identity, docs_per_shard=2, chunk_bytes=3000) as writer:
        for k, (ids, dist, n) in enumerate(tiny_documents(vocab)):
            writer.add_distributions(dist, key=f"doc-{k}", text_bytes=n, token_ids=ids)
    return directory


@pytest.mark.parametrize("kind", ["pow8", "pow8-ans", "v1"])
def test_fuzzed_store_files_end_in_a_named_error_or_the_original_data(tmp_path, kind):
    if kind == "v1":
        directory = tmp_path / "v1"
        directory.mkdir()
        for path in V1_STORE.iterdir():
            (directory / path.name).write_bytes(path.read_bytes())
    else:
        directory = write_store(tmp_path / kind, kind)
    code = (
        "import sys, json; from tests.test_store_fuzz import fuzz; "
        f"print(json.dumps(fuzz(__import__('pathlib').Path(sys.argv[1]), {CASES_PER_STORE}, 1)))"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    result = subprocess.run(
        [sys.executable, "-c", code, str(directory)], check=False, capture_output=True, text=True, env=env, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    problems = json.loads(result.stdout.strip().splitlines()[-1])
    assert problems == [], "\n".join(problems[:20])
