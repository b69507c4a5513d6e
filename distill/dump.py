"""``dump``: run a teacher over a corpus and write a logit store (one offline pass).

The corpus's pieces are dealt to the store's writers (a fixed number, recorded in the store:
:mod:`distill.sharding`, :mod:`distill.corpus_shares`), which are dealt to the workers
(``accelerate`` ranks × ``num_shards`` independent jobs); a worker reads only its writers' pieces
and each writer writes its own shards, so the result opens as one store. A worker reads documents in groups; each group is tokenised, cut into teacher windows
(:mod:`distill.windows`), batched by length and run through the teacher trunk. The LM head (in
float32, permuted into the conversion's column order) and the conversion run in chunks of
``head_rows`` rows, so logits never pile up (:mod:`distill.dump_memory`): on CUDA the torch
conversion runs on the device right after the head; on a CPU the Numba conversion runs in a
background thread while the teacher computes on. Only converted values wait for a document to be
complete; complete documents are written in order by that thread. Rerunning the same command
resumes, with any number of processes.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from bytestream.errors import UserError
from bytestream.ranges import COUNT, NON_NEGATIVE, at_least
from bytestream.stream import StreamLayout
from distill import dump_memory
from distill.convert import Converter, DocumentDistributions
from distill.convert_torch import TorchConversion, torch_conversion
from distill.corpus import CorpusCounts, CorpusSpec, check_source, corpus_fingerprint, corpus_listing
from distill.corpus_shares import pieces_settings, share_fingerprints, writer_documents
from distill.encode import DocumentEncoder, UnencodableDocument
from distill.sharding import WriterLock, writers_of
from distill.teacher import Teacher, load_teacher
from distill.windows import Window, plan_windows
from logit_store.encodings import DEFAULT_ENCODING, ENCODINGS, get_encoding
from logit_store.ownership import check_store_files
from logit_store.skips import Skip, SkipList

SHOWN_SKIPS = 5  # skipped documents named in the summary (all are in the store's skip lists)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class DumpConfig:
    teacher: str = field(metadata={"help": "teacher: a model folder, a Hub id, or a .gguf file"})
    corpus: CorpusSpec  # the flags --corpus, --text-field … --max-bytes
    output: str = field(metadata={"help": "store directory to write (rerun the same command to resume)"})
    tokenizer: str | None = field(
        default=None, metadata={"help": "tokenizer source if not the teacher's own (folder, tokenizer.json, .gguf)"}
    )
    gguf_file: str | None = field(default=None, metadata={"help": "GGUF file name inside a teacher folder"})
    end_of_text: list[str] | None = field(
        default=None,
        metadata={
            "help": "end-of-text token(s) whose mass becomes <eos> (default: the usual names + the tokenizer's eos)"
        },
    )
    max_length: int = field(
        default=2048, metadata={"help": "teacher window length in tokens, its BOS included", "range": at_least(2)}
    )
    stride: int = field(
        default=512,
        metadata={
            "help": "overlap between windows: every prediction sees at least this many earlier tokens of its document "
            "(or all of them)",
            "range": NON_NEGATIVE,
        },
    )
    batch_tokens: int = field(
        default=8192, metadata={"help": "padded tokens per teacher forward batch", "range": COUNT}
    )
    group_tokens: int = field(
        default=32768,
        metadata={
            "help": "tokens read and ordered by length together "
            "(their converted values wait for their documents to be complete)",
            "range": COUNT,
        },
    )
    head_rows: int = field(
        default=1024,
        metadata={
            "help": "teacher rows whose float32 logits exist at once: the LM head and the conversion run in chunks "
            "of this many rows (the logits' memory, independent of batch, group and document size)",
            "range": COUNT,
        },
    )
    conversion: str = field(
        default="auto",
        metadata={
            "help": "auto: on the device next to the forward on CUDA, Numba in a background thread on CPU; "
            "torch: the device path on any device (as CUDA runs it)",
            "choices": ["auto", "numba", "torch"],
        },
    )
    writers: int | None = field(
        default=None,
        metadata={
            "help": "fixed number of store writers the documents are dealt to, recorded in the store "
            "(default: the store's own on resume, else processes × --num-shards); "
            "any number of processes up to it can resume",
            "range": COUNT,
        },
    )
    device: str = field(default="auto", metadata={"help": "cpu, cuda, cuda:N or auto (the accelerate device)"})
    dtype: str = field(
        default="auto",
        metadata={
            "help": "teacher dtype: auto (bfloat16 on GPU, float32 on CPU), float32, bfloat16, float16",
            "choices": ["auto", "float32", "bfloat16", "float16"],
        },
    )
    encoding: str = field(
        default=DEFAULT_ENCODING,
        metadata={
            "help": "value encoding of the store: pow8-ans (the pow8 codes entropy-coded: a third smaller), pow8 "
            "(faster to read), log8, float16, pow12, pow16 (see logit_store/FORMAT.md)",
            "choices": list(ENCODINGS),
        },
    )
    chunk_bytes: int | None = field(
        default=None,
        metadata={
            "help": "raw bytes of a store chunk, which each writer holds until it is full "
            "(default: the encoding's, 16 MiB for pow8-ans)",
            "range": COUNT,
        },
    )
    docs_per_shard: int | None = field(
        default=None, metadata={"help": "close a shard after this many documents (default: by size)", "range": COUNT}
    )
    num_shards: int = field(
        default=1, metadata={"help": "split the corpus across this many independent jobs", "range": COUNT}
    )
    shard_index: int = field(
        default=0, metadata={"help": "which of --num-shards this job is (0-based)", "range": NON_NEGATIVE}
    )
    threads: int | None = field(
        default=None,
        metadata={
            "help": "torch CPU threads (default: OMP_NUM_THREADS, else the CPUs other tasks leave free)",
            "range": COUNT,
        },
    )
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})
    strict: bool = field(
        default=False,
        metadata={
            "help": "refuse the first document the teacher cannot encode, instead of skipping it "
            "(skipped documents are listed in the store's skipped-*.jsonl)"
        },
    )
    max_document_bytes: int | None = field(
        default=None, metadata={"help": "skip (and list) documents longer than this many bytes", "range": COUNT}
    )
    verbose: bool = field(default=False, metadata={"help": "name every corpus entry that is not read, and why"})


@dataclass
class DumpSummary:
    documents: int = 0
    skipped_existing: int = 0  # documents earlier runs stored
    existing_text_bytes: int = 0  # and their text
    text_bytes: int = 0
    tokens: int = 0
    positions: int = 0
    teacher_nll_nats: float = 0.0  # of the stored (decoded) values: what train and score read
    exact_teacher_nll_nats: float = 0.0  # of the exact values, before the encoding's quantisation
    dropped_mass_sum: float = 0.0
    teacher_rows: int = 0
    empty_skipped: int = 0
    skips: list[Skip] = field(default_factory=list)  # this worker's writers' skip lists, this run's and earlier
    skipped_now: int = 0  # of them, met by this run
    not_read: str | None = None  # corpus entries not read, counted by reason
    store: str = ""  # the store directory
    store_bytes: int = 0  # this writer's shards, documents of earlier runs included
    setup_seconds: float = 0.0  # loading the teacher, tokenizer and trie
    seconds: float = 0.0  # the pass itself, after setup
    forward_seconds: float = 0.0  # the teacher's trunk and head
    device_convert_seconds: float = 0.0  # the device path's conversion, between head chunks
    outside_forward_seconds: float = 0.0
    convert_write_seconds: float = 0.0  # conversion + encoding + writing, overlapped with the forward on CPU

    @property
    def teacher_bpb(self) -> float:
        return self.teacher_nll_nats / (math.log(2) * self.text_bytes) if self.text_bytes else float("nan")

    @property
    def bytes_per_text_byte(self) -> float:
        stored_text = self.existing_text_bytes + self.text_bytes
        return self.store_bytes / stored_text if stored_text else float("nan")

    def document_counts(self) -> str:
        return (
            f"{self.documents:,} (+{self.skipped_existing:,} already stored, {self.empty_skipped:,} empty skipped, "
            f"{len(self.skips):,} unencodable skipped)"
        )

    def skip_lines(self) -> list[str]:
        """The skipped documents, the first few by key and reason, and where the list is."""
        if not self.skips:
            return []
        earlier = len(self.skips) - self.skipped_now
        head = f"skipped             {len(self.skips):,} documents the teacher cannot encode" + (
            f" ({earlier:,} listed by an earlier run)" if earlier else ""
        )
        shown = [f"  {s.key}: {s.reason}" for s in self.skips[:SHOWN_SKIPS]]
        more = len(self.skips) - len(shown)
        return [
            head,
            *shown,
            f"  {'… ' + format(more, ',') + ' more; ' if more else ''}all in {Path(self.store) / 'skipped-*.jsonl'}",
        ]

    def lines(self) -> list[str]:
        store = f"{self.store_bytes:,} bytes in shards ({self.bytes_per_text_byte:.2f} per text byte)"
        notes = self.skip_lines() + ([f"not read            {self.not_read}"] if self.not_read else [])
        if not self.documents:
            return [
                f"documents           {self.document_counts()}: nothing left to dump",
                *notes,
                f"store size          {store}",
            ]
        mean_dropped = self.dropped_mass_sum / max(self.teacher_rows, 1)
        return [
            f"documents           {self.document_counts()}",
            *notes,
            f"text bytes          {self.text_bytes:,}",
            f"teacher tokens      {self.tokens:,}",
            f"stream positions    {self.positions:,}",
            f"store size          {store}",
            (
                f"teacher BPB         {self.teacher_bpb:.4f} as stored (what train and score report; "
                f"{self.exact_teacher_nll_nats / (math.log(2) * self.text_bytes):.4f} before the encoding's rounding)"
            ),
            f"dropped special mass {mean_dropped:.3g} per teacher row (mean)",
            (
                f"time                {self.seconds:.1f} s after {self.setup_seconds:.1f} s of setup "
                f"({self.tokens / max(self.seconds, 1e-9):,.0f} tokens/s); "
                f"{self.outside_forward_seconds / max(self.seconds, 1e-9):.1%} of it outside the teacher forward"
            ),
        ]


@dataclass
class PendingDocument:
    """A document whose rows are being computed: its converted values fill in as they come."""

    index: int  # its number among its writer's documents
    key: str
    data: bytes
    token_ids: np.ndarray
    windows: list[Window]
    writer_id: int
    layout: StreamLayout
    values: np.ndarray  # (S,) float64, filled row chunk by row chunk
    dropped: np.ndarray  # (m+1,)
    rows_left: int

    def positions_of(self, first_row: int, rows: int) -> slice:
        """Where rows ``first_row .. first_row + rows`` put their values."""
        p0, p1 = np.searchsorted(self.layout.position_row, [first_row, first_row + rows])
        return slice(int(self.layout.offsets[p0]), int(self.layout.offsets[p1]))


def store_settings(config: DumpConfig, teacher: Teacher, writers: int) -> dict:
    """What determines the store's values and which writer holds which document: recorded in
    the manifest, compared on resume."""
    return {
        "max_length": config.max_length,
        "stride": config.stride,
        "context_prefix": teacher.context_prefix,
        "teacher_dtype": str(teacher.dtype).removeprefix("torch."),
        "end_of_text_ids": list(teacher.vocab.end_of_text_ids),
        "corpus": {k: v for k, v in asdict(config.corpus).items() if k != "source"},
        "writers": writers,
        "corpus_pieces": pieces_settings(),
    } | ({"max_document_bytes": config.max_document_bytes} if config.max_document_bytes is not None else {})


def _validate(config: DumpConfig) -> None:
    if config.max_length < 2:
        raise UserError("--max-length must be at least 2")
    if not 0 <= config.stride < config.max_length - 1:
        raise UserError(f"--stride must be in 0..{config.max_length - 2} (below --max-length minus the BOS)")
    if not 0 <= config.shard_index < config.num_shards:
        raise UserError(f"--shard-index must be in 0..{config.num_shards - 1}")
    if config.batch_tokens < config.max_length:
        raise UserError("--batch-tokens must be at least --max-length")
    if config.head_rows < 1:
        raise UserError("--head-rows must be at least 1")
    if config.chunk_bytes is not None and config.chunk_bytes < 1:
        raise UserError("--chunk-bytes must be at least 1")
    if config.writers is not None and config.writers < 1:
        raise UserError("--writers must be at least 1")
    if config.max_document_bytes is not None and config.max_document_bytes < 1:
        raise UserError("--max-document-bytes must be at least 1")


def _device(config: DumpConfig, state) -> torch.device:
    if config.device == "auto":
        return state.device
    try:
        device = torch.device(config.device)
    except RuntimeError:
        raise UserError(f"--device {config.device!r} is not a device (cpu, cuda, cuda:N or auto)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {config.device}: CUDA is not available on this machine (use --device cpu)")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise UserError(f"--device {config.device}: this machine has {torch.cuda.device_count()} CUDA devices")
    return device


def _store_writers(config: DumpConfig, workers: int) -> int:
    """The store's fixed writer count: given, recorded in an existing store, or the workers now."""
    from logit_store.store import MANIFEST, read_manifest

    if config.writers is not None:
        return config.writers
    if (Path(config.output) / MANIFEST).is_file():
        recorded = read_manifest(Path(config.output)).get("settings", {}).get("writers")
        if isinstance(recorded, int) and recorded > 0:
            return recorded
    return workers


