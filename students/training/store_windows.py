"""Training batches from logit stores: a torch ``IterableDataset`` that deals whole chunks and
resumes by seeking.

Stream. Each document's stream (``<bos> … <eot> <eos>``, or the fused ``<bos> … <eos>``, as the
store holds) is appended to one long stream per
split; the stream is cut into consecutive windows of ``seq_len`` inputs. At input position t the
target is the next symbol of the document; the position whose input is ``<eos>`` predicts nothing
(target ``<pad>``, masked), and so do padding positions at the end of the last window. Every
target position of every document is thus in exactly one window once per epoch.

Splits (G = ``world_size`` × workers of them; split g = rank × workers + worker). With
``shuffle`` (training) each epoch deals whole chunks: in an order seeded by ``seed + epoch`` (the
documents of each chunk shuffled too), each chunk goes to the split with the fewest symbols so
far. So every chunk is decompressed once per epoch in total, whatever G, and split sizes differ by
less than one chunk. (A store with fewer chunks than splits has its chunks cut into equal parts
first, the one case that reads a chunk more than once.) Without ``shuffle`` (evaluation) the
stream of all documents in store order is cut into windows once and each split takes a contiguous
range of them: the windows, and so every position's context, are the same for any G.

Batches and position. A split's windows are grouped into batches of ``batch_size`` (its last
batch may be smaller). The ``DataLoader`` of :meth:`SplitBatches.loader` returns them round by
round: batch r of each worker in worker order, skipping workers that have run out. The number of
batches each split holds follows from the store's index, so a position (epoch, batches consumed)
says where every split stands; :meth:`SplitBatches.set_position` makes the next iteration start
there: each split decodes from the window it is due, and the workers are rotated so that the
batch due next comes first. Resuming costs one chunk per split, at step 10 as at step 100,000.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from bytestream.bytes_stream import as_read
from bytestream.stream_kind import StreamKind
from common.errors import UserError
from logit_store.multi import as_store
from logit_store.reader import densify

RELEASE_DELAY = 4  # batches a worker holds on to after handing them over (see SplitBatches._batched)
TEACHER_DTYPES = {"float16": torch.float16, "float32": torch.float32}  # teacher rows as batches hold them


def padding(stream: StreamKind) -> dict[str, int | bool | float]:
    """What padding positions of a window of ``stream`` hold, per field (``roles``: none, 0)."""
    return {"input_ids": stream.pad, "target_ids": stream.pad, "loss_mask": False, "target_probs": 0.0, "roles": 0}


class SplitBatches(IterableDataset):
    """Batches of windows from ``world_size`` × workers splits, resumable at any batch.

    A subclass says which stream its windows hold (:attr:`stream`) and, for the current epoch, how
    many windows a split holds (:meth:`num_windows`) and yields them from a given one on
    (:meth:`windows`).
    """

    stream: StreamKind = StreamKind.EOT

    def __init__(self, seq_len: int, batch_size: int, rank: int, world_size: int, num_workers: int, teacher_dtype: str):
        if seq_len < 1:
            raise UserError(f"seq_len must be at least 1, got {seq_len}")
        if teacher_dtype not in TEACHER_DTYPES:
            raise UserError(f"teacher_dtype must be one of {sorted(TEACHER_DTYPES)}, got {teacher_dtype!r}")
        if batch_size < 1:
            raise UserError(f"batch_size must be at least 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise UserError(f"rank {rank} is not in 0..{world_size - 1}")
        if num_workers < 0:
            raise UserError(f"num_workers must be at least 0, got {num_workers}")
        self.seq_len, self.batch_size = int(seq_len), int(batch_size)
        self.rank, self.world_size, self.num_workers = rank, world_size, num_workers
        self.teacher_dtype = TEACHER_DTYPES[teacher_dtype]
        # (epoch, batches) where the next iteration starts, in shared memory: the DataLoader's
        # workers persist across epochs and read it when an iteration starts
        self._position = torch.zeros(2, dtype=torch.int64).share_memory_()

    # -- what a subclass provides
    def num_windows(self, split: int) -> int:
        raise NotImplementedError

    def window_segments(self, split: int, start: int) -> Iterator[list[dict[str, np.ndarray]]]:
        """Split ``split``'s windows from window ``start`` on, each as the row ranges of streams it
        is made of, in order (views; at most ``seq_len`` rows in all, the rest is padding)."""
        raise NotImplementedError

    def windows(self, split: int, start: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """The same windows as arrays of ``seq_len`` rows (padded), as one batch row holds them."""
        for segments in self.window_segments(split, start):
            batch = self._new_batch(segments[0], 1, shared=False)
            self._fill_row(batch, 0, segments)
            yield {key: value[0].numpy() for key, value in batch.items()}

    def order_settings(self) -> dict:
        """Everything that decides which batch comes when (compared on resume)."""
        return {
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "num_workers": self.num_workers,
        }

    # -- splits and position
    @property
    def workers(self) -> int:
        return max(1, self.num_workers)

    @property
    def num_splits(self) -> int:
        return self.world_size * self.workers

    @property
    def epoch(self) -> int:
        return int(self._position[0])

    @property
    def batches(self) -> int:
        return int(self._position[1])

    def set_epoch(self, epoch: int) -> None:
        self.set_position(epoch, 0)

    def set_position(self, epoch: int, batches: int) -> None:
        """Start the next iteration in ``epoch`` after its first ``batches`` batches (of this rank)."""
        self._position[:] = torch.tensor([int(epoch), 0])
        if not 0 <= batches <= self.num_batches():
            raise UserError(f"cannot resume: epoch {epoch} has {self.num_batches()} batches, not {batches}")
        self._position[1] = int(batches)

    def batch_counts(self) -> np.ndarray:
        """Batches of each of this rank's workers in the current epoch (from the index)."""
        splits = range(self.rank * self.workers, (self.rank + 1) * self.workers)
        windows = np.array([self.num_windows(g) for g in splits], dtype=np.int64)
        return -(-windows // self.batch_size)

    def num_batches(self) -> int:
        return int(self.batch_counts().sum())

    def seek(self, batches: int | None = None) -> tuple[np.ndarray, int]:
        """(batches each worker has given, the worker due next) after ``batches`` batches of this
        rank's epoch (default: ``self.batches``)."""
        counts, n = self.batch_counts(), self.batches if batches is None else batches
        if n == int(counts.sum()):
            return counts, 0
        # the last full round R: Σ min(counts, R) <= n
        low, high = 0, int(counts.max())
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if int(np.minimum(counts, mid).sum()) <= n else (low, mid - 1)
        given = np.minimum(counts, low)
        still = np.flatnonzero(counts > low)
        extra = n - int(given.sum())
        given[still[:extra]] += 1
        return given, int(still[extra])

    def origin(self, batches: int) -> tuple[int, int]:
        """Where batch ``batches`` of this rank's current epoch comes from: its split and the index of
        its first window in that split (so every sequence of a run is named by epoch, split and
        window, whatever the number of processes the splits are dealt to)."""
        given, due = self.seek(batches)
        return self.rank * self.workers + due, int(given[due]) * self.batch_size

    def loader(self) -> DataLoader:
        """A DataLoader over this dataset. Its workers persist across iterations: keep it, and
        each ``iter()`` starts where :meth:`set_position` (or :meth:`set_epoch`) last put it."""
        workers = self.num_workers
        return DataLoader(
            self,
            batch_size=None,
            num_workers=workers,
            persistent_workers=workers > 0,
            worker_init_fn=_share_batches_by_name,
        )

    def __iter__(self):
        info = get_worker_info()
        if (info.num_workers if info is not None else 0) != self.num_workers:
            raise RuntimeError(
                f"iterate with {self.num_workers} DataLoader workers (use .loader()), not {info and info.num_workers}"
            )
        worker_id = info.id if info is not None else 0
        given, due = self.seek()
        worker = (worker_id + due) % self.workers
        windows = self.window_segments(self.rank * self.workers + worker, int(given[worker]) * self.batch_size)
        return self._batched(windows)

    def _batched(self, windows: Iterator[list[dict[str, np.ndarray]]]) -> Iterator[dict[str, torch.Tensor]]:
        """Windows written straight into batches (one shared buffer each when in a worker, so the
        hand-over to the main process copies nothing and passes one file descriptor)."""
        shared = get_worker_info() is not None
        # The worker keeps its last few batches: the main process, done with one, is then not the
        # last to let go of its memory, which would make it pay for freeing the pages.
        handed_over = deque(maxlen=RELEASE_DELAY if shared else 0)
        batch, row = None, 0
        for segments in windows:
            if batch is None:
                batch, row = self._new_batch(segments[0], self.batch_size, shared), 0
            self._fill_row(batch, row, segments)
            row += 1
            if row == self.batch_size:
                handed_over.append(batch)
                yield batch
                batch = None
        if batch is not None:
            yield {key: value[:row] for key, value in batch.items()}

    def _new_batch(self, segment: dict[str, np.ndarray], rows: int, shared: bool) -> dict[str, torch.Tensor]:
        """Uninitialised (rows, seq_len, …) tensors for the fields of ``segment``: views of one buffer."""
        fields = {}
        for key, value in segment.items():
            dtype = self.teacher_dtype if key == "target_probs" else torch.from_numpy(value[:0]).dtype
            fields[key] = ((rows, self.seq_len, *value.shape[1:]), dtype)
        sizes = [math.prod(shape) * dtype.itemsize for shape, dtype in fields.values()]
        starts = np.cumsum([0] + [-(-size // 64) * 64 for size in sizes])  # each field 64-byte aligned
        buffer = torch.empty(0, dtype=torch.uint8)
        if shared:  # allocated in shared memory, as torch's default_collate does in workers
            buffer.set_(torch.UntypedStorage._new_shared(int(starts[-1])))
        else:
            buffer.resize_(int(starts[-1]))
        return {
            key: buffer[start : start + size].view(dtype).view(shape)
            for (key, (shape, dtype)), start, size in zip(fields.items(), starts, sizes)
        }

    def _fill_row(self, batch: dict[str, torch.Tensor], row: int, segments: list[dict[str, np.ndarray]]) -> None:
        """Write the segments of one window into batch row ``row``, padding the rest."""
        at = 0
        for segment in segments:
            n = len(segment["input_ids"])
            for key, value in segment.items():
                batch[key][row, at : at + n].copy_(torch.from_numpy(value))  # casts to float16 fast
            at += n
        for key, tensor in batch.items():
            tensor[row, at:].fill_(padding(self.stream)[key])


def _share_batches_by_name(worker_id: int) -> None:
    """In a worker: hand batches over as named shared memory, which the main process maps by name,
    not as file descriptors, each of which costs it an authenticated socket round trip."""
    torch.multiprocessing.set_sharing_strategy("file_system")


@dataclass
class Split:
    """What one split reads in an epoch: the windows of ``documents``' stream from symbol ``offset`` on."""

    documents: np.ndarray
    offset: int
    num_windows: int


class PackedStreamDataset(SplitBatches):
    """Batches of fixed-length windows of symbols (and the teacher's distributions) from logit stores.

    Yields dicts of tensors of the stores' stream: ``input_ids`` (B, T) int64, ``target_ids`` (B, T)
    int64 (``<pad>`` where there is none), ``loss_mask`` (B, T) bool, and with ``with_teacher``
    ``target_probs`` (B, T, the student's alphabet size: the stream's and the stores' reserved
    symbols) in ``teacher_dtype`` (zeros where masked); ``with_teacher=False`` reads only
    token ids. Stores of conversations add ``roles`` (B, T) uint8: the role of each target
    (0 template, 1 system, 2 user, 3 assistant; 0 where masked). ``max_symbols`` > 0 keeps only
    the documents, in store order, up to the first whose stream reaches that many symbols in total
    (the same subset for any number of processes). ``stream`` (default: the stores') is the
    stream the windows hold: the bytes stream from fused stores (:mod:`bytestream.bytes_stream`).
    """

    def __init__(
        self,
        stores,
        seq_len: int,
        batch_size: int = 1,
        *,
        with_teacher: bool = True,
        teacher_dtype: str = "float16",
        shuffle: bool = True,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 0,
        max_symbols: int = 0,
        stream: StreamKind | None = None,
    ):
        super().__init__(seq_len, batch_size, rank, world_size, num_workers, teacher_dtype)
        self.store = as_store(stores)
        self.stream = stream or self.store.stream
        if self.stream.stored is not self.store.stream:
            raise UserError(
                f"the stores hold the {self.store.stream.shown} stream; a {self.stream.shown} student reads "
                f"{self.stream.stored.shown}-stream stores"
            )
        self.reserved = reserved_symbols(self.store)
        self.alphabet_size = self.stream.alphabet_size + len(self.reserved)
        self.has_roles = bool(self.reserved)
        self.with_teacher, self.shuffle, self.seed = with_teacher, shuffle, int(seed)
        self.trie = self.store.trie  # built once, shipped to workers
        self.symbols = self.store.document_positions() + 1  # a stream has one symbol more than targets
        if max_symbols > 0:
            self.symbols = self.symbols[: int(np.searchsorted(np.cumsum(self.symbols), max_symbols)) + 1]
        self.deal_units = _deal_units(self.store.chunk_spans(), len(self.symbols), self.num_splits)
        self._plan: tuple[int, list[Split]] | None = None

    def order_settings(self) -> dict:
        sizes = np.array([len(unit) for unit in self.deal_units], dtype=np.int64)
        layout = hashlib.sha256(self.symbols.tobytes() + sizes.tobytes()).hexdigest()
        return {
            **super().order_settings(),
            "shuffle": self.shuffle,
            "seed": self.seed,
            "documents": layout,
        }

    def split(self, g: int) -> Split:
        """Split ``g`` in the current epoch."""
        if self._plan is None or self._plan[0] != self.epoch:
            self._plan = (self.epoch, self._deal_chunks() if self.shuffle else self._deal_windows())
        return self._plan[1][g]

    def split_documents(self, g: int) -> np.ndarray:
        """Document indices of split ``g`` in the current epoch, in reading order."""
        return self.split(g).documents

    def _deal_chunks(self) -> list[Split]:
        rng = np.random.default_rng(self.seed + self.epoch)
        loads = np.zeros(self.num_splits, dtype=np.int64)
        members: list[list[np.ndarray]] = [[] for _ in range(self.num_splits)]
        for p in rng.permutation(len(self.deal_units)):
            documents = rng.permutation(self.deal_units[p])
            g = int(np.argmin(loads))
            members[g].append(documents)
            loads[g] += int(self.symbols[documents].sum())
        splits = [np.concatenate(m) if m else np.zeros(0, np.int64) for m in members]
        return [Split(documents, 0, -(-int(load) // self.seq_len)) for documents, load in zip(splits, loads)]

    def _deal_windows(self) -> list[Split]:
        documents = np.arange(len(self.symbols))
        total = -(-int(self.symbols.sum()) // self.seq_len)
        bounds = [total * g // self.num_splits for g in range(self.num_splits + 1)]
        return [Split(documents, start * self.seq_len, end - start) for start, end in itertools.pairwise(bounds)]

    def num_windows(self, split: int) -> int:
        return self.split(split).num_windows

    def window_segments(self, split: int, start: int) -> Iterator[list[dict[str, np.ndarray]]]:
        plan = self.split(split)
        documents = plan.documents
        ends = np.cumsum(self.symbols[documents])
        skip = plan.offset + start * self.seq_len
        first = int(np.searchsorted(ends, skip, side="right"))
        streams = (self._stream(int(i)) for i in documents[first:])
        skip -= int(ends[first - 1]) if first else 0
        return islice(_pack(_drop_first(streams, skip), self.seq_len), max(0, plan.num_windows - start))

    def _stream(self, i: int) -> dict[str, np.ndarray]:
        """Inputs, targets, mask (and teacher rows) of document ``i``'s stream."""
        if self.with_teacher:
            doc = self.store.document(i)
            layout = doc.layout
            probs = np.zeros((layout.num_positions + 1, layout.alphabet_size), dtype=np.float32)
            densify(layout, doc.values, probs[:-1])
            roles = getattr(doc, "roles", None)
        else:
            layout = self.store.stream.layout(self.trie, self.store.document_tokens(i))
            roles = self.store.document_roles(i) if self.has_roles else None
        # the store's stream as the student reads it (a bytes student: each byte's flags summed)
        symbols, probs = as_read(self.stream, layout.symbols.astype(np.int64), probs if self.with_teacher else None)
        assert symbols[-1] == self.stream.eos
        stream = {
            "input_ids": symbols,
            "target_ids": np.append(symbols[1:], self.stream.pad),
            "loss_mask": np.arange(len(symbols)) < len(symbols) - 1,
        }
        if self.with_teacher:
            stream["target_probs"] = probs
        if self.has_roles:
            stream["roles"] = document_roles(roles, len(symbols), i)
        return stream


def reserved_symbols(store) -> list[str]:
    """The texts of the reserved symbols a store's stream holds after its alphabet (the teacher's
    chat specials, in the manifest's order; none for a plain store)."""
    return [entry["text"] for entry in store.reserved_symbols]


def document_roles(roles, num_symbols: int, i: int) -> np.ndarray:
    """The roles of a document's targets as a window's column: one per input symbol, 0 at the
    ``<eos>`` input, which predicts nothing."""
    if roles is None or len(roles) != num_symbols - 1:
        raise UserError(f"store document {i} holds no role per target: a chat store needs its roles (corrupt?)")
    return np.append(np.asarray(roles, dtype=np.uint8), np.uint8(0))


def _deal_units(spans: list[tuple[int, int]], num_documents: int, num_splits: int) -> list[np.ndarray]:
    """Document indices of each chunk (below ``num_documents``); cut into equal parts if there are
    fewer chunks than splits."""
    chunks = [np.arange(first, min(first + count, num_documents)) for first, count in spans if first < num_documents]
    parts = -(-num_splits // len(chunks)) if 0 < len(chunks) < num_splits else 1
    return [part for chunk in chunks for part in np.array_split(chunk, parts) if len(part)]


def _drop_first(streams: Iterator[dict[str, np.ndarray]], offset: int) -> Iterator[dict[str, np.ndarray]]:
    for stream in streams:
        if offset:
            stream = {key: value[offset:] for key, value in stream.items()}
            offset = 0
        yield stream


def _pack(streams: Iterator[dict[str, np.ndarray]], seq_len: int) -> Iterator[list[dict[str, np.ndarray]]]:
    """Cut the concatenated streams into windows of ``seq_len`` rows (the last may be shorter), each
    given as the row ranges of the streams it takes."""
    window: list[dict[str, np.ndarray]] = []
    rows = 0
    for stream in streams:
        while len(stream["input_ids"]):
            n = min(seq_len - rows, len(stream["input_ids"]))
            window.append({key: value[:n] for key, value in stream.items()})
            stream = {key: value[n:] for key, value in stream.items()}
            rows += n
            if rows == seq_len:
                yield window
                window, rows = [], 0
    if window:
        yield window
