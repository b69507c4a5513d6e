"""Store-level integrity: edited manifests, missing/renamed/foreign shards, finished writers,
and the format-1 fixture still read (tests/data/store-v1, written by the format-1 writer)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bytedistill.cli import main as cli_main
from common.errors import UserError
from logit_store import LogitStore, StoreIdentity, StoreWriter
from logit_store.verify import verify_store
from tests.store_data import tiny_documents, tiny_vocab

V1_STORE = Path(__file__).parent / "data" / "store-v1"


@pytest.fixture(scope="module")
def tiny():
    vocab = tiny_vocab()
    return vocab, tiny_documents(vocab)


def write(directory, tiny, encoding="pow8", writer_id=0, docs=None, **kwargs):
    vocab, documents = tiny
    kwargs.setdefault("docs_per_shard", 1)
    identity = StoreIdentity(vocab, encoding=encoding, teacher="tiny")
    with StoreWriter(directory, identity, chunk_bytes=1, writer_id=writer_id, **kwargs) as writer:
        for k, (ids, dist, n) in enumerate(documents if docs is None else docs):
            writer.add_distributions(dist, key=f"doc-{k}", text_bytes=n, token_ids=ids)
    return Path(directory)


def copy(source, target) -> Path:
    shutil.copytree(source, target)
    return Path(target)


def edit_manifest(directory, change) -> None:
    path = Path(directory) / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def fails_everywhere(directory, capsys, message: str) -> None:
    """The reader, ``verify`` and ``inspect`` all refuse the store with one line naming the problem."""
    with pytest.raises(UserError, match=message):
        verify_store(LogitStore(directory))
    for command in ("verify", "inspect"):
        assert cli_main([command, str(directory)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"bytedistill {command}: error:") and message in err[0], err


@pytest.fixture(scope="module")
def store(tmp_path_factory, tiny):
    return write(tmp_path_factory.mktemp("integrity") / "s", tiny)


def test_intact_store_reads_and_knows_its_finished_writer(store, tiny):
    opened = LogitStore(store)
    assert len(opened) == len(tiny[1]) == len(opened.shards)
    assert opened.unfinished_writers == [] and verify_store(opened)["documents"] == len(tiny[1])
    record = json.loads((store / "writer-00000.json").read_text())
    assert record.pop("kl_bits") > 0 and record == {"writer_id": 0, "shards": 4, "documents": 4}


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m.update(encoding={"name": "log8", "params": {"step": 0.05}}),
        lambda m: m["encoding"]["params"].update(gamma=0.5),
        lambda m: m["settings"].update(temperature=2.0),
    ],
    ids=["pow8-to-log8", "gamma", "settings"],
)
def test_edited_manifest_is_caught(tmp_path, store, capsys, change):
    edited = copy(store, tmp_path / "edited")
    edit_manifest(edited, change)
    fails_everywhere(edited, capsys, "was written for a different manifest")


def test_missing_middle_and_last_shard(tmp_path, store, capsys):
    middle = copy(store, tmp_path / "middle")
    (middle / "shard-00000-00001.bds").unlink()
    fails_everywhere(middle, capsys, "shard-00000-00001.bds of writer 0 is missing")
    last = copy(store, tmp_path / "last")
    (last / "shard-00000-00003.bds").unlink()
    fails_everywhere(last, capsys, "writer 0 finished with 4 shards and 4 documents, the store holds 3 shards")


def test_renamed_and_foreign_shards(tmp_path, store, tiny, capsys):
    swapped = copy(store, tmp_path / "swapped")
    a, b = swapped / "shard-00000-00001.bds", swapped / "shard-00000-00002.bds"
    a.rename(swapped / "x")
    b.rename(a)
    (swapped / "x").rename(b)
    fails_everywhere(swapped, capsys, "shard-00000-00001.bds was written as shard-00000-00002.bds")
    # the same shard position from a run over other documents: its first document differs
    other = write(tmp_path / "other", tiny, docs=[tiny[1][0], tiny[1][1], tiny[1][1], tiny[1][2]], docs_per_shard=2)
    mixed = copy(write(tmp_path / "mine", tiny, docs_per_shard=3), tmp_path / "mixed")
    shutil.copy(other / "shard-00000-00001.bds", mixed / "shard-00000-00001.bds")
    (mixed / "writer-00000.json").unlink()
    fails_everywhere(mixed, capsys, "starts at the writer's document 2, but its earlier shards hold 3")


def test_manifest_without_vocab_hash(tmp_path, store, capsys):
    broken = copy(store, tmp_path / "broken")
    edit_manifest(broken, lambda m: m.pop("vocab_hash"))
    fails_everywhere(broken, capsys, "vocab_hash missing")


def test_unfinished_writer_is_reported_and_resumes(tmp_path, tiny, capsys):
    vocab, documents = tiny
    directory = tmp_path / "s"
    writer = StoreWriter(directory, StoreIdentity(vocab, teacher="tiny"), docs_per_shard=1, chunk_bytes=1)
    for ids, dist, n in documents[:2]:
        writer.add_distributions(dist, text_bytes=n, token_ids=ids)
    writer.abandon()
    store = LogitStore(directory)
    assert len(store) == 2 and store.unfinished_writers == [0] and store.stats()["unfinished_writers"] == [0]
    assert cli_main(["verify", str(directory)]) == 0
    assert "unfinished writers: [0]" in capsys.readouterr().out
    assert cli_main(["inspect", str(directory)]) == 0
    assert "writers [0] have no completion record" in capsys.readouterr().out
    assert not (directory / "writer-00000.json").exists()
    with StoreWriter(directory, StoreIdentity(vocab, teacher="tiny"), docs_per_shard=1, chunk_bytes=1) as writer:
        assert writer.num_existing_documents == 2
        for ids, dist, n in documents[2:]:
            writer.add_distributions(dist, text_bytes=n, token_ids=ids)
    assert LogitStore(directory).unfinished_writers == []


def test_format_1_store_stays_readable(tmp_path, tiny):
    """The fixture was written by the format-1 writer from the same documents: the format-2
    reader gives the same tokens, keys and values; a format-2 writer will not append to it."""
    old = LogitStore(V1_STORE)
    assert old.format_version == 1 and len(old) == len(tiny[1]) and old.unfinished_writers == []
    assert verify_store(old)["documents"] == len(tiny[1])
    new = LogitStore(write(tmp_path / "v2", tiny))
    for k, (ids, dist, n) in enumerate(tiny[1]):
        a, b = old.document(k), new.document(k)
        np.testing.assert_array_equal(a.token_ids, ids)
        np.testing.assert_array_equal(a.values, b.values)
        np.testing.assert_array_equal(a.dropped_mass, dist.dropped_mass.astype(np.float32))
        assert a.key == f"doc-{k}" and a.text_bytes == n
    with pytest.raises(UserError, match="format_version"):
        StoreWriter(copy(V1_STORE, tmp_path / "append"), StoreIdentity(tiny[0], teacher="tiny"))


def test_vocabulary_file_bounds(tiny):
    """vocab.bin: a token longer than the cap on token length and a frame that declares more than
    the cap on the body are refused before use."""
    import dataclasses

    import zstandard

    from logit_store.vocab_file import MAX_TOKEN_BYTES, MAX_VOCAB_BODY, vocab_from_bytes, vocab_to_bytes

    vocab = tiny[0]
    assert vocab_from_bytes(vocab_to_bytes(vocab), "v").hash == vocab.hash
    long = dataclasses.replace(vocab, token_bytes=vocab.token_bytes[:-1] + (b"x" * (MAX_TOKEN_BYTES + 1), b""))
    with pytest.raises(UserError, match=f"a token of {MAX_TOKEN_BYTES + 1} bytes"):
        vocab_from_bytes(vocab_to_bytes(long), "v")
    bomb = zstandard.ZstdCompressor().compress(bytes(MAX_VOCAB_BODY + 1))  # a few KB declaring 64 MiB + 1
    with pytest.raises(UserError, match=f"declares {MAX_VOCAB_BODY + 1:,} bytes"):
        vocab_from_bytes(b"BDVOCAB\0" + bomb + bytes(16), "v")
