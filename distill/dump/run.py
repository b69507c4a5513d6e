"""``dump``: run a teacher over a corpus and write a logit store (one offline pass).

The corpus's pieces are dealt to the store's writers (a fixed number, recorded in the store:
:mod:`distill.dump.sharding`, :mod:`distill.corpus.shares`), which are dealt to the workers
(``accelerate`` ranks × ``--num-shards`` independent jobs); a worker reads only its writers' pieces
and each writer writes its own shards, so the result opens as one store. Rerunning the same
command resumes, with any number of processes.

This module holds the store the settings open (:class:`DumpConfig`, in :mod:`distill.dump.config`),
and the orchestration of the stages, each a module with one owner of its state:

- the plan (:mod:`distill.dump.plan`): which documents are left, encoded or skipped, cut into
  teacher windows and read in groups;
- the teacher pass (:mod:`distill.dump.teacher_pass`): a group's windows read by the teacher's reader
  (:mod:`distill.teacher.reader`, the one on-policy scoring reads with), batched by length through the
  trunk, then the LM head (in float32, permuted into the conversion's column order) in chunks of
  ``head_rows`` rows, so logits never pile up (:mod:`distill.dump.memory`); on CUDA each chunk is
  converted on the device right after the head;
- the conversion sink (:mod:`distill.dump.sink`): a background thread that, on a CPU,
  converts the chunks with Numba while the teacher computes on, and writes complete documents in
  corpus order; only converted values wait for a document to be complete; each store writer
  encodes them on its own ``--encode-threads`` (:class:`logit_store.StoreWriter`);
- the summary (:mod:`distill.dump.summary`), built once from what the stages hand back.
"""

from __future__ import annotations

import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from bytestream.stream_kind import StreamKind
from common.devices import parse_device
from common.errors import UserError
from distill.conversion.converter import Converter
from distill.corpus.shares import pieces_settings, share_fingerprints, writer_documents
from distill.corpus.spec import CorpusCounts, CorpusSpec, check_source, corpus_fingerprint, corpus_listing
from distill.dump import memory as dump_memory
from distill.dump.config import DEFAULT_MAX_MESSAGES, DumpConfig
from distill.dump.numerics import match_recorded_numerics, teacher_numerics
from distill.dump.plan import Skipper, plan_groups
from distill.dump.respond import with_answers
from distill.dump.settle import DumpPlan, settle
from distill.dump.sharding import WriterLock
from distill.dump.sink import ConversionSink, DocumentsPlanned, store_errors
from distill.dump.summary import DumpSummary
from distill.dump.teacher_pass import TeacherPass
from distill.teacher.chat import ChatEncoder, chat_encoder, reserved_symbols
from distill.teacher.encode import DocumentEncoder
from distill.teacher.model import Teacher
from distill.teacher.reader import TeacherReader
from logit_store.file_names import SHARD, WRITER_LOCK


def store_settings(plan: DumpPlan, teacher: Teacher, chat: ChatEncoder | None = None) -> dict:
    """What determines the store's values and which writer holds which document: recorded in
    the manifest, compared on resume (a chat store's: the template that renders its conversations;
    the reading, which on-policy training reads back: :meth:`distill.teacher.windows.Reading.of_manifest`)."""
    config, writers = plan.config, plan.writers
    chat_settings = {} if chat is None else chat.settings()
    return (
        chat_settings
        | plan.reading.settings()
        | {
            "context_prefix": teacher.context_prefix,
            "teacher_dtype": str(teacher.dtype).removeprefix("torch."),
            "end_of_text_ids": list(teacher.vocab.end_of_text_ids),
            "corpus": stored_corpus(config.corpus),
            "writers": writers,
            "corpus_pieces": pieces_settings(),
        }
        | ({"max_document_bytes": config.max_document_bytes} if config.max_document_bytes is not None else {})
        | (
            {"max_messages": config.chat.max_messages}
            if chat and config.chat.max_messages != DEFAULT_MAX_MESSAGES
            else {}
        )
    )


