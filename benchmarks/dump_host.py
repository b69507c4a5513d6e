"""The dump's host side after the forward, per teacher token (``benchmarks/dump_gpu.py`` prints it).

Documents of KJV text over a real vocabulary go through the dump's own code after the device
conversion: the sink's host fill of converted rows (:class:`distill.dump.sink.ConvertedRows`), then
the store writer's encoding (quantisation, stored-NLL decode, chunk contexts, rANS, zstd, write).
Their values are peaked distributions over each position's support, drawn at random (a random
teacher's are near uniform: they would cost the coder more than a trained teacher's).

:func:`stage_profile` times each stage alone, in one thread (CPU time of the thread, so a busy
machine moves it little); :func:`encoder_scaling` writes the same documents through a
:class:`logit_store.StoreWriter` with 1, 2 and 4 encoder threads, in alternating rounds, and
keeps each count's best round: tokens/s (wall), CPU per token (the process's), and the caller's
CPU per token (the sink thread's part, which no encoder thread takes over).
"""

from __future__ import annotations

import hashlib
import os
import resource
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np
import zstandard

from benchmarks.common import kjv_chapters
from bytestream.stream import target_indices
from bytestream.stream_kind import StreamKind
from distill.conversion.converter import Converter, DocumentDistributions
from distill.dump.sink import ConvertedRows, ConvertedSpan, DocumentsPlanned, _Receiver
from distill.teacher.encode import DocumentEncoder
from distill.teacher.reader import PlannedDocument
from logit_store import StoreIdentity, StoreWriter
from logit_store.chunk import EncodedDocument, build_chunk
from logit_store.file_names import SHARD

THREADS = (1, 2, 4)
GOAL_TOKENS_S = 40_000  # teacher tokens/s a GPU's dump must keep up with
GOAL_CORES = 4  # host cores the encoding may take for it
PASSES = 4  # the encoder threads' measure writes the documents this many times: chunks one after another
HEAD_ROWS = 1024  # rows of a ConvertedRows message, as the dump's default --head-rows


@dataclass(frozen=True)
class HostDocument:
    """A document as the sink holds it (planned) and its converted values."""

    planned: PlannedDocument
    distributions: DocumentDistributions

    @property
    def tokens(self) -> int:
        return len(self.planned.token_ids)


def host_documents(converter: Converter, tokenizer, tokens: int, seed: int = 0) -> list[HostDocument]:
    """KJV chapters up to about ``tokens`` teacher tokens, in the fused stream, with peaked values."""
    encoder = DocumentEncoder(tokenizer, converter.vocab)
    rng = np.random.default_rng(seed)
    documents, total = [], 0
    for k, (citation, text) in enumerate(kjv_chapters()):
        if total >= tokens:
            break
        ids = encoder.encode(text)
        layout = StreamKind.FUSED.layout(converter.trie, ids)
        weights = np.exp(4.0 * rng.standard_normal(layout.num_values))
        values = weights / np.repeat(np.add.reduceat(weights, layout.offsets[:-1]), np.diff(layout.offsets))
        dropped = rng.uniform(0, 1e-3, len(ids) + 1)
        planned = PlannedDocument(k, citation, text, ids, (), 0, layout)
        documents.append(HostDocument(planned, DocumentDistributions(layout, values, dropped)))
        total += len(ids)
    return documents


def _identity(converter: Converter) -> StoreIdentity:
    return StoreIdentity(converter.vocab, encoding="pow8-ans", teacher="peaked", stream=StreamKind.FUSED)


def _converted_rows(doc: HostDocument) -> list[ConvertedRows]:
    """The document's values as the device path hands them over, ``HEAD_ROWS`` rows a message."""
    messages, planned, dist = [], doc.planned, doc.distributions
    for first in range(0, planned.rows, HEAD_ROWS):
        count = min(HEAD_ROWS, planned.rows - first)
        span = ConvertedSpan(
            planned, first, dist.values[planned.positions_of(first, count)], dist.dropped_mass[first : first + count]
        )
        messages.append(ConvertedRows((span,)))
    return messages