def run_dump(config: DumpConfig) -> DumpSummary:
    from accelerate import PartialState

    _validate(config)
    check_source(config.corpus)
    check_store_files(Path(config.output))  # before the teacher loads: a refusal is quick
    started = time.perf_counter()
    state = PartialState(cpu=config.device == "cpu" or not torch.cuda.is_available())
    if config.threads:
        torch.set_num_threads(config.threads)
    teacher = load_teacher(
        config.teacher,
        tokenizer_source=config.tokenizer,
        gguf_file=config.gguf_file,
        device=_device(config, state),
        dtype=None if config.dtype == "auto" else DTYPES[config.dtype],
        end_of_text=config.end_of_text,
    )
    worker = config.shard_index * state.num_processes + state.process_index
    return dump_with_teacher(config, teacher, worker, config.num_shards * state.num_processes, started)


def dump_with_teacher(
    config: DumpConfig, teacher: Teacher, worker: int = 0, workers: int = 1, started: float | None = None
) -> DumpSummary:
    """The dump pass of worker ``worker`` of ``workers`` with a loaded teacher (the benchmarks
    build random teachers in memory); ``started`` is when the setup began."""
    _validate(config)
    dump_memory.return_freed_blocks()
    spec = config.corpus
    started = time.perf_counter() if started is None else started
    num_writers = _store_writers(config, workers)
    mine = writers_of(worker, workers, num_writers)
    device = teacher.device
    on_device = config.conversion == "torch" or (config.conversion == "auto" and device.type == "cuda")
    converter = Converter(teacher.vocab)
    teacher.permute_output(converter.column_order)
    _check_memory(config, teacher, on_device, len(mine))
    encoder = DocumentEncoder(teacher.tokenizer, teacher.vocab)
    check_store_files(Path(config.output))  # before the locks are created in it
    with ExitStack() as locks:
        for w in mine:
            locks.enter_context(WriterLock(Path(config.output), w))
        stores = _open_stores(config, spec, teacher, converter, mine, num_writers)
        summary = DumpSummary(
            store=config.output,
            skipped_existing=sum(s.num_existing_documents for s in stores.values()),
            existing_text_bytes=sum(s.existing_text_bytes for s in stores.values()),
        )
        summary.not_read = _report_not_read(spec, config.verbose)
        summary.setup_seconds = time.perf_counter() - started
        started = time.perf_counter()
        counts = CorpusCounts()
        skip_lists = {w: SkipList(Path(config.output), w) for w in mine}
        _check_strict(config, skip_lists)
        resume = {w: skip_lists[w].resume_ordinal(s.num_existing_documents) for w, s in stores.items()}
        known = {w: skips.indices for w, skips in skip_lists.items()}
        documents = _worker_documents(writer_documents(spec, num_writers, mine, counts), resume, known)
        skipper = _Skipper(config, skip_lists)
        bar = tqdm(
            desc=f"dump[{worker}]",
            unit="tok",
            unit_scale=True,
            disable=not config.progress,
            position=worker,
            dynamic_ncols=True,
        )
        conversion = torch_conversion(converter, device, "sorted") if on_device else None
        sink = _Sink(stores, converter, conversion, summary, bar)
        try:
            for group in _groups(documents, encoder, converter, teacher, config, skipper):
                sink.add(group)
                forward_start, converted = time.perf_counter(), summary.device_convert_seconds
                _run_teacher(teacher, group, config, sink, bar)
                summary.forward_seconds += (
                    time.perf_counter() - forward_start - (summary.device_convert_seconds - converted)
                )
            sink.close()
            for store in stores.values():
                with _store_errors(store):
                    store.close()
        except BaseException:
            sink.abort()
            raise
        finally:
            bar.close()
            for skips in skip_lists.values():
                skips.close()
    summary.empty_skipped = counts.empty_skipped
    summary.skips = [s for _, skips in sorted(skip_lists.items()) for s in sorted(skips.skips, key=lambda s: s.index)]
    summary.skipped_now = skipper.count
    summary.store_bytes = sum(p.stat().st_size for w in mine for p in Path(config.output).glob(f"shard-{w:05d}-*.bds"))
    summary.seconds = time.perf_counter() - started
    summary.outside_forward_seconds = summary.seconds - summary.forward_seconds
    return summary


