"""``dump``: run a teacher over a corpus and write a logit store (one offline pass).

Documents are read in a fixed order and dealt round-robin to the workers (``accelerate`` ranks ×
``num_shards`` independent jobs); each worker writes its own shards, so the result opens as one
store. A worker reads documents in groups; each group is tokenised, cut into teacher windows
(:mod:`distill.windows`), batched by length and run through the teacher, whose output layer is
permuted into the conversion's column order. On CUDA the conversion runs on the device next to the
forward pass; on a CPU, the Numba conversion and the store writing run in a background thread
while the teacher computes the next group. Rerunning the same command resumes.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from distill.convert import Converter, DocumentDistributions
from distill.corpus import CorpusCounts, CorpusSpec, check_source, corpus_fingerprint, select_documents
from distill.encode import DocumentEncoder
from distill.errors import UserError
from distill.teacher import Teacher, load_teacher
from distill.windows import Window, plan_windows
from logit_store.encodings import DEFAULT_ENCODING

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class DumpConfig:
    teacher: str = field(metadata={"help": "teacher: a model folder, a Hub id, or a .gguf file"})
    corpus: str = field(metadata={"help": ".txt/.jsonl/.jsonl.zst/.parquet file or folder, a save_to_disk folder, or a dataset name"})
    output: str = field(metadata={"help": "store directory to write (rerun the same command to resume)"})
    tokenizer: str | None = field(default=None, metadata={"help": "tokenizer source if not the teacher's own (folder, tokenizer.json, .gguf)"})
    gguf_file: str | None = field(default=None, metadata={"help": "GGUF file name inside a teacher folder"})
    end_of_text: list[str] | None = field(default=None, metadata={"help": "end-of-text token(s) whose mass becomes <eos> (default: the usual names + the tokenizer's eos)"})
    text_field: str = field(default="text", metadata={"help": "record field holding the text (jsonl, parquet, datasets)"})
    separator: str | None = field(default=None, metadata={"help": "split .txt files into documents on this exact string (default: one document per file)"})
    dataset_split: str = field(default="train", metadata={"help": "split of a datasets source"})
    dataset_config: str | None = field(default=None, metadata={"help": "configuration name of a datasets source"})
    streaming: bool = field(default=False, metadata={"help": "stream a datasets source instead of downloading it"})
    subset: str = field(default="all", metadata={"help": "which side of the deterministic held-out split to distil", "choices": ["all", "train", "heldout"]})
    heldout_fraction: float = field(default=0.0, metadata={"help": "fraction of documents (by a hash of their key) in the held-out side"})
    max_docs: int | None = field(default=None, metadata={"help": "stop after this many documents (before the split across workers)"})
    max_bytes: int | None = field(default=None, metadata={"help": "stop after this many bytes of text"})
    max_length: int = field(default=2048, metadata={"help": "teacher window length in tokens, its BOS included"})
    stride: int = field(default=512, metadata={"help": "overlap between windows: every prediction sees at least this many earlier tokens of its document (or all of them)"})
    batch_tokens: int = field(default=8192, metadata={"help": "padded tokens per teacher forward batch"})
    group_tokens: int = field(default=32768, metadata={"help": "tokens read and ordered by length together (bounds memory)"})
    device: str = field(default="auto", metadata={"help": "cpu, cuda, cuda:N or auto (the accelerate device)"})
    dtype: str = field(default="auto", metadata={"help": "teacher dtype: auto (bfloat16 on GPU, float32 on CPU), float32, bfloat16, float16", "choices": ["auto", "float32", "bfloat16", "float16"]})
    encoding: str = field(default=DEFAULT_ENCODING, metadata={"help": "value encoding of the store: pow8, log8, float16, pow12, pow16 (see logit_store/FORMAT.md)"})
    docs_per_shard: int | None = field(default=None, metadata={"help": "close a shard after this many documents (default: by size)"})
    num_shards: int = field(default=1, metadata={"help": "split the corpus across this many independent jobs"})
    shard_index: int = field(default=0, metadata={"help": "which of --num-shards this job is (0-based)"})
    threads: int | None = field(default=None, metadata={"help": "torch CPU threads (default: torch's choice)"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})


@dataclass
class DumpSummary:
    documents: int = 0
    skipped_existing: int = 0  # documents earlier runs stored
    existing_text_bytes: int = 0  # and their text
    text_bytes: int = 0
    tokens: int = 0
    positions: int = 0
    teacher_nll_nats: float = 0.0
    dropped_mass_sum: float = 0.0
    teacher_rows: int = 0
    empty_skipped: int = 0
    heldout_skipped: int = 0
    store_bytes: int = 0  # this writer's shards, documents of earlier runs included
    setup_seconds: float = 0.0  # loading the teacher, tokenizer and trie
    seconds: float = 0.0  # the pass itself, after setup
    forward_seconds: float = 0.0
    outside_forward_seconds: float = 0.0
    convert_write_seconds: float = 0.0  # conversion + encoding + writing, overlapped with the forward on CPU

    @property
    def teacher_bpb(self) -> float:
        return self.teacher_nll_nats / (math.log(2) * self.text_bytes) if self.text_bytes else float("nan")

    @property
    def bytes_per_text_byte(self) -> float:
        stored_text = self.existing_text_bytes + self.text_bytes
        return self.store_bytes / stored_text if stored_text else float("nan")

    def lines(self) -> list[str]:
        store = f"{self.store_bytes:,} bytes in shards ({self.bytes_per_text_byte:.2f} per text byte)"
        if not self.documents:
            return [
                f"documents           0 (+{self.skipped_existing:,} already stored, {self.empty_skipped:,} empty skipped): nothing left to dump",
                f"store size          {store}",
            ]
        mean_dropped = self.dropped_mass_sum / max(self.teacher_rows, 1)
        return [
            f"documents           {self.documents:,} (+{self.skipped_existing:,} already stored, {self.empty_skipped:,} empty skipped)",
            f"text bytes          {self.text_bytes:,}",
            f"teacher tokens      {self.tokens:,}",
            f"stream positions    {self.positions:,}",
            f"store size          {store}",
            f"teacher BPB         {self.teacher_bpb:.4f}",
            f"dropped special mass {mean_dropped:.3g} per teacher row (mean)",
            f"time                {self.seconds:.1f} s after {self.setup_seconds:.1f} s of setup "
            f"({self.tokens / max(self.seconds, 1e-9):,.0f} tokens/s); "
            f"{self.outside_forward_seconds / max(self.seconds, 1e-9):.1%} of it outside the teacher forward",
        ]


@dataclass
class PendingDocument:
    index: int
    key: str
    data: bytes
    token_ids: np.ndarray
    windows: list[Window]
    rows: list = field(default_factory=list)  # per window: the teacher rows it produced


def corpus_spec(config: DumpConfig) -> CorpusSpec:
    return CorpusSpec(
        source=config.corpus,
        text_field=config.text_field,
        separator=config.separator,
        split=config.dataset_split,
        config=config.dataset_config,
        streaming=config.streaming,
        subset=config.subset,
        heldout_fraction=config.heldout_fraction,
        max_docs=config.max_docs,
        max_bytes=config.max_bytes,
    )


def store_settings(config: DumpConfig, teacher: Teacher) -> dict:
    """What determines the store's values: recorded in the manifest, compared on resume."""
    return {
        "max_length": config.max_length,
        "stride": config.stride,
        "context_prefix": teacher.context_prefix,
        "teacher_dtype": str(teacher.dtype).removeprefix("torch."),
        "end_of_text_ids": list(teacher.vocab.end_of_text_ids),
        "corpus": {k: v for k, v in asdict(corpus_spec(config)).items() if k != "source"},
        "num_shards": config.num_shards,
    }


