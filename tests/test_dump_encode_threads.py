"""Encoder threads change when a store's documents are encoded, never the store's bytes: shards
written with several threads are byte-identical to one thread's, for the store writer over the real
Llama-3 vocabulary and for a whole dump, each with many small chunks and shards and with one chunk."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bytedistill.cli import main as cli_main
from bytestream.stream_kind import StreamKind
from distill.conversion.converter import DocumentDistributions
from logit_store import LogitStore, StoreIdentity, StoreWriter
from logit_store.file_names import SHARD
from tests.gguf_teachers import save_small_teacher, write_tiny_gguf
from tests.stores import random_texts
from tests.teachers import dump_args

# (writer settings, documents): many chunks of a few documents over several shards; one chunk
SCALES = {
    "small chunks": ({"chunk_bytes": 20_000, "docs_per_shard": 7}, 40),
    "one chunk": ({}, 12),
}


def peaked_distributions(layout, rng: np.random.Generator) -> DocumentDistributions:
    """Values peaked as a teacher's are, a distribution over each position's support, and some dropped mass."""
    weights = np.exp(4.0 * rng.standard_normal(layout.num_values))
    sums = np.add.reduceat(weights, layout.offsets[:-1])
    values = weights / np.repeat(sums, np.diff(layout.offsets))
    dropped = rng.uniform(0, 1e-3, int(layout.position_row.max()) + 1 if layout.num_positions else 1)
    return DocumentDistributions(layout, values, dropped)


def shard_bytes(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(SHARD.paths(directory, 0))}


def write_store(directory: Path, vocab, trie, encoder, texts, threads: int, **writer) -> tuple[dict, list[float]]:
    """The shards' bytes of a ``pow8-ans`` store of ``texts`` (fused stream) and each document's stored
    log-likelihood, written with ``threads`` encoder threads."""
    identity = StoreIdentity(vocab, encoding="pow8-ans", teacher="peaked", stream=StreamKind.FUSED)
    rng = np.random.default_rng(0)
    pending = []
    with StoreWriter(directory, identity, trie=trie, encode_threads=threads, **writer) as out:
        for k, text in enumerate(texts):
            ids = encoder.encode(text)
            dist = peaked_distributions(StreamKind.FUSED.layout(trie, ids), rng)
            pending.append(out.submit_distributions(dist, key=f"doc-{k}", text_bytes=len(text), token_ids=ids))
    return shard_bytes(directory), [p.stored_log_likelihood() for p in pending]


@pytest.mark.parametrize("scale", list(SCALES))
def test_encoder_threads_write_the_shards_one_thread_writes(
    scale, llama3_vocab, llama3_converter, llama3_encoder, tmp_path
):
    settings, count = SCALES[scale]
    texts = random_texts(count, seed=7, min_words=20, max_words=200)
    args = llama3_vocab, llama3_converter.trie, llama3_encoder, texts
    one, one_nll = write_store(tmp_path / "one", *args, threads=1, **settings)
    three, three_nll = write_store(tmp_path / "three", *args, threads=3, **settings)
    assert len(one) > (1 if scale == "small chunks" else 0)
    assert three == one
    assert three_nll == one_nll
    store = LogitStore(tmp_path / "three")
    assert len(store) == count and store.document(count - 1).key == f"doc-{count - 1}"


@pytest.fixture(scope="module")
def small_teacher(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("small-teacher")
    return save_small_teacher(root / "teacher", write_tiny_gguf(root / "tiny.gguf"))


@pytest.mark.parametrize("scale", list(SCALES))
def test_a_dump_with_encoder_threads_writes_the_shards_of_one_thread(scale, small_teacher, tmp_path, capsys):
    settings, count = SCALES[scale]
    corpus = tmp_path / "corpus.jsonl"
    texts = random_texts(count, seed=3, min_words=20, max_words=120)
    corpus.write_text("\n".join(json.dumps({"text": t.decode()}) for t in texts))
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in settings.items()]
    shards = {}
    for threads in (1, 4):
        output = tmp_path / f"store-{threads}"
        assert cli_main(dump_args(small_teacher, corpus, output, *flags, f"--encode-threads={threads}")) == 0
        shards[threads] = shard_bytes(output)
    assert shards[1] and shards[4] == shards[1]
    capsys.readouterr()


def test_encoder_threads_default_to_four_on_the_device_path_and_one_on_the_host_path(tmp_path):
    from dataclasses import replace
    from types import SimpleNamespace

    from distill.corpus.spec import CorpusSpec
    from distill.dump.config import DumpConfig
    from distill.dump.settle import settle
    from distill.teacher.source import TeacherSource

    config = DumpConfig(TeacherSource("t"), CorpusSpec(str(tmp_path / "c.jsonl")), output=str(tmp_path / "o"))
    cpu, cuda = SimpleNamespace(type="cpu"), SimpleNamespace(type="cuda")
    assert settle(config, cpu).encode_threads == 1  # the Numba conversion: the host's work is converting
    assert settle(config, cuda).encode_threads == 4
    assert settle(replace(config, batching=replace(config.batching, conversion="torch")), cpu).encode_threads == 4
    assert settle(replace(config, batching=replace(config.batching, conversion="numba")), cuda).encode_threads == 1
    assert settle(replace(config, store=replace(config.store, encode_threads=2)), cuda).encode_threads == 2


def test_settle_checks_the_store_it_resumes_and_reads_its_manifest_once_for_every_step(tmp_path):
    """The plan carries the resumed store's manifest, read once, and the stream and writer count come
    from it; a file with a store's name that no writer wrote is refused by settle itself, so a library
    caller (``dump_with_teacher``) is refused as the command line is, before the teacher runs."""
    import shutil
    from types import SimpleNamespace

    from common.errors import UserError
    from distill.corpus.spec import CorpusSpec
    from distill.dump.config import DumpConfig
    from distill.dump.settle import settle
    from distill.teacher.source import TeacherSource
    from logit_store.manifest import read_manifest

    store = tmp_path / "store"
    shutil.copytree(Path(__file__).parent / "data" / "store-v1", store)
    manifest = json.loads((store / "manifest.json").read_text())
    manifest["settings"] = {"writers": 5}
    (store / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=2))
    config = DumpConfig(TeacherSource("t"), CorpusSpec(str(tmp_path / "c.jsonl")), output=str(store))
    plan = settle(config, SimpleNamespace(type="cpu"), 0, 2)
    assert plan.manifest == read_manifest(store) and plan.manifest["settings"] == {"writers": 5}
    assert (plan.stream, plan.writers, plan.mine) == (StreamKind.EOT, 5, (0, 2, 4))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "vocab.bin").write_bytes(b"mine")
    with pytest.raises(UserError, match="vocab.bin is not from a store"):
        settle(DumpConfig(TeacherSource("t"), config.corpus, output=str(foreign)), SimpleNamespace(type="cpu"))