def _open_stores(
    config: DumpConfig, spec: CorpusSpec, teacher: Teacher, converter: Converter, mine: list[int], num_writers: int
) -> dict:
    """This worker's store writers by writer id (each resumes its own shards). A store of another
    corpus or settings that holds no finished document is replaced when one process runs."""
    from logit_store.store import StoreWriter
    from logit_store.writer import DifferentStore

    settings, fingerprint = store_settings(config, teacher, num_writers), corpus_fingerprint(spec)
    source = share_fingerprints(spec, num_writers, mine)

    def open_writer(w: int) -> StoreWriter:
        return StoreWriter(
            config.output,
            teacher.vocab,
            encoding=config.encoding,
            teacher=teacher.name,
            settings=settings,
            corpus_hash=fingerprint,
            source_pieces=source[w],
            writer_id=w,
            docs_per_shard=config.docs_per_shard,
            chunk_bytes=config.chunk_bytes,
            trie=converter.trie,
        )

    try:
        first = open_writer(mine[0])
    except DifferentStore as exc:
        _replace_unfinished(config, exc, mine, num_writers)
        first = open_writer(mine[0])
    return {mine[0]: first} | {w: open_writer(w) for w in mine[1:]}


def _replace_unfinished(config: DumpConfig, exc, mine: list[int], num_writers: int) -> None:
    """Replace a different store without finished documents, or refuse naming what to do."""
    from logit_store.ownership import remove_unfinished_store

    output = Path(config.output)
    if exc.finished:
        raise UserError(f"{exc}; it holds finished documents: choose another --output, or move it away") from None
    others = sorted(
        {int(p.name[len(".writer-") : -len(".lock")]) for p in output.glob(".writer-?????.lock")} - set(mine)
    )
    if len(mine) < num_writers or not _all_free(output, others):
        raise UserError(
            f"{exc}; it holds no finished document: rerun this dump in one process to replace it, "
            "or choose another --output"
        ) from None
    remove_unfinished_store(output)
    differ = ", ".join(exc.fields)
    print(f"bytedistill dump: replacing {output}: it held no finished document ({differ} differed)", file=sys.stderr)