def _validate(config: DumpConfig) -> None:
    if config.max_length < 2:
        raise UserError("--max-length must be at least 2")
    if not 0 <= config.stride < config.max_length - 1:
        raise UserError(f"--stride must be in 0..{config.max_length - 2} (below --max-length minus the BOS)")
    if not 0 <= config.shard_index < config.num_shards:
        raise UserError(f"--shard-index must be in 0..{config.num_shards - 1}")
    if config.batch_tokens < config.max_length:
        raise UserError("--batch-tokens must be at least --max-length")


def _device(config: DumpConfig, state) -> torch.device:
    return state.device if config.device == "auto" else torch.device(config.device)


def run_dump(config: DumpConfig) -> DumpSummary:
    from accelerate import PartialState

    from logit_store.store import StoreWriter

    _validate(config)
    spec = corpus_spec(config)
    check_source(spec)
    started = time.perf_counter()
    state = PartialState(cpu=config.device == "cpu" or not torch.cuda.is_available())
    if config.threads:
        torch.set_num_threads(config.threads)
    workers = config.num_shards * state.num_processes
    worker = config.shard_index * state.num_processes + state.process_index
    device = _device(config, state)
    dtype = None if config.dtype == "auto" else DTYPES[config.dtype]

    teacher = load_teacher(
        config.teacher,
        tokenizer_source=config.tokenizer,
        gguf_file=config.gguf_file,
        device=device,
        dtype=dtype,
        end_of_text=config.end_of_text,
    )
    converter = Converter(teacher.vocab)
    teacher.permute_output(converter.column_order)
    encoder = DocumentEncoder(teacher.tokenizer, teacher.vocab)
    writer = StoreWriter(
        config.output,
        teacher.vocab,
        encoding=config.encoding,
        teacher=teacher.name,
        settings=store_settings(config, teacher),
        corpus_hash=corpus_fingerprint(spec),
        writer_id=worker,
        docs_per_shard=config.docs_per_shard,
        trie=converter.trie,
    )
    summary = DumpSummary(skipped_existing=writer.num_existing_documents, existing_text_bytes=writer.existing_text_bytes)
    summary.setup_seconds = time.perf_counter() - started
    started = time.perf_counter()
    counts = CorpusCounts()
    documents = _worker_documents(select_documents(spec, counts), worker, workers, writer.num_existing_documents)
    bar = tqdm(desc=f"dump[{worker}]", unit="tok", unit_scale=True, disable=not config.progress, position=state.process_index, dynamic_ncols=True)
    sink = _Sink(writer, converter, summary, bar, on_device=device.type == "cuda")
    try:
        for group in _groups(documents, encoder, teacher, config):
            forward_start = time.perf_counter()
            _run_teacher(teacher, group, config, sink, bar)
            summary.forward_seconds += time.perf_counter() - forward_start
        sink.close()
        writer.close()
    except BaseException:
        sink.abort()
        raise
    finally:
        bar.close()
    summary.empty_skipped, summary.heldout_skipped = counts.empty_skipped, counts.heldout_skipped
    summary.store_bytes = sum(p.stat().st_size for p in writer.directory.glob(f"shard-{worker:05d}-*"))
    summary.seconds = time.perf_counter() - started
    summary.outside_forward_seconds = summary.seconds - summary.forward_seconds
    return summary


