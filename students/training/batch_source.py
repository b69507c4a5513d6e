"""Where the trainer's batches come from, how large they are, and where in them it stands.

:class:`BatchConfig` sizes the batches (the ``train`` flags ``--seq-len`` … ``--num-workers``). A
:class:`DataSource` builds a :class:`students.training.store_windows.SplitBatches` (the logit stores by
default, tests plug in :mod:`students.training.synthetic`); :class:`BatchStream` turns it into endless
micro-batches over epochs and remembers the position (epoch, batches consumed in the epoch) that
a checkpoint saves and a resumed run seeks to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bytestream.stream_kind import StreamKind
from common.errors import UserError
from configs.ranges import COUNT, NON_NEGATIVE, at_least

if TYPE_CHECKING:  # torch is imported where it runs: `bytedistill train --help` loads none
    import torch

    from students.training.store_windows import SplitBatches


@dataclass
class BatchConfig:
    """The training batches: sequences of ``seq_len`` symbols, ``batch_size`` of them per micro-batch
    and process, ``grad_accum`` micro-batches per optimizer step."""

    seq_len: int = field(default=512, metadata={"help": "symbols per training sequence", "range": at_least(2)})
    batch_size: int = field(default=16, metadata={"help": "sequences per micro-batch per process", "range": COUNT})
    grad_accum: int = field(default=1, metadata={"help": "micro-batches per optimizer step", "range": COUNT})
    num_workers: int = field(
        default=0,
        metadata={
            "help": "data loader worker processes per process (decode the store in parallel)",
            "range": NON_NEGATIVE,
        },
    )


def _no_check(paths: list[str], allow_partial: bool, stream: StreamKind) -> None:
    """A data source whose data is always whole and of the student's stream."""


@dataclass
class DataSource:
    """``build(paths, seq_len, batch_size, *, stream, with_teacher, teacher_dtype, shuffle, seed,
    rank, world_size, num_workers, max_symbols)`` returns a :class:`SplitBatches` of ``stream``;
    ``describe(paths)`` returns what the model card says about the teacher and data;
    ``check(paths, allow_partial, stream)`` refuses data that is not whole or not of the student's
    stream before a run touches anything."""

    build: Callable[..., SplitBatches]
    describe: Callable[[list[str]], dict[str, Any]]
    check: Callable[[list[str], bool, StreamKind], None] = _no_check


def _store_dataset(
    paths: list[str], seq_len: int, batch_size: int, *, stream: StreamKind, **kwargs: Any
) -> SplitBatches:
    from students.training.store_windows import PackedStreamDataset

    # a store of another stream is refused there (check_stores refuses it first, with the flag to give)
    return PackedStreamDataset([Path(p) for p in paths], seq_len, batch_size, stream=stream, **kwargs)


def _describe_stores(paths: list[str]) -> dict[str, Any]:
    """Teacher and data as recorded in the stores' manifests (for run_info.json and the model card)."""
    from logit_store.manifest import read_manifest
    from students.models.cost import rates_of_stores

    manifest = read_manifest(Path(paths[0]))
    return {
        "teacher": manifest.get("teacher") or "unknown",
        "corpus": ", ".join(Path(p).name for p in paths),
        "corpus_hash": manifest.get("corpus_hash"),
        "encoding": manifest.get("encoding"),
        "rates": rates_of_stores(paths),
    }


def refuse_partial_stores(paths: list[str], allow_partial: bool) -> None:
    """Refuse a store whose dump is unfinished (a writer still running or stopped midway) or
    incomplete (a writer that never wrote), naming its writers, unless ``allow_partial``: training
    on it would use part of the corpus without a word. Paths that are not stores are left to the
    reading to refuse."""
    from logit_store.file_names import MANIFEST
    from logit_store.integrity import writer_states
    from logit_store.manifest import read_manifest

    for path in paths:
        if allow_partial or not (Path(path) / MANIFEST).is_file():
            continue
        states = writer_states(Path(path), read_manifest(Path(path)))
        if states:
            raise UserError(
                f"the store {path} is partial: {states.describe()}; finish its dump (rerun it), "
                "or give --allow-partial to train on the documents it holds"
            )


def streams_of_stores(paths: list[str]) -> dict[str, StreamKind]:
    """The stream each of ``paths`` that is a store holds, as its manifest names it."""
    from logit_store.file_names import MANIFEST
    from logit_store.manifest import manifest_stream, read_manifest

    return {p: manifest_stream(read_manifest(Path(p))) for p in paths if (Path(p) / MANIFEST).is_file()}