def _validate(config: DumpConfig) -> None:
    """What no field's range can say (each range is checked when the config is built): the bounds one
    setting sets for another. A config may be parsed with them unmet, as a file of defaults is."""
    if config.windows.stride >= config.windows.max_length - 1:
        raise UserError(f"--stride must be in 0..{config.windows.max_length - 2} (below --max-length minus the BOS)")
    if config.job_index >= config.job_count:
        raise UserError(f"--shard-index must be in 0..{config.job_count - 1}")
    if config.batching.batch_tokens < config.windows.max_length:
        raise UserError("--batch-tokens must be at least --max-length")
    if not config.chat.enabled and (
        config.chat.respond or config.chat.chat_template is not None or config.chat.fields.prompt is not None
    ):
        raise UserError("--respond, --chat-template and --prompt-field read conversations: add --chat")


def run_dump(config: DumpConfig) -> DumpSummary:
    from accelerate import PartialState

    _validate(config)
    check_source(config.corpus)
    started = time.perf_counter()
    state = PartialState(cpu=config.teacher.device == "cpu" or not torch.cuda.is_available())
    device = parse_device(config.teacher.device, "--device", auto=state.device)
    worker = config.job_index * state.num_processes + state.process_index
    plan = settle(config, device, worker, config.job_count * state.num_processes)  # the store's files checked
    if not config.chat.enabled:  # a chat dump's corpus is known once the teacher renders it
        refuse_other_corpus(plan)
    stage(config, f"loading the teacher {config.teacher.source}")
    teacher = config.teacher.load(device)
    return _dump_pass(plan, teacher, started)


def refuse_other_corpus(plan: DumpPlan) -> None:
    """Refuse, before the teacher loads, a store of another corpus (its listing differs) that holds
    finished documents and was dumped with the same corpus selection, window and encoding (when one
    of those differs too, the store writer names every difference once the teacher is loaded; a
    store without finished documents it replaces)."""
    from logit_store.integrity import shard_sequences

    config, manifest = plan.config, plan.manifest
    if manifest is None:
        return
    output, fingerprint = Path(config.output), corpus_fingerprint(config.corpus)
    settings = manifest.get("settings") or {}
    same_run = (
        settings.get("corpus") == stored_corpus(config.corpus)
        and all(settings.get(k) == v for k, v in plan.reading.settings().items())
        and (manifest.get("encoding") or {}).get("name") == config.store.encoding
    )
    stored = manifest.get("corpus_hash")
    if same_run and stored is not None and stored != fingerprint and shard_sequences(output):
        raise UserError(
            f"{output} holds a different store (corpus_hash differ): corpus_hash: store has {stored!r}, "
            f"this run has {fingerprint!r}; it holds finished documents: choose another --output, or move it away"
        )


def stored_corpus(spec: CorpusSpec) -> dict:
    """The corpus selection a store's settings record (its source is recorded by its hash)."""
    return {k: v for k, v in asdict(spec).items() if k != "source"}


def stage(config: DumpConfig, what: str) -> None:
    """A line on stderr as a setup step starts, so that the wait before the progress bar says what
    runs (with the bar only: ``--progress false`` keeps stderr to warnings and errors)."""
    if config.progress:
        print(f"dump: {what} …", file=sys.stderr, flush=True)


def dump_with_teacher(
    config: DumpConfig, teacher: Teacher, worker: int = 0, workers: int = 1, started: float | None = None
) -> DumpSummary:
    """The dump pass of worker ``worker`` of ``workers`` with a loaded teacher (the benchmarks
    build random teachers in memory); ``started`` is when the setup began."""
    _validate(config)
    return _dump_pass(settle(config, teacher.device, worker, workers), teacher, started)