def _all_free(output: Path, writer_ids: list[int]) -> bool:
    """Whether no other dump holds any of these writers' locks."""
    with ExitStack() as locks:
        try:
            for w in writer_ids:
                locks.enter_context(WriterLock(output, w))
        except UserError:
            return False
    return True


def memory_terms(
    config: DumpConfig, teacher: Teacher, on_device: bool, writers: int, longest_document_tokens: int = 0
) -> list[dump_memory.MemoryTerm]:
    """The peak-memory formula's terms for these settings (``writers``: in this process)."""
    return dump_memory.memory_terms(
        teacher,
        batch_tokens=config.batch_tokens,
        max_length=config.max_length,
        head_rows=config.head_rows,
        group_tokens=config.group_tokens,
        device_conversion=on_device,
        writers=writers,
        chunk_bytes=config.chunk_bytes or get_encoding(config.encoding).chunk_bytes,
        longest_document_tokens=longest_document_tokens,
    )


def _check_memory(config: DumpConfig, teacher: Teacher, on_device: bool, writers: int) -> None:
    """Print the peak-memory formula's terms; refuse settings that cannot fit the device."""
    terms = memory_terms(config, teacher, on_device, writers)
    print(dump_memory.describe(terms, teacher.device), file=sys.stderr)
    problem = dump_memory.over_budget(terms, teacher.device)
    if problem:
        raise UserError(problem)


