"""Bits per byte of an exported student on text files, record files or logit stores (``bytedistill score``).

Files are read as ``dump`` reads a corpus (:mod:`distill.corpus.spec`): a ``.txt``/``.md`` file is one
document, a ``.jsonl``/``.jsonl.zst``/``.parquet`` file one per record; empty documents are skipped
and a source without any document is refused.

Same definitions as ``train``'s evaluation (docs/DESIGN.md, "Evaluation"): every symbol's NLL
(``<eot>`` and ``<eos>`` included) over the UTF-8 bytes (the text symbols: in the fused stream
both flags of a byte). Every document becomes its training stream in the stream the student
reads (``<bos> bytes(t_1) <eot> … <eot> <eos>``, or the fused ``<bos> f(t_1) … f(t_m) <eos>``):
a store's own stream (a store of the other stream is refused), or the exported stream
tokenizer's for text; the streams of a source's documents are packed one after another, as in
training, and scored in windows of at most the trained context that start at the source's first
symbol: a source's figure is the one it gets alone, whatever is scored beside it (the same text
as a store and as a record file gives one figure). With ``stride`` = context (the default)
the windows do not overlap, exactly as ``train`` evaluates; a smaller stride slides the window so
that every position after the first window sees at least ``context - stride`` symbols before it.
With ``packed=False`` each document is scored on its own from its ``<bos>`` (independent per-file
figures; lm-evaluation-harness's rolling loglikelihood windows are these, without ``<eos>``).

A store also gives the teacher's BPB on the same bytes (its stored distributions). The
``plain`` modes feed ``<bos>`` + the bytes without token ends (no ``<eot>``, no byte flagged: the
stock tokenizer's path); ``plain-renormalised`` renormalises the student's probabilities over the
256 unflagged bytes + ``<eos>``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from bytestream.alphabet import NUM_BYTES
from bytestream.bytes_stream import as_read
from bytestream.stream_kind import StreamKind
from bytestream.stream_tokenizer import TEACHER_TOKENIZER_FILE, ByteStreamTokenizer
from common.errors import UserError
from distill.corpus.spec import RECORD_SUFFIXES, TEXT_SUFFIXES, CorpusSpec, raw_documents
from logit_store.file_names import MANIFEST
from students.release.exported_folder import load_model, load_stream_tokenizer, require_same_stream
from students.release.score_options import MODES, ScoreOptions


@dataclass
class Document:
    source: int  # index of the file or store it came from
    symbols: np.ndarray  # (L,) the stream, <bos> … <eos>
    teacher_nll: np.ndarray | None  # (L-1,) nats of each next symbol under the teacher (stores only)


@dataclass
class SourceScore:
    name: str
    documents: int = 0
    bytes: int = 0
    student_nll: float = 0.0  # nats
    teacher_nll: float | None = None

    @property
    def student_bpb(self) -> float:
        return self.student_nll / (math.log(2) * self.bytes) if self.bytes else float("nan")

    @property
    def teacher_bpb(self) -> float | None:
        return None if self.teacher_nll is None or not self.bytes else self.teacher_nll / (math.log(2) * self.bytes)


# ------------------------------------------------------------------------------ documents


def plain_symbols(data: bytes, stream: StreamKind) -> list[int]:
    """``<bos>`` + the bytes + ``<eos>``, no token end marked."""
    return [stream.bos, *data, stream.eos]


def _file_documents(path: Path, text_field: str) -> Iterator[bytes]:
    """A file's documents as ``dump`` reads them (:mod:`distill.corpus.spec`: a text field that is not
    text is refused); empty ones are skipped, as ``dump`` skips them."""
    if not path.name.lower().endswith(TEXT_SUFFIXES + RECORD_SUFFIXES):
        raise UserError(f"{path}: score reads {', '.join(TEXT_SUFFIXES + RECORD_SUFFIXES)} files and store folders")
    for _, data in raw_documents(CorpusSpec(str(path), text_field=text_field)):
        if data:
            yield data


def require_stream(path: Path, stream: StreamKind) -> None:
    """Refuse a store of another stream than the student's (neither is derived from the other)."""
    from logit_store.manifest import manifest_stream, read_manifest

    held = manifest_stream(read_manifest(path))
    if held is not stream.stored:
        raise UserError(
            f"{path} is a {held.shown}-stream store and the student reads the {stream.shown} stream: score "
            f"a store dumped with --stream {stream.stored.value}, or the text"
        )