def _worker_documents(documents, worker: int, workers: int, skip: int) -> Iterator[tuple[int, str, bytes]]:
    """This worker's documents (every ``workers``-th), minus the first ``skip`` already stored."""
    mine = 0
    for index, (key, data) in enumerate(documents):
        if index % workers != worker:
            continue
        mine += 1
        if mine > skip:
            yield index, key, data


def _groups(documents, encoder: DocumentEncoder, teacher: Teacher, config: DumpConfig) -> Iterator[list[PendingDocument]]:
    prefix = len(teacher.context_prefix)
    group: list[PendingDocument] = []
    tokens = 0
    for index, key, data in documents:
        ids = encoder.encode(data)
        windows = plan_windows(len(ids), prefix, config.max_length, config.stride)
        group.append(PendingDocument(index, key, data, ids, windows))
        tokens += len(ids) + prefix
        if tokens >= config.group_tokens:
            yield group
            group, tokens = [], 0
    if group:
        yield group


def _run_teacher(teacher: Teacher, group: list[PendingDocument], config: DumpConfig, sink: "_Sink", bar) -> None:
    """Forward every window of the group, longest first, in padded batches; hand documents over
    to the sink in document order once all their rows are there."""
    prefix = teacher.context_prefix
    jobs = [(doc, k) for doc in group for k in range(len(doc.windows))]
    for doc in group:
        doc.rows = [None] * len(doc.windows)
    jobs.sort(key=lambda job: -job[0].windows[job[1]].input_length(len(prefix)))
    batch: list = []
    for doc, k in jobs:
        if batch and (len(batch) + 1) * _length(batch[0], prefix) > config.batch_tokens:
            bar.update(_forward_batch(teacher, batch, prefix))
            batch = []
        batch.append((doc, k))
    if batch:
        bar.update(_forward_batch(teacher, batch, prefix))
    for doc in group:
        sink.put(doc)