def _worker_documents(
    documents, skip: dict[int, int], known_skips: dict[int, frozenset[int]]
) -> Iterator[tuple[int, str, bytes, int]]:
    """This worker's ``(key, data, writer)`` documents minus the first ``skip[w]`` of each writer
    ``w``, which it already stored or skipped, and minus those its skip lists name (``known_skips[w]``,
    by number in the writer): ``(number in its writer, key, data, writer)``."""
    seen = dict.fromkeys(skip, 0)
    for key, data, writer in documents:
        seen[writer] += 1
        number = seen[writer] - 1
        if number >= skip[writer] and number not in known_skips[writer]:
            yield number, key, data, writer


def _groups(
    documents, encoder: DocumentEncoder, converter: Converter, teacher: Teacher, config: DumpConfig, skipper: _Skipper
) -> Iterator[list[PendingDocument]]:
    prefix = len(teacher.context_prefix)
    group: list[PendingDocument] = []
    tokens = 0
    for index, key, data, writer in documents:
        ids = skipper.encode(encoder, index, key, data, writer)
        if ids is None:
            continue
        if len(ids) > config.group_tokens:
            extra = dump_memory.long_document_bytes(len(ids), config.group_tokens)
            print(
                f"dump memory: {key} has {len(ids):,} tokens, {extra / 1e9:.2f} GB more until written", file=sys.stderr
            )
        windows = plan_windows(len(ids), prefix, config.max_length, config.stride)
        layout = converter.layout(ids)
        values = np.empty(layout.num_values, dtype=np.float64)
        dropped = np.empty(len(ids) + 1, dtype=np.float64)
        group.append(PendingDocument(index, key, data, ids, windows, writer, layout, values, dropped, len(ids) + 1))
        tokens += len(ids) + prefix
        if tokens >= config.group_tokens:
            yield group
            group, tokens = [], 0
    if group:
        yield group


