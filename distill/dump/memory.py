"""The dump's peak memory as a formula of its settings (see the README: dump memory).

Nothing in the dump grows with the corpus: the teacher's hidden states live for one forward
batch (``--batch-tokens``); float32 logits exist for ``--head-rows`` rows at a time, in at most
``LOGIT_CHUNKS_IN_FLIGHT`` chunks (one being converted by the sink's thread, the next being
computed), and the chunk being computed never coexists with the trunk's activations (the head
runs after the trunk), so the two overlap by the smaller of them;
converted values wait for their document to be complete, for at most one group
(``--group-tokens``) plus the longest document that is longer than a group; each store writer
holds its pending chunk (``--chunk-bytes`` raw bytes: one byte a value for ``pow8-ans``, and each
document's layout, its chunk's contexts to come), and with one encoder thread that chunk is coded and
compressed in place, with ``--encode-threads`` T > 1 up to T chunks are being coded while the next
fills, and documents of up to ``VALUES_IN_FLIGHT_PER_THREAD`` float64 values a thread wait to be
encoded; a document longer than a group adds its values'
wait and, while it is written, its codes and taken values (:attr:`TokenCost.stored_bytes`).
Freed pages go back to the system as the dump runs (:func:`trim_freed_memory`), so that what the
allocator keeps does not grow with the corpus either. The rest is fixed by the teacher: its weights (and
a float32 copy of its output layer), its tokenizer (and the encoder's exact copy), the vocabulary,
trie and conversion tables, and the libraries' code.

The constants per token and per vocabulary entry were measured on the CPU with the Llama-3
tokenizer over English text (``benchmarks/dump_memory.py`` checks the sum against peak RSS), those
of the fused stream scaled from the ``<eot>`` stream's by the two layouts' values a token.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass

import torch

from bytestream.stream_kind import StreamKind
from logit_store.writer import VALUES_IN_FLIGHT_PER_THREAD

RUNTIME_BYTES = 380_000_000  # Python, torch, transformers, accelerate, numba, tokenizers: code and buffers
TOKENIZER_BYTES_PER_ENTRY = 2_200  # the teacher's tokenizer and the encoder's exact copy (Llama-3: 0.28 GB)
TABLE_BYTES_PER_ENTRY = 780  # vocabulary bytes, trie and conversion tables (Llama-3: 0.10 GB)


@dataclass(frozen=True)
class TokenCost:
    """What one teacher token of a document holds while its document waits, in a stream."""

    values: float  # converted values per teacher token
    positions: float  # stream positions per token

    @property
    def pending_bytes(self) -> int:
        """Float64 values and int16 support symbols; per position its node, row and offset."""
        return int(self.values * (8 + 2) + self.positions * 26 + 32)

    @property
    def stored_bytes(self) -> int:
        """A written document's codes (a byte a value, a tail byte a position) until its chunk
        goes, and while it is written its taken values, decoded a run at a time (float32 a
        position), and its ids and dropped mass as stored (4 bytes a token each)."""
        return int(self.values + self.positions * (1 + 4) + 4 + 4)

    @property
    def waiting_bytes(self) -> int:
        return self.pending_bytes + self.stored_bytes


BYTES_PER_TOKEN = 4.2  # text bytes per token (Llama-3, English): a document's tokens, guessed from its bytes
TOKEN_COSTS = {
    # Llama-3, English: 410 values a token (99 per text byte); its bytes and its <eot>
    StreamKind.EOT: TokenCost(410, BYTES_PER_TOKEN + 1),
    # about 1.7 times the <eot> stream's values (a root position holds both halves of each first
    # byte: 633 against 373 a token over README.md), rounded up; one position per text byte
    StreamKind.FUSED: TokenCost(720, BYTES_PER_TOKEN),
}
CODING_BYTES_PER_CHUNK_BYTE = 1.5  # coding a chunk: its contexts, rANS words, raw chunk and zstd frame
PENDING_BYTES_PER_CHUNK_BYTE = 3  # a pending chunk: its codes and its documents' int16 support symbols
LOGIT_CHUNKS_IN_FLIGHT = 2  # CPU: one being converted, the next computed (distill/conversion_sink.MAX_IN_FLIGHT + 1)
MMAP_THRESHOLD = 1 << 20
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


@dataclass(frozen=True)
class MemoryTerm:
    name: str
    bytes: int
    flag: str  # the setting that scales it ("" for the teacher's own)
    on_device: bool  # False: host memory even when the teacher runs on a GPU


def memory_terms(
    teacher,
    *,
    batch_tokens: int,
    max_length: int,
    head_rows: int,
    group_tokens: int,
    device_conversion: bool,
    writers: int = 1,
    chunk_bytes: int = 16 << 20,
    encode_threads: int = 1,
    longest_document_tokens: int = 0,
    stream: StreamKind = StreamKind.EOT,
) -> list[MemoryTerm]:
    """Estimated peak bytes of each part of the dump, with the flag that scales it. ``writers``:
    the store writers this process runs, each with ``encode_threads``; ``longest_document_tokens``: the longest document, when
    known (its values beyond a group's wait until it is written); ``stream``: the one converted into."""
    cost = TOKEN_COSTS[stream]
    model, config = teacher.model, teacher.model.config
    hidden = config.hidden_size
    vocab = teacher.head.out_features
    dtype_bytes = torch.finfo(teacher.dtype).bits // 8
    weights = sum(p.numel() * p.element_size() for p in model.parameters()) + teacher.head.weight.numel() * 4
    activations = batch_tokens * (4 * hidden + 2 * getattr(config, "intermediate_size", 4 * hidden)) * dtype_bytes
    attention = attention_bytes(config, batch_tokens, max_length, dtype_bytes)
    if device_conversion:
        from distill.conversion.device import MAX_ELEMENTS, row_chunk

        logits = head_rows * vocab * 4 + 4 * row_chunk(teacher.device) * vocab * 8 + 5 * MAX_ELEMENTS * 8
    else:
        logits = host_logits_bytes(head_rows * vocab * 4, activations + attention)
    beyond_group = max(0, longest_document_tokens - group_tokens)
    terms = [
        MemoryTerm("runtime", RUNTIME_BYTES, "", False),
        MemoryTerm("tokenizer", len(teacher.vocab.token_bytes) * TOKENIZER_BYTES_PER_ENTRY, "", False),
        MemoryTerm("tables", len(teacher.vocab.token_bytes) * TABLE_BYTES_PER_ENTRY, "", False),
        MemoryTerm("weights", weights, "--dtype", True),
        MemoryTerm("forward", activations + attention, "--batch-tokens", True),
        MemoryTerm("logits", logits, "--head-rows", True),
        MemoryTerm("pending values", group_tokens * cost.pending_bytes, "--group-tokens", False),
        MemoryTerm("store chunks", writers * store_chunk_bytes(chunk_bytes, encode_threads), "--chunk-bytes", False),
    ]
    if encode_threads > 1:
        waiting = writers * encode_threads * VALUES_IN_FLIGHT_PER_THREAD * 8
        terms.append(MemoryTerm("documents being encoded", waiting, "--encode-threads", False))
    if beyond_group:
        terms.append(MemoryTerm("longest document", beyond_group * cost.waiting_bytes, "a document's length", False))
    return terms


def store_chunk_bytes(chunk_bytes: int, encode_threads: int) -> int:
    """A store writer's chunks: the pending one, coded in place with one thread; with more, also up
    to ``encode_threads`` chunks being coded, each still holding its documents."""
    pending, coding = PENDING_BYTES_PER_CHUNK_BYTE, CODING_BYTES_PER_CHUNK_BYTE
    chunks = pending + coding if encode_threads == 1 else pending + encode_threads * (pending + coding)
    return int(chunk_bytes * chunks)


def host_logits_bytes(chunk: int, forward: int) -> int:
    """The logits' share of the peak when the sink's thread converts on the host: the chunk being
    converted lives through the next batch's trunk forward, and the next chunk is computed after
    that forward, so the peak is the larger of (forward + one chunk) and (two chunks): beyond the
    forward term, one chunk and whatever a chunk exceeds the forward by."""
    return (LOGIT_CHUNKS_IN_FLIGHT - 1) * chunk + max(0, chunk - forward)


def attention_bytes(config, batch_tokens: int, max_length: int, dtype_bytes: int) -> int:
    """The attention's peak beyond the activations: eager attention keeps every head's scores
    (queries × keys); a fused kernel (sdpa, flash: transformers' default) keeps none, only the
    padding mask, at most one float32 a key per query (measured on the CPU: a 4 × 2048-token batch
    of 9 heads adds 73 MB with sdpa and a mask, 1.17 GB eager)."""
    if getattr(config, "_attn_implementation", "eager") == "eager":
        return batch_tokens * max_length * config.num_attention_heads * dtype_bytes
    return batch_tokens * max_length * 4


def long_document_bytes(tokens: int, group_tokens: int, stream: StreamKind = StreamKind.EOT) -> int:
    """What a document of ``tokens`` adds to the estimate (0 when it fits in a group)."""
    return max(0, tokens - group_tokens) * TOKEN_COSTS[stream].waiting_bytes


@dataclass(frozen=True)
class DocumentBudget:
    """What one long document may add to the estimate: the host memory the estimate leaves free.
    A document that would need more is refused before it is encoded (its tokens guessed from its
    bytes) or, once encoded, from its tokens, in one line with the estimate and the flags."""

    free_bytes: int
    group_tokens: int
    stream: StreamKind = StreamKind.EOT

    def refusal(self, key: str, data_bytes: int, tokens: int | None = None) -> str | None:
        """Why document ``key`` cannot be dumped here, or None."""
        guessed = tokens is None
        tokens = int(data_bytes / BYTES_PER_TOKEN) if guessed else tokens
        extra = long_document_bytes(tokens, self.group_tokens, self.stream)
        if extra <= self.free_bytes:
            return None
        per_token = TOKEN_COSTS[self.stream].waiting_bytes
        fits = self.group_tokens + max(0, self.free_bytes) // per_token
        return (
            f"document {key} ({data_bytes:,} bytes, {'about ' if guessed else ''}{tokens:,} tokens) would add "
            f"about {_gb(extra)} to the dump's memory estimate (its values wait until it is written: "
            f"{per_token / 1e3:.1f} KB a token beyond --group-tokens), "
            f"and {_gb(max(0, self.free_bytes))} are left: skip and list such documents with --max-document-bytes "
            f"{int(fits * BYTES_PER_TOKEN * 0.9):,}, or split it into smaller documents (--separator for text files)"
        )


def document_budget(
    terms: list[MemoryTerm], device: torch.device, group_tokens: int, stream: StreamKind = StreamKind.EOT
) -> DocumentBudget:
    """The host memory the estimate leaves for a document longer than a group."""
    host = torch.device("cpu")
    held = sum(t.bytes for t in terms if not (t.on_device and device.type == "cuda"))
    return DocumentBudget(capacity(host) - held, group_tokens, stream)


def return_freed_blocks() -> None:
    """Have glibc map every block of ``MMAP_THRESHOLD`` bytes or more on its own, so that freeing
    it returns its pages. By default the threshold rises to the largest block freed so far (up to
    32 MiB), after which a document's arrays come from heaps that keep freed pages: peak RSS then
    grows with the corpus (measured: 20% from 60 KB to 120 KB of text at settings / 8) although
    the live memory does not. Not glibc: nothing to do."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def trim_freed_memory() -> None:
    """Hand back the pages of the freed blocks below ``MMAP_THRESHOLD`` (glibc's ``malloc_trim``,
    over every thread's arena). A document's smaller arrays (its layout, a chunk's pieces) come
    and go in the arenas, which keep their freed pages and fill with holes: at settings / 8 the
    dump's lowest RSS rose by 22 MB over 240 KB of text, and its peak with it (the same run peaked
    90 MB lower, and its lowest RSS stayed flat, trimmed while it ran). Not glibc: nothing to do."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def capacity(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def describe(terms: list[MemoryTerm], device: torch.device, stream: StreamKind = StreamKind.EOT) -> str:
    parts = " + ".join(f"{t.name} {_gb(t.bytes)}" + (f" ({t.flag})" if t.flag.startswith("--") else "") for t in terms)
    where = f"{_gb(sum(t.bytes for t in terms if t.on_device or device.type != 'cuda'))} on {device}"
    if device.type == "cuda":
        where += f", {_gb(sum(t.bytes for t in terms if not t.on_device))} on the host"
    return (
        f"dump memory estimate: {parts}; {where} (of {_gb(capacity(device))}); a document longer than "
        f"--group-tokens adds {TOKEN_COSTS[stream].waiting_bytes / 1e3:.1f} KB a token"
    )


def over_budget(terms: list[MemoryTerm], device: torch.device) -> str | None:
    """Why the settings cannot fit ``device`` (naming the flag to lower), or None."""
    on_device = [t for t in terms if t.on_device or device.type != "cuda"]
    need, have = sum(t.bytes for t in on_device), capacity(device)
    if need <= have:
        return None
    largest = max((t for t in on_device if t.flag.startswith("--") and t.flag != "--dtype"), key=lambda t: t.bytes)
    return (
        f"the dump needs about {_gb(need)} on {device}, which has {_gb(have)}: {largest.name} take "
        f"{_gb(largest.bytes)}; lower {largest.flag}"
    )


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"