def _store_documents(path: Path, index: int, mode: str, stream: StreamKind) -> Iterator[Document]:
    from logit_store import LogitStore
    from logit_store.reader import densify

    if (path / MANIFEST).is_file():  # not a store: LogitStore names what is wrong
        require_stream(path, stream)
    store = LogitStore(path)
    for i in range(len(store)):
        doc = store.document(i)
        layout = doc.layout
        dense = densify(layout, doc.values)
        symbols, dense = as_read(stream, layout.symbols.astype(np.int64), dense)  # a bytes student's: flags summed
        targets = symbols[1:]
        teacher_nll = -np.log(dense[np.arange(len(targets)), targets].astype(np.float64))
        if mode == "stream":
            yield Document(index, symbols, teacher_nll)
        else:
            yield Document(index, np.asarray(plain_symbols(layout.text_bytes(), stream)), None)


def documents(
    sources: list[Path],
    tokenizer: ByteStreamTokenizer | None,
    options: ScoreOptions,
    stream: StreamKind = StreamKind.EOT,
) -> Iterator[Document]:
    """Every document of every source, in order, as its stream (``stream``, the student's; text goes
    through ``tokenizer``, which writes it); a source without any is refused."""
    for index, path in enumerate(sources):
        found = False
        for document in _source_documents(path, index, tokenizer, options, stream):
            found = True
            yield document
        if not found:
            raise UserError(f"{path}: no documents to score (empty)")


def _source_documents(
    path: Path, index: int, tokenizer: ByteStreamTokenizer | None, options: ScoreOptions, stream: StreamKind
) -> Iterator[Document]:
    if path.is_dir():
        yield from _store_documents(path, index, options.mode, stream)
        return
    if not path.is_file():
        raise UserError(f"{path}: no such file or store folder")
    for data in _file_documents(path, options.text_field):
        try:
            symbols = tokenizer.encode_bytes(data, eos=True) if tokenizer is not None else plain_symbols(data, stream)
        except ValueError as exc:
            raise UserError(f"{path}: {exc}") from exc
        yield Document(index, np.asarray(symbols, dtype=np.int64), None)


# -------------------------------------------------------------------------------- scoring


@dataclass
class PackedStream:
    """All documents' streams back to back: input, target, scored and source of every position."""

    inputs: np.ndarray
    targets: np.ndarray
    scored: np.ndarray  # bool: the position predicts a symbol of its own document
    source: np.ndarray
    teacher_nll: np.ndarray  # 0 where unknown


def pack(docs: list[Document], stream: StreamKind) -> PackedStream:
    inputs, targets, scored, source, teacher = [], [], [], [], []
    for doc in docs:
        n = len(doc.symbols)
        inputs.append(doc.symbols)
        targets.append(np.append(doc.symbols[1:], stream.pad))
        scored.append(np.arange(n) < n - 1)
        source.append(np.full(n, doc.source))
        teacher.append(np.append(doc.teacher_nll, 0.0) if doc.teacher_nll is not None else np.zeros(n))
    if not inputs:
        raise UserError("nothing to score: the sources hold no documents")
    return PackedStream(*(np.concatenate(a) for a in (inputs, targets, scored, source, teacher)))


def windows(total: int, context: int, stride: int, begin: int = 0) -> list[tuple[int, int, int]]:
    """``(start, first scored, end)`` of each window over positions ``begin..total``: every position
    scored exactly once, with at most ``context`` symbols in a window."""
    out, start = [], begin
    while True:
        end = min(start + context, total)
        out.append((start, start if start == begin else start + context - stride, end))
        if end == total:
            return out
        start += stride


def all_windows(
    packed: PackedStream, context: int, stride: int, per_document: bool, stream: StreamKind
) -> list[tuple[int, int, int]]:
    """Windows over each source's packed stream, or over each document's stream on its own."""
    if per_document:
        starts = np.flatnonzero(packed.inputs == stream.bos).tolist()
    else:
        starts = [0, *(np.flatnonzero(np.diff(packed.source)) + 1).tolist()]
    starts.append(len(packed.inputs))
    return [w for begin, end in pairwise(starts) for w in windows(end, context, stride, begin)]