def _report_not_read(spec: CorpusSpec, verbose: bool) -> str | None:
    """The count of corpus entries not read (by reason); with ``verbose`` each is named on stderr."""
    listing = corpus_listing(spec)
    note = listing.not_read_note() if listing else None
    if note is None:
        return None
    if verbose:
        for entry, reason in listing.not_read:
            print(f"not read: {entry} ({reason})", file=sys.stderr)
        return note
    return note + "; --verbose names them"


def _check_strict(config: DumpConfig, skip_lists: dict[int, SkipList]) -> None:
    listed = sum(len(skips.skips) for skips in skip_lists.values())
    if config.strict and listed:
        raise UserError(
            f"--strict: the store {config.output} already lists {listed} skipped documents (skipped-*.jsonl); "
            "resume it without --strict"
        )


class _Skipper:
    """Encodes a document, or skips it: a document the teacher cannot encode (or longer than
    --max-document-bytes) is recorded in its writer's skip list, or, with --strict, refused."""

    def __init__(self, config: DumpConfig, skip_lists: dict[int, SkipList]):
        self.strict, self.limit, self.skip_lists = config.strict, config.max_document_bytes, skip_lists
        self.count = 0

    def encode(self, encoder: DocumentEncoder, index: int, key: str, data: bytes, writer: int) -> np.ndarray | None:
        try:
            if self.limit is not None and len(data) > self.limit:
                raise UnencodableDocument(f"{len(data):,} bytes, more than --max-document-bytes {self.limit:,}")
            return encoder.encode(data)
        except UnencodableDocument as exc:
            if self.strict:
                raise UserError(f"document {key}: {exc} (without --strict it is skipped and listed)") from None
            self.skip_lists[writer].add(Skip(index, key, str(exc)))
            self.count += 1
            return None