def reserved_of_stores(paths: list[str]) -> list[str]:
    """The reserved symbols (the teacher's chat specials, by text, in order) the stores among ``paths``
    hold after their stream's alphabet: none for plain stores; stores with different ones are refused
    (their symbols' ids would mean different things)."""
    from logit_store.file_names import MANIFEST
    from logit_store.manifest import read_manifest

    found: dict[str, list[str]] = {}
    for path in paths:
        if (Path(path) / MANIFEST).is_file():
            found[path] = [entry["text"] for entry in read_manifest(Path(path)).get("reserved_symbols") or []]
    first = next(iter(found), None)
    for path, reserved in found.items():
        if reserved != found[first]:
            raise UserError(
                f"the stores {first} and {path} hold different reserved symbols ({found[first]} and {reserved}): "
                "train on stores dumped with one chat template"
            )
    return found[first] if first is not None else []


def refuse_other_streams(paths: list[str], stream: StreamKind = StreamKind.EOT, *, training: bool = False) -> None:
    """Refuse stores of two streams together (naming one of each), then a store of another stream
    than the student's, ``stream`` (when ``training``, naming the ``--stream`` that trains on it):
    neither stream's store can be derived from the other's (docs/DESIGN.md, "The fused stream").
    Paths that are not stores are left to the reading to refuse."""
    streams = streams_of_stores(paths)
    first = next(iter(streams), None)
    for path, held in streams.items():
        if held is not streams[first]:
            raise UserError(
                f"the stores {first} ({streams[first].shown} stream) and {path} ({held.shown} stream) hold "
                "different streams: train on stores of one stream"
            )
    if first is not None and streams[first] is not stream.stored:
        held = streams[first]
        remedy = f"dump the corpus with --stream {stream.stored.value}"
        if training:
            remedy = f"give --stream {held.value} to train a {held.shown} student on it, or {remedy}"
        reads = f"the {stream.shown} stream"
        if stream.stored is not stream:
            reads += f", read from {stream.stored.shown}-stream stores"
        raise UserError(f"{first} is a {held.shown}-stream store; this student reads {reads}: {remedy}")


def check_stores(paths: list[str], allow_partial: bool, stream: StreamKind) -> None:
    """What ``train`` refuses before a run touches anything: a path that is not a store, stores of
    another stream than ``stream``, partial stores, stores of two teachers."""
    from logit_store.manifest import read_manifest
    from logit_store.teachers import refuse_other_teachers

    manifests = [(path, read_manifest(Path(path))) for path in paths]  # a path that is no store: one line
    refuse_other_streams(paths, stream, training=True)
    refuse_partial_stores(paths, allow_partial)
    refuse_other_teachers(manifests)


STORE_SOURCE = DataSource(build=_store_dataset, describe=_describe_stores, check=check_stores)


class BatchStream:
    """Endless micro-batches over epochs, starting at (epoch, batches consumed in the epoch);
    :attr:`origin` names the last one: (epoch, split, index of its first window in the split)."""

    def __init__(self, dataset: SplitBatches, epoch: int = 0, batches: int = 0):
        self.dataset, self.epoch, self.batches = dataset, epoch, batches
        self.origin: tuple[int, int, int] | None = None
        self._loader = dataset.loader()  # its workers live as long as the stream
        self._iterator: Iterator | None = None

    def __next__(self) -> dict[str, torch.Tensor]:
        for _ in range(2):
            if self._iterator is None:
                self.dataset.set_position(self.epoch, self.batches)
                self._iterator = iter(self._loader)
            batch = next(self._iterator, None)
            if batch is not None:
                self.origin = (self.epoch, *self.dataset.origin(self.batches))
                self.batches += 1
                return batch
            self._iterator, self.epoch, self.batches = None, self.epoch + 1, 0
        raise UserError("the training stores yield no batch for this process (are they empty?)")

    def position(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches": self.batches}


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """The batch on ``device``; teacher rows travel in their compact dtype and widen there."""
    moved = {key: value.to(device, non_blocking=True) for key, value in batch.items()}
    if "target_probs" in moved:
        moved["target_probs"] = moved["target_probs"].float()
    return moved


def utf8_bytes(batch: dict[str, torch.Tensor], stream: StreamKind) -> torch.Tensor:
    """Target positions that are text bytes of ``stream`` (in the fused stream, one per byte,
    whatever its flag): the BPB denominator and the training-bytes counter."""
    return (batch["loss_mask"].bool() & (batch["target_ids"] < stream.text_symbols)).sum()