@torch.no_grad()
def window_nll(
    model,
    packed: PackedStream,
    spans: list[tuple[int, int, int]],
    mode: str,
    batch_size: int,
    progress: bool,
    stream: StreamKind,
) -> np.ndarray:
    """The student's NLL (nats) of every position's target, each from one of the windows ``spans``."""
    nll = np.zeros(len(packed.inputs), dtype=np.float64)
    context = max(end - start for start, _, end in spans)
    for at in tqdm(range(0, len(spans), batch_size), desc="score", unit="batch", disable=not progress):
        batch = spans[at : at + batch_size]
        ids = torch.full((len(batch), context), stream.pad, dtype=torch.long)
        for row, (start, _, end) in enumerate(batch):
            ids[row, : end - start] = torch.from_numpy(packed.inputs[start:end])
        logits = model(input_ids=ids, use_cache=False).logits.float()
        if mode == "plain-renormalised":
            keep = torch.zeros(logits.shape[-1], dtype=torch.bool)
            keep[:NUM_BYTES] = True
            keep[stream.eos] = True
            logits = logits.masked_fill(~keep, float("-inf"))
        logprobs = torch.log_softmax(logits, -1)
        for row, (start, first, end) in enumerate(batch):
            targets = torch.from_numpy(packed.targets[first:end])
            picked = logprobs[row, first - start : end - start].gather(
                -1, targets.clamp(max=logits.shape[-1] - 1).unsqueeze(-1)
            )
            nll[first:end] = -picked.squeeze(-1).double().numpy()
    return nll


def require_own_teacher(folder: Path, stores: list[Path]) -> None:
    """Refuse a store dumped with another vocabulary than the teacher tokenizer the folder ships: its
    streams carry another teacher's ``<eot>`` marks, which the student never learnt."""
    if not stores:
        return
    from tokenizers import Tokenizer

    from bytestream.vocab import vocab_from_tokenizer
    from logit_store import LogitStore
    from students.release.teacher_check import same_tokens

    vocab = vocab_from_tokenizer(Tokenizer.from_file(str(folder / TEACHER_TOKENIZER_FILE)))
    for path in stores:
        stored = LogitStore(path).vocab
        if not same_tokens(vocab, stored):
            raise UserError(
                f"{path} was dumped with another vocabulary ({stored.hash[:12]}…) than the teacher tokenizer "
                f"{folder} was exported with ({vocab.hash[:12]}…): score a store of the student's own teacher, "
                "or its text (or --mode plain)"
            )


def score(folder: Path, sources: list[Path], options: ScoreOptions) -> list[SourceScore]:
    """Per-source scores of the exported student at ``folder`` (the last entry is the total)."""
    if options.mode not in MODES:
        raise UserError(f"mode must be one of {', '.join(MODES)}, got {options.mode!r}")
    stream = StreamKind.of_config(load_model(folder, weights=False).config)
    for path in sources:  # before any weight is read
        if (path / MANIFEST).is_file():
            require_stream(path, stream)
    model = load_model(folder)
    tokenizer = load_stream_tokenizer(folder) if options.mode == "stream" else None
    if tokenizer is not None:
        require_same_stream(model, tokenizer)
        if stream is not StreamKind.BYTES:  # a bytes student reads no teacher's token ends: any fused store's text
            require_own_teacher(Path(folder), [path for path in sources if path.is_dir()])
    return score_documents(model, sources, list(documents(sources, tokenizer, options, stream)), options)


def score_documents(model, sources: list[Path], docs: list[Document], options: ScoreOptions) -> list[SourceScore]:
    """Score ready-made document streams (``Document.source`` indexes ``sources``), in the stream the
    model reads."""
    stream = StreamKind.of_config(model.config)
    context = options.context or model.config.max_position_embeddings
    stride = options.stride or context
    if not 0 < stride <= context <= model.config.max_position_embeddings:
        raise UserError(f"need 0 < stride ({stride}) <= context ({context}) <= {model.config.max_position_embeddings}")
    packed = pack(docs, stream)
    spans = all_windows(packed, context, stride, not options.packed, stream)
    nll = window_nll(model, packed, spans, options.mode, options.batch_size, options.progress, stream)
    return summarise(sources, packed, nll, stream)


def summarise(sources: list[Path], packed: PackedStream, nll: np.ndarray, stream: StreamKind) -> list[SourceScore]:
    """Each source's NLL over its text bytes (the denominator: targets that are text symbols)."""
    results = []
    counted = packed.scored & (packed.targets < stream.text_symbols)
    for index, path in enumerate(sources):
        here = packed.scored & (packed.source == index)
        is_store = path.is_dir() and bool(packed.teacher_nll[here].any())
        results.append(
            SourceScore(
                name=path.name or str(path),
                documents=int((here & (packed.targets == stream.eos)).sum()),
                bytes=int((counted & (packed.source == index)).sum()),
                student_nll=float(nll[here].sum()),
                teacher_nll=float(packed.teacher_nll[here].sum()) if is_store else None,
            )
        )
    teachers = [r.teacher_nll for r in results]
    total = SourceScore(
        name="total",
        documents=sum(r.documents for r in results),
        bytes=sum(r.bytes for r in results),
        student_nll=sum(r.student_nll for r in results),
        teacher_nll=sum(teachers) if all(t is not None for t in teachers) else None,
    )
    return results + [total]