def _run_teacher(teacher: Teacher, group: list[PendingDocument], config: DumpConfig, sink: _Sink, bar) -> None:
    """Forward every window of the group, longest first, in padded batches."""
    prefix = teacher.context_prefix
    jobs = [(doc, k) for doc in group for k in range(len(doc.windows))]
    jobs.sort(key=lambda job: -job[0].windows[job[1]].input_length(len(prefix)))
    batch: list = []
    for doc, k in jobs:
        if batch and (len(batch) + 1) * _length(batch[0], prefix) > config.batch_tokens:
            bar.update(_forward_batch(teacher, batch, prefix, sink, config.head_rows))
            batch = []
        batch.append((doc, k))
    if batch:
        bar.update(_forward_batch(teacher, batch, prefix, sink, config.head_rows))


def _length(job, prefix: list[int]) -> int:
    doc, k = job
    return doc.windows[k].input_length(len(prefix))


def _forward_batch(teacher: Teacher, batch, prefix: list[int], sink: _Sink, head_rows: int) -> int:
    """Run one padded batch of windows through the trunk, then the head and the conversion in
    chunks of ``head_rows`` rows; return the rows computed."""
    width = max(_length(job, prefix) for job in batch)
    input_ids = np.zeros((len(batch), width), dtype=np.int64)
    mask = np.zeros((len(batch), width), dtype=np.int64)
    rows, pieces, start = [], [], 0
    for b, (doc, k) in enumerate(batch):
        w = doc.windows[k]
        seq = np.concatenate([np.asarray(prefix, dtype=np.int64), doc.token_ids[w.token_start : w.token_stop]])
        input_ids[b, : len(seq)] = seq
        mask[b, : len(seq)] = 1
        rows.append(w.output_positions(len(prefix)))
        pieces.append((doc, w.row_start, start, start + len(rows[-1])))
        start += len(rows[-1])
    device = teacher.device
    hidden = teacher.hidden_rows(torch.from_numpy(input_ids).to(device), torch.from_numpy(mask).to(device), rows)
    for c0 in range(0, start, head_rows):
        c1 = min(start, c0 + head_rows)
        sink.convert(teacher.head_logits(hidden[c0:c1]), _pieces_within(pieces, c0, c1))
    return start


def _pieces_within(pieces, c0: int, c1: int) -> list[tuple[PendingDocument, int, int, int]]:
    """The parts of ``(doc, first row, start, stop)`` pieces inside rows ``c0..c1``, relative to ``c0``."""
    out = []
    for doc, first_row, a, b in pieces:
        lo, hi = max(a, c0), min(b, c1)
        if lo < hi:
            out.append((doc, first_row + lo - a, lo - c0, hi - c0))
    return out