class _Clock:
    """CPU seconds of this thread, summed by stage."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    def time(self, stage: str, job, *args):
        start = time.thread_time()
        result = job(*args)
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.thread_time() - start
        return result


def _chunks(writer: StoreWriter, docs: list[EncodedDocument]) -> list[list[EncodedDocument]]:
    """The documents cut into chunks where the writer cuts them (once ``chunk_bytes`` are pending)."""
    chunks, pending, size = [], [], 0
    for doc in docs:
        if size >= writer.chunk_bytes:
            chunks, pending, size = [*chunks, pending], [], 0
        pending.append(doc)
        size += doc.raw_size()
    return [*chunks, pending] if pending else chunks


def stage_profile(converter: Converter, documents: list[HostDocument], workdir: Path) -> dict[str, float]:
    """CPU-µs per teacher token of each host stage, in one thread, each stage alone: the sink's and
    the store writer's own methods, in the order they run; the layout the writer rebuilt per chunk
    before (now it takes each document's own) is timed too."""
    clock = _Clock()
    writer = StoreWriter(workdir / "profile", _identity(converter), trie=converter.trie)
    receiver = _Receiver({0: writer}, converter, bar=None)
    encoding, trie = writer.encoding, converter.trie
    encoded = []
    for doc in documents:
        planned = doc.planned
        receiver._plan(DocumentsPlanned((planned,)))
        for message in _converted_rows(doc):
            clock.time("host fill of converted rows (sink)", receiver._fill, message)
        filled = receiver._pending.pop((planned.writer_id, planned.index))
        dist = DocumentDistributions(planned.layout, filled.values, filled.dropped)
        clock.time("exact NLL (sink)", dist.log_likelihood)
        targets = target_indices(planned.layout)
        value_bytes, position_bytes = clock.time(
            "quantisation", encoding.encode, dist.values, planned.layout.offsets, targets
        )
        clock.time(
            "stored-NLL decode", writer._stored_figures, value_bytes, position_bytes, planned.layout, dist.values
        )
        clock.time(BEFORE_ONLY, writer.stream.layout, trie, planned.token_ids)
        dropped = dist.dropped_mass.astype(np.float32)
        ids = planned.token_ids.astype(np.uint32)
        encoded.append(
            EncodedDocument(ids, value_bytes, position_bytes, dropped, planned.text_bytes, planned.key, planned.layout)
        )
    with open(workdir / "frames", "wb") as out:
        for docs in _chunks(writer, encoded):
            contexts = clock.time("chunk contexts", writer._chunk_contexts, docs)
            version = writer.manifest["format_version"]
            raw = clock.time("rANS coding and the chunk's byte planes", build_chunk, docs, encoding, version, contexts)
            compressor = zstandard.ZstdCompressor(level=writer.compression_level, write_checksum=True, threads=0)
            frame = clock.time("zstd", compressor.compress, raw)
            clock.time("write", out.write, frame)
    writer.abandon()
    tokens = sum(doc.tokens for doc in documents)
    return {stage: s / tokens * 1e6 for stage, s in clock.seconds.items()}


@numba.njit(nogil=True, cache=True)
def _spin(steps: int) -> float:
    total = 0.0
    for i in range(steps):
        total += np.sqrt(i * 1.0)
    return total


def cores_got(threads: int, steps: int = 50_000_000) -> float:
    """The cores this process gets with ``threads`` busy threads that hold no lock (a Numba loop
    without the GIL): CPU seconds over wall seconds. On a machine shared with other work, or under
    a CPU limit, it stays below ``threads``, and so must any speed-up of the encoder threads."""
    _spin(10)
    usage, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(_spin, [steps] * threads))
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    return ((after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)) / wall


@dataclass(frozen=True)
class Scaling:
    """The encoding with ``threads`` encoder threads: its best round's figures."""

    threads: int
    tokens_s: float  # teacher tokens/s, wall
    cpu_us: float  # process CPU-µs per teacher token
    caller_us: float  # the caller's (the sink thread's) CPU-µs per token
    shards: str  # digest of the shards written