def _dump_pass(plan: DumpPlan, teacher: Teacher, started: float | None) -> DumpSummary:
    """:func:`dump_with_teacher` with the settings checked and settled (:func:`run_dump` does both
    before the teacher loads)."""
    dump_memory.return_freed_blocks()
    config, mine, worker, stream = plan.config, plan.mine, plan.worker, plan.stream
    spec = config.corpus
    started = time.perf_counter() if started is None else started
    _match_numerics(plan, teacher)
    chat = None
    if config.chat.enabled:
        stage(config, "reading the teacher's chat template")
        chat = chat_encoder(teacher.tokenizer, teacher.vocab, config.chat.chat_template, config.chat.max_messages)
        teacher = replace(teacher, vocab=chat.vocab)
        spec = replace(spec, text_field=config.chat.fields)
        if config.chat.respond:
            spec = with_answers(config, chat, teacher, spec)
    stage(config, f"building the conversion tables ({teacher.vocab.size:,} tokens)")
    converter = Converter(teacher.vocab)
    stage(config, "ordering the output layer's rows for the conversion")
    reader = TeacherReader(teacher.with_sorted_head(converter.sorted_columns), converter, plan.reading)
    teacher = reader.teacher
    budget = _check_memory(memory_terms(plan, teacher), teacher.device, config.batching.group_tokens, stream)
    encoder = chat if chat is not None else DocumentEncoder(teacher.tokenizer, teacher.vocab)
    with ExitStack() as locks:
        for w in mine:
            locks.enter_context(WriterLock(Path(config.output), w))
        stage(config, f"opening the store {config.output} ({len(mine)} of {plan.writers} writers) and the corpus")
        stores = _open_stores(plan, spec, teacher, converter, chat)
        stored = {w: s.num_existing_documents for w, s in stores.items()}
        existing_text_bytes = sum(s.existing_text_bytes for s in stores.values())
        not_read = _report_not_read(spec, config.verbose)
        setup_seconds = time.perf_counter() - started
        started = time.perf_counter()
        counts = CorpusCounts()
        skipper = Skipper(
            config.output, mine, strict=config.strict, max_document_bytes=config.max_document_bytes, budget=budget
        )
        fingerprints = {label: digest for s in stores.values() for label, digest in (s.source_pieces or {}).items()}
        read = writer_documents(spec, plan.writers, mine, counts, fingerprints=fingerprints)  # checked as read
        documents = skipper.remaining(read, stored)
        bar = tqdm(
            desc=f"dump[{worker}] teacher rows",
            unit="row",
            unit_scale=True,
            disable=not config.progress,
            position=worker,
            dynamic_ncols=True,
        )
        sink = ConversionSink(stores, converter, bar)
        try:
            teacher_pass = TeacherPass(
                reader,
                sink,
                batch_tokens=config.batching.batch_tokens,
                head_rows=config.batching.head_rows,
                on_device=plan.on_device,
                bar=bar,
            )
            for group in plan_groups(documents, skipper, encoder, reader, config.batching.group_tokens):
                sink.send(DocumentsPlanned(group))
                teacher_pass.run(group)
            written = sink.close()
            for store in stores.values():
                with store_errors(store):
                    store.close()
        except BaseException:
            sink.abort()
            for store in stores.values():
                store.abandon()  # its threads stop; a shard being written stays partial, as after a crash
            raise
        finally:
            bar.close()
            skipper.close()
    store_bytes = sum(p.stat().st_size for w in mine for p in SHARD.paths(Path(config.output), w))
    seconds = time.perf_counter() - started
    times = teacher_pass.times()
    return DumpSummary(
        **asdict(written),
        skipped_existing=sum(stored.values()),
        existing_text_bytes=existing_text_bytes,
        not_read=not_read,
        setup_seconds=setup_seconds,
        empty_skipped=counts.empty_skipped,
        skips=skipper.skips(),
        skipped_now=skipper.skipped_now,
        store=config.output,
        store_bytes=store_bytes,
        seconds=seconds,
        forward_seconds=times.forward_seconds,
        device_convert_seconds=times.device_convert_seconds,
        outside_forward_seconds=seconds - times.forward_seconds,
    )