@contextmanager
def _store_errors(store):
    """A failing disk (full, read-only, over quota) is one line, not a traceback."""
    try:
        yield
    except OSError as exc:
        raise UserError(f"writing the store {store.directory} failed: {exc}") from None


MAX_IN_FLIGHT = 2  # row chunks queued for the background thread


class _Sink:
    """Converts row chunks and writes complete documents in corpus order. One background thread
    (an executor, at most MAX_IN_FLIGHT tasks queued) runs the Numba conversion (it releases the
    GIL) and all store writing; on the device path the main thread converts on the device right
    after the head. A failure in the thread surfaces at the main thread's next hand-over."""

    def __init__(
        self, stores: dict, converter: Converter, conversion: TorchConversion | None, summary: DumpSummary, bar
    ):
        self.stores, self.converter, self.conversion = stores, converter, conversion
        self.summary, self.bar = summary, bar
        self.pending: deque[PendingDocument] = deque()  # corpus order, not yet written
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dump-writer")
        self.in_flight: deque[Future] = deque()

    def add(self, group: list[PendingDocument]) -> None:
        self.pending.extend(group)

    def convert(self, logits: torch.Tensor, pieces) -> None:
        if self.conversion is None:
            self._submit(self._convert_numba, logits.numpy(), pieces)
            return
        if logits.is_cuda:  # the forward's kernels are asynchronous: time the conversion alone
            torch.cuda.synchronize(logits.device)
        start = time.perf_counter()
        for doc, first_row, a, b in pieces:
            values, dropped = self.conversion.convert_rows(doc.layout, logits[a:b], first_row)
            doc.values[doc.positions_of(first_row, b - a)] = values
            doc.dropped[first_row : first_row + b - a] = dropped
            doc.rows_left -= b - a
        self.summary.device_convert_seconds += time.perf_counter() - start
        self._submit(self._write_complete)

    def _submit(self, task, *args) -> None:
        while self.in_flight and (self.in_flight[0].done() or len(self.in_flight) >= MAX_IN_FLIGHT):
            self.in_flight.popleft().result()
        self.in_flight.append(self.executor.submit(task, *args))

    def _convert_numba(self, logits: np.ndarray, pieces) -> None:
        start = time.perf_counter()
        for doc, first_row, a, b in pieces:
            self.converter.convert_rows_numba(
                doc.layout, doc.token_ids, logits[a:b], first_row, doc.values, doc.dropped, "sorted"
            )
            doc.rows_left -= b - a
        self.summary.convert_write_seconds += time.perf_counter() - start
        self._write_complete()

    def _write_complete(self) -> None:
        start = time.perf_counter()
        while self.pending and self.pending[0].rows_left == 0:
            self._write(self.pending.popleft())
        self.summary.convert_write_seconds += time.perf_counter() - start

    def _write(self, doc: PendingDocument) -> None:
        dist = DocumentDistributions(doc.layout, doc.values, doc.dropped)
        store = self.stores[doc.writer_id]
        with _store_errors(store):
            stored = store.add_distributions(dist, key=doc.key, token_ids=doc.token_ids)
        s = self.summary
        s.documents += 1
        s.text_bytes += len(doc.data)
        s.tokens += len(doc.token_ids)
        s.positions += dist.layout.num_positions
        s.teacher_nll_nats -= dataclasses.replace(dist, values=stored.astype(np.float64)).log_likelihood()
        s.exact_teacher_nll_nats -= dist.log_likelihood()
        s.dropped_mass_sum += float(dist.dropped_mass.sum())
        s.teacher_rows += len(dist.dropped_mass)
        elapsed = max(self.bar.format_dict.get("elapsed", 0.0), 1e-9)
        self.bar.set_postfix(docs=s.documents, bytes_s=f"{s.text_bytes / elapsed:,.0f}")

    def close(self) -> None:
        while self.in_flight:
            self.in_flight.popleft().result()
        self.executor.shutdown()
        if self.pending:
            raise RuntimeError(f"{len(self.pending)} documents were never completed")

    def abort(self) -> None:
        self.executor.shutdown(wait=True, cancel_futures=True)