def _length(job, prefix: list[int]) -> int:
    doc, k = job
    return doc.windows[k].input_length(len(prefix))


def _forward_batch(teacher: Teacher, batch, prefix: list[int]) -> int:
    """Run one padded batch of windows; store each window's rows; return the rows computed."""
    width = max(_length(job, prefix) for job in batch)
    input_ids = np.zeros((len(batch), width), dtype=np.int64)
    mask = np.zeros((len(batch), width), dtype=np.int64)
    rows = []
    for b, (doc, k) in enumerate(batch):
        w = doc.windows[k]
        seq = np.concatenate([np.asarray(prefix, dtype=np.int64), doc.token_ids[w.token_start : w.token_stop]])
        input_ids[b, : len(seq)] = seq
        mask[b, : len(seq)] = 1
        rows.append(w.output_positions(len(prefix)))
    device = teacher.device
    logits = teacher.logits(torch.from_numpy(input_ids).to(device), torch.from_numpy(mask).to(device), rows)
    start = 0
    for (doc, k), r in zip(batch, rows):
        part = logits[start : start + len(r)]
        start += len(r)
        doc.rows[k] = part if device.type == "cuda" else part.numpy()
    return start


class _Sink:
    """Converts finished documents and writes them in order, on a background thread on CPU
    (Numba releases the GIL) or right after the forward on CUDA (the torch path, on device)."""

    def __init__(self, writer, converter: Converter, summary: DumpSummary, bar, on_device: bool):
        self.writer, self.converter, self.summary, self.bar = writer, converter, summary, bar
        self.on_device = on_device
        self.queue: queue.Queue = queue.Queue(maxsize=2)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._work, daemon=True)
        self.thread.start()

    def put(self, doc: PendingDocument) -> None:
        if self.error:
            raise self.error
        if self.on_device:
            start = time.perf_counter()
            logits = torch.cat(doc.rows)
            item = (doc, self.converter.convert_torch(doc.token_ids, logits, columns="sorted"))
            self.summary.convert_write_seconds += time.perf_counter() - start
        else:
            item = (doc, None)
        self.queue.put(item)

    def _work(self) -> None:
        try:
            while (item := self.queue.get()) is not None:
                doc, dist = item
                start = time.perf_counter()
                if dist is None:
                    rows = np.concatenate(doc.rows) if len(doc.rows) > 1 else doc.rows[0]
                    dist = self.converter.convert_numba(doc.token_ids, rows, columns="sorted")
                self._write(doc, dist)
                self.summary.convert_write_seconds += time.perf_counter() - start
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            self.error = exc

    def _write(self, doc: PendingDocument, dist: DocumentDistributions) -> None:
        self.writer.add_distributions(dist, key=doc.key)
        s = self.summary
        s.documents += 1
        s.text_bytes += len(doc.data)
        s.tokens += len(doc.token_ids)
        s.positions += dist.layout.num_positions
        s.teacher_nll_nats -= dist.log_likelihood()
        s.dropped_mass_sum += float(dist.dropped_mass.sum())
        s.teacher_rows += len(dist.dropped_mass)
        elapsed = max(self.bar.format_dict.get("elapsed", 0.0), 1e-9)
        self.bar.set_postfix(docs=s.documents, bytes_s=f"{s.text_bytes / elapsed:,.0f}")

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()
        if self.error:
            raise self.error

    def abort(self) -> None:
        try:
            self.queue.put_nowait(None)
        except queue.Full:
            pass