def _match_numerics(plan: DumpPlan, teacher: Teacher) -> None:
    """Compute as the store being resumed was written, before the teacher's first forward
    (:mod:`distill.dump.numerics`)."""
    threads, note = match_recorded_numerics(plan.manifest, teacher.device, teacher.dtype, plan.config.threads)
    if threads is not None:  # with or without --progress: how this run's rows are computed
        plural = "s" if threads != 1 else ""
        print(f"dump: resuming with {threads} torch thread{plural}, as the store was written", file=sys.stderr)
    if note is not None:
        print(f"dump: {note}", file=sys.stderr, flush=True)


def _open_stores(
    plan: DumpPlan, spec: CorpusSpec, teacher: Teacher, converter: Converter, chat: ChatEncoder | None = None
) -> dict:
    """This worker's store writers by writer id (each resumes its own shards). A store of another
    corpus or settings that holds no finished document is replaced when one process runs."""
    from logit_store import StoreIdentity, StoreWriter
    from logit_store.writer import DifferentStore

    config, mine = plan.config, plan.mine
    identity = StoreIdentity(
        teacher.vocab,
        teacher=teacher.name,
        teacher_hash=teacher.weights_hash,
        tokenizer_source=teacher.tokenizer_source,
        corpus_hash=corpus_fingerprint(spec),
        settings=store_settings(plan, teacher, chat),
        encoding=config.store.encoding,
        stream=plan.stream,
        reserved_symbols=None if chat is None else reserved_symbols(chat),
        teacher_numerics=teacher_numerics(teacher.device, teacher.dtype),
    )
    source = share_fingerprints(spec, plan.writers, mine)

    def open_writer(w: int) -> StoreWriter:
        return StoreWriter(
            config.output,
            identity,
            source_pieces=source[w],
            writer_id=w,
            docs_per_shard=config.store.docs_per_shard,
            chunk_bytes=config.store.chunk_bytes,
            trie=converter.trie,
            encode_threads=plan.encode_threads,
        )

    try:
        first = open_writer(mine[0])
    except DifferentStore as exc:
        _replace_unfinished(config, exc, mine, plan.writers)
        first = open_writer(mine[0])
    return {mine[0]: first} | {w: open_writer(w) for w in mine[1:]}


def _replace_unfinished(config: DumpConfig, exc, mine: tuple[int, ...], num_writers: int) -> None:
    """Replace a different store without finished documents, or refuse naming what to do."""
    from logit_store.ownership import remove_unfinished_store

    output = Path(config.output)
    if exc.finished:
        raise UserError(f"{exc}; it holds finished documents: choose another --output, or move it away") from None
    others = sorted({WRITER_LOCK.numbers(p.name)[0] for p in WRITER_LOCK.paths(output)} - set(mine))
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


def memory_terms(plan: DumpPlan, teacher: Teacher, longest_document_tokens: int = 0) -> list[dump_memory.MemoryTerm]:
    """The peak-memory formula's terms for this plan (its writers: those of this process)."""
    config = plan.config
    return dump_memory.memory_terms(
        teacher,
        batch_tokens=config.batching.batch_tokens,
        max_length=config.windows.max_length,
        head_rows=config.batching.head_rows,
        group_tokens=config.batching.group_tokens,
        device_conversion=plan.on_device,
        writers=len(plan.mine),
        chunk_bytes=plan.chunk_bytes,
        encode_threads=plan.encode_threads,
        longest_document_tokens=longest_document_tokens,
        stream=plan.stream,
    )


def _check_memory(
    terms: list[dump_memory.MemoryTerm], device, group_tokens: int, stream: StreamKind
) -> dump_memory.DocumentBudget:
    """Print the peak-memory formula's terms; refuse settings that cannot fit the device. Returns
    what a document longer than a group may add."""
    print(dump_memory.describe(terms, device, stream), file=sys.stderr)
    problem = dump_memory.over_budget(terms, device)
    if problem:
        raise UserError(problem)
    return dump_memory.document_budget(terms, device, group_tokens, stream)


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
