"""The store's training dataset: whole chunks dealt to rank × worker splits, every position once,
real DataLoader workers, resume by seeking, a world-size-independent evaluation subset."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bytestream.alphabet import ALPHABET_SIZE, BOS, EOS, PAD
from logit_store import LogitStore
from logit_store.shard import ShardReader
from students.training.store_windows import PackedStreamDataset
from tests.stores import random_texts, write_random_store


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory, llama3_vocab, llama3_converter, llama3_encoder):
    texts = random_texts(40, seed=5)
    return write_random_store(
        tmp_path_factory.mktemp("data") / "s", llama3_vocab, llama3_converter, llama3_encoder, texts
    )


@pytest.fixture
def store(store_dir, llama3_converter):
    return LogitStore(store_dir, trie=llama3_converter.trie)


def _streams(store, documents) -> np.ndarray:
    return np.concatenate([store.document(int(i)).layout.symbols for i in documents]) if len(documents) else np.zeros(0)


@pytest.mark.parametrize("world,workers", [(1, 1), (2, 2), (3, 2)])
def test_whole_chunks_every_position_once_one_read_per_chunk(store, monkeypatch, world, workers):
    reads = []
    original = ShardReader.read_chunk
    monkeypatch.setattr(
        ShardReader, "read_chunk", lambda self, c, *rest: reads.append((self.name, c)) or original(self, c, *rest)
    )
    spans = store.chunk_spans()
    assert len(spans) >= 6 and sum(n for _, n in spans) == len(store)
    chunk_of = {i: k for k, (first, n) in enumerate(spans) for i in range(first, first + n)}
    seq_len, assigned, masked, sizes, dataset_reads = 24, [], 0, [], []
    for rank in range(world):
        dataset = PackedStreamDataset(
            store, seq_len, 3, rank=rank, world_size=world, num_workers=workers, seed=7, teacher_dtype="float32"
        )
        dataset.set_epoch(1)
        for worker in range(workers):
            split = dataset.split_documents(rank * workers + worker)
            assigned.extend(split.tolist())
            sizes.append(int(dataset.symbols[split].sum()))
            before = len(reads)
            batches = list(dataset.windows(rank * workers + worker, 0))
            dataset_reads.extend(reads[before:])
            inputs = np.concatenate([w["input_ids"] for w in batches]) if batches else np.zeros(0)
            stream = _streams(store, split)
            np.testing.assert_array_equal(inputs[: len(stream)], stream)
            assert np.all(inputs[len(stream) :] == PAD) and len(inputs) - len(stream) < seq_len
            assert len(batches) == dataset.num_windows(rank * workers + worker)
            for w in batches:
                mask = w["loss_mask"]
                masked += int(mask.sum())
                assert not mask[w["input_ids"] == EOS].any() and not mask[w["input_ids"] == PAD].any()
                assert np.all(mask[w["input_ids"] == BOS]) and np.all(w["target_ids"][~mask] == PAD)
                probs = w["target_probs"]
                assert np.all(probs[~mask] == 0)
                np.testing.assert_allclose(probs[mask].sum(1), 1.0, atol=1e-5)
                assert np.all(probs[mask, w["target_ids"][mask]] > 0)
        chunks_of_splits = [{chunk_of[int(i)] for i in dataset.split_documents(g)} for g in range(world * workers)]
        assert all(not (a & b) for k, a in enumerate(chunks_of_splits) for b in chunks_of_splits[k + 1 :])
    assert sorted(assigned) == list(range(len(store)))  # disjoint and complete
    assert masked == store.stats()["positions"]
    assert len(set(dataset_reads)) == len(dataset_reads) == len(spans)  # each chunk decompressed once
    largest_chunk = max(int(dataset.symbols[first : first + n].sum()) for first, n in spans)
    assert max(sizes) - min(sizes) <= largest_chunk


def test_fewer_chunks_than_splits_still_covers_everything(store):
    splits = 4 * len(store.chunk_spans())
    dataset = PackedStreamDataset(store, 16, world_size=splits, rank=0)
    documents = np.concatenate([dataset.split_documents(g) for g in range(splits)])
    assert sorted(documents.tolist()) == list(range(len(store)))
    assert sum(len(dataset.split_documents(g)) > 0 for g in range(splits)) > len(store.chunk_spans())


def _batches(dataset) -> list[dict[str, np.ndarray]]:
    return [{k: v.numpy() for k, v in batch.items()} for batch in dataset.loader()]


def test_real_workers_and_seeking_match_an_uninterrupted_epoch(store):
    dataset = PackedStreamDataset(store, 64, 3, num_workers=2, seed=3)
    # an epoch with uneven workers: the round-robin skips the one that ran out
    epoch = next(e for e in range(50) if dataset.set_epoch(e) or len(set(dataset.batch_counts())) == 2)
    counts = dataset.batch_counts()
    full = _batches(dataset)
    assert len(full) == counts.sum() == dataset.num_batches()
    # the loader's order is round by round over the workers, each worker its split's batches
    by_split = [list(dataset.windows(w, 0)) for w in range(2)]
    expected = [by_split[w][r * 3 : r * 3 + 3] for r in range(int(counts.max())) for w in range(2) if r < counts[w]]
    for got, windows in zip(full, expected):
        np.testing.assert_array_equal(got["input_ids"], np.stack([w["input_ids"] for w in windows]))
    origins = [(w, r * 3) for r in range(int(counts.max())) for w in range(2) if r < counts[w]]
    assert [dataset.origin(n) for n in range(len(full))] == origins  # each batch's split and first window
    for start in (1, 4, int(counts.min()) * 2 + 1, len(full) - 1, len(full)):
        dataset.set_position(epoch, start)
        resumed = _batches(dataset)
        assert len(resumed) == len(full) - start, start
        for a, b in zip(resumed, full[start:]):
            for key in a:
                np.testing.assert_array_equal(a[key], b[key])


def test_persistent_workers_follow_epochs_and_abandoned_iterations(store):
    """One loader per dataset, its workers kept: each iteration starts where set_position says,
    also after an iteration left half-way (as evaluation and resuming do)."""
    kept = PackedStreamDataset(store, 32, 2, num_workers=2, seed=4)
    loader = kept.loader()
    assert loader.persistent_workers
    for epoch, batches in [(0, 0), (1, 0), (1, 3), (0, 2)]:
        kept.set_position(epoch, batches)
        next(iter(loader))  # then abandoned
        kept.set_position(epoch, batches)
        fresh = PackedStreamDataset(store, 32, 2, num_workers=2, seed=4)
        fresh.set_position(epoch, batches)
        got = [{k: v.numpy() for k, v in batch.items()} for batch in loader]
        expected = _batches(fresh)
        assert len(got) == len(expected) == fresh.num_batches() - batches > 0
        for a, b in zip(got, expected):
            assert a.keys() == b.keys() and all(np.array_equal(a[key], b[key]) for key in a)


def test_evaluation_windows_do_not_depend_on_world_size(store):
    limit = store.stats()["positions"] // 3
    one = PackedStreamDataset(store, 16, 2, shuffle=False, max_symbols=limit, teacher_dtype="float32")
    kept = len(one.symbols)
    assert one.symbols[: kept - 1].sum() < limit <= one.symbols.sum() and kept < len(store)
    expected = np.concatenate([batch["input_ids"].numpy().reshape(-1) for batch in one])
    np.testing.assert_array_equal(expected[: one.symbols.sum()], _streams(store, range(kept)))
    for world, workers in [(2, 1), (3, 2)]:
        parts = []
        for rank in range(world):
            dataset = PackedStreamDataset(
                store, 16, 2, shuffle=False, max_symbols=limit, rank=rank, world_size=world, num_workers=workers
            )
            for worker in range(workers):
                parts.extend(w["input_ids"] for w in dataset.windows(rank * workers + worker, 0))
        np.testing.assert_array_equal(np.concatenate(parts), expected)  # the same windows, dealt in ranges


def test_epochs_reshuffle_and_ce_only_reads_no_values(store_dir, store, llama3_converter):
    dataset = PackedStreamDataset(store, 32, shuffle=True, seed=0)
    orders = set()
    for epoch in range(4):
        dataset.set_epoch(epoch)
        orders.add(tuple(dataset.split_documents(0)))
    assert len(orders) > 1
    again = PackedStreamDataset(store, 32, shuffle=True, seed=0)
    again.set_epoch(3)
    assert tuple(dataset.split_documents(0)) == tuple(again.split_documents(0))

    ce_only = PackedStreamDataset(store, 32, 4, with_teacher=False, shuffle=False)

    def refuse(*args, **kwargs):
        raise AssertionError("a CE-only dataset decoded teacher values")

    ce_only.store.encoding.decode = refuse  # CE-only must not decode values (nor unpack them)
    ce_only.store.encoding.unpack_values = refuse
    other = LogitStore(store_dir, trie=llama3_converter.trie)
    with_teacher = PackedStreamDataset(other, 32, 4, shuffle=False, teacher_dtype="float32")
    a, b = list(ce_only), list(with_teacher)
    assert len(a) == len(b) and "target_probs" not in a[0] and b[0]["target_probs"].dtype == torch.float32
    assert b[0]["target_probs"].shape == (4, 32, ALPHABET_SIZE)
    for x, y in zip(a, b):
        for key in ("input_ids", "target_ids", "loss_mask"):
            assert torch.equal(x[key], y[key])
    # training's default: the same rows, moved as float16
    compact = list(PackedStreamDataset(other, 32, 4, shuffle=False))
    assert all(torch.equal(x["target_probs"], y["target_probs"].half()) for x, y in zip(compact, b))