def write_through(
    converter: Converter, documents: list[HostDocument], directory: Path, threads: int
) -> tuple[float, float, float, str]:
    """Write the documents as the sink does (submitted in order, counted once encoded); wall
    seconds, process and caller CPU seconds, and a digest of the shards. The documents may repeat
    (the store takes them as new ones): chunks then follow each other as in a long dump."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    start, caller = time.perf_counter(), time.thread_time()
    with StoreWriter(directory, _identity(converter), trie=converter.trie, encode_threads=threads) as writer:
        pending = [
            writer.submit_distributions(d.distributions, key=d.planned.key, token_ids=d.planned.token_ids)
            for d in documents
        ]
        nll = sum(p.stored_log_likelihood() for p in pending)
    caller = time.thread_time() - caller
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - usage.ru_utime) + (after.ru_stime - usage.ru_stime)
    digest = hashlib.blake2b(digest_size=8)
    for path in sorted(SHARD.paths(directory, 0)):
        digest.update(path.read_bytes())
    digest.update(repr(nll).encode())
    return wall, cpu, caller, digest.hexdigest()


def encoder_scaling(converter: Converter, documents: list[HostDocument], workdir: Path, rounds: int) -> list[Scaling]:
    """Each thread count of :data:`THREADS` in turn, ``rounds`` times; the best round of each.
    The documents are written :data:`PASSES` times over, so that several chunks are coded."""
    documents = documents * PASSES
    tokens = sum(doc.tokens for doc in documents)
    best: dict[int, tuple] = {}
    for r in range(rounds):
        for threads in THREADS:
            directory = workdir / f"scaling-{r}-{threads}"
            wall, cpu, caller, digest = write_through(converter, documents, directory, threads)
            if threads not in best or wall < best[threads][0]:
                best[threads] = (wall, cpu, caller, digest)
    return [Scaling(t, tokens / w, c / tokens * 1e6, k / tokens * 1e6, d) for t, (w, c, k, d) in best.items()]


BEFORE_ONLY = "layout rebuilt per chunk (before)"


def _measurable(threads: int, got: dict[int, float]) -> bool:
    """Whether the machine gave ``threads`` busy threads nearly a core each (else their speed-up is not measured)."""
    return got[threads] >= 0.8 * threads


SINK_STAGES = ("host fill of converted rows (sink)", "exact NLL (sink)")  # on the sink's thread, not the writer's


def host_report(converter: Converter, tokenizer, tokens: int, rounds: int) -> tuple[list[str], str, str]:
    """The printed lines, the ``summary`` line and a markdown table of the host side."""
    from benchmarks.results import markdown_table

    documents = host_documents(converter, tokenizer, tokens)
    count = sum(doc.tokens for doc in documents)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        write_through(converter, documents[:2], workdir / "warm", 2)  # compiles and loads the kernels
        profile = stage_profile(converter, documents, workdir)
        scaling = encoder_scaling(converter, documents, workdir, rounds)
    sink_us = sum(profile[stage] for stage in SINK_STAGES)
    cores = os.cpu_count() or 1
    got = {threads: cores_got(threads) for threads in THREADS}
    first = (
        f"host side: {count:,} teacher tokens of KJV, {len(documents)} documents, peaked values "
        f"(written {PASSES} times over for the encoder threads); {cores} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    lines = [
        first,
        "  cores this process got with busy threads: " + ", ".join(f"{t} threads {c:.2f}" for t, c in got.items()),
    ]
    total = sum(us for stage, us in profile.items() if stage != BEFORE_ONLY)
    profile = profile | {"all of them now (the rebuilt layout is gone)": total}
    lines += [f"  {stage:<50}{us:>10.2f} CPU-us/token" for stage, us in profile.items()]
    rows = [[stage, f"{us:.2f}"] for stage, us in profile.items()]
    table = [markdown_table(["stage (one thread, each alone)", "CPU-µs per teacher token"], rows), ""]
    header = [
        "encoder threads",
        "tokens/s (wall)",
        "× one thread's",
        "CPU-µs/token",
        "sink thread µs/token",
        f"tokens/s {GOAL_CORES} free cores allow (by CPU time)",
    ]
    scaled = []
    for s in scaling:
        measured = "measured" if _measurable(s.threads, got) else f"unmeasured: {got[s.threads]:.2f} cores to be had"
        bound = 1e6 / max(s.caller_us + sink_us, (s.cpu_us + sink_us) / min(GOAL_CORES, s.threads + 1))
        scaled.append((s, bound))
        lines.append(
            f"  {s.threads} encoder threads: {s.tokens_s:>9,.0f} tokens/s ({measured}; "
            f"{s.tokens_s / scaling[0].tokens_s:.2f}x one thread's), {s.cpu_us:.1f} CPU-us/token, "
            f"sink thread {s.caller_us + sink_us:.1f} us/token; bound on {GOAL_CORES} cores {bound:,.0f} tokens/s"
        )
    rows = [
        [
            str(s.threads),
            f"{s.tokens_s:,.0f}"
            + ("" if _measurable(s.threads, got) else f" (unmeasured: {got[s.threads]:.2f} cores)"),
            f"{s.tokens_s / scaling[0].tokens_s:.2f}",
            f"{s.cpu_us + sink_us:.1f}",
            f"{s.caller_us + sink_us:.1f}",
            f"{bound:,.0f}",
        ]
        for s, bound in scaled
    ]
    table.append(markdown_table(header, rows))
    four = next(bound for s, bound in scaled if s.threads == GOAL_CORES)
    cpu_us = min(s.cpu_us for s in scaling) + sink_us
    needed = cpu_us * GOAL_TOKENS_S / 1e6
    identical = len({s.shards for s in scaling}) == 1
    goals = [
        (
            f"{GOAL_TOKENS_S:,} tokens/s on {GOAL_CORES} cores (by CPU time; "
            f"{'measured' if _measurable(GOAL_CORES, got) else 'wall-clock unmeasured here'}): "
            f"{four:,.0f} {'met' if four >= GOAL_TOKENS_S else 'MISSED'}"
        ),
        f"host cores for {GOAL_TOKENS_S:,} tokens/s {needed:.2f} {'met' if needed <= GOAL_CORES else 'MISSED'} (<= {GOAL_CORES})",
        f"shards byte-identical at {', '.join(map(str, THREADS))} threads {'met' if identical else 'MISSED'}",
    ]
    summary = "summary: host side: " + "; ".join(goals)
    return lines, summary, "\n".join(table)
