"""Each worker reads its share of the corpus (distill/corpus/shares.py): the bytes a worker reads
with 1, 2 and 3 workers (counted by the kernel), every document exactly once, and a document's
key and held-out side independent of how the corpus was split."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest

from distill.corpus.formats import DatasetRows
from distill.corpus.shares import share_fingerprints, writer_documents
from distill.corpus.spec import CorpusSpec, corpus_fingerprint, select_documents
from distill.dump.sharding import writers_of

WRITERS = 6
PIECE_BYTES = 64 << 10  # so that a 1 MB .jsonl is 16 pieces


def _text(i: int) -> str:
    """Hex digests: text that parquet cannot compress much."""
    return f"record {i}: " + " ".join(hashlib.sha256(f"{i}:{k}".encode()).hexdigest() for k in range(2 + i % 30))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path_factory.mktemp("corpus")
    lines = [json.dumps({"text": _text(i)}) for i in range(1800)]
    lines[5] = json.dumps({"text": ""})  # empty: skipped and counted
    lines[9] = "   "  # a blank line: no document
    (folder / "big.jsonl").write_text("\n".join(lines) + "\n")
    table = pa.table({"text": [_text(5000 + i) for i in range(600)]})
    pq.write_table(table, folder / "rows.parquet", row_group_size=50)
    for i in range(8):
        (folder / f"page{i}.txt").write_text(_text(9000 + i) * 4)
    return folder


def _read_bytes() -> int:
    """Bytes this process has read through system calls so far."""
    return int(dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())["rchar"])


def _share(spec: CorpusSpec, worker: int, workers: int) -> tuple[list[tuple[str, bytes]], int]:
    before = _read_bytes()
    mine = writers_of(worker, workers, WRITERS)
    docs = [(key, data) for key, data, _ in writer_documents(spec, WRITERS, mine, jsonl_piece_bytes=PIECE_BYTES)]
    return docs, _read_bytes() - before


def test_each_worker_reads_its_share_and_every_document_once(corpus):
    spec = CorpusSpec(str(corpus))
    _share(spec, 0, 1)  # imports and caches warm
    total = sum(p.stat().st_size for p in corpus.iterdir())
    everything = Counter(data for _, data in select_documents(spec))
    for workers in (1, 2, 3):
        shares = [_share(spec, w, workers) for w in range(workers)]
        read = [b for _, b in shares]
        docs = [d for share, _ in shares for d in share]
        assert Counter(data for _, data in docs) == everything  # the corpus, exactly once
        assert len({key for key, _ in docs}) == len(docs)
        assert max(read) < 1.25 * total / workers + 40_000, (workers, read, total)  # about 1/N each
        assert sum(read) < 1.15 * total + workers * 40_000, (workers, read, total)
    assert min(read) > 0.6 * total / 3


def _fingerprints(spec: CorpusSpec, worker: int, workers: int) -> tuple[dict[int, dict[str, str]], int]:
    before = _read_bytes()
    prints = share_fingerprints(spec, WRITERS, writers_of(worker, workers, WRITERS), jsonl_piece_bytes=PIECE_BYTES)
    return prints, _read_bytes() - before


def test_each_worker_fingerprints_only_its_share(corpus):
    """What a resume checks is read piece by piece by the writers dealt them: about 1/N each."""
    spec = CorpusSpec(str(corpus))
    whole, _ = _fingerprints(spec, 0, 1)
    total = sum(p.stat().st_size for p in corpus.iterdir())
    labels = [label for prints in whole.values() for label in prints]
    jsonl_pieces = -(-(corpus / "big.jsonl").stat().st_size // PIECE_BYTES)
    assert len(labels) == len(set(labels)) == jsonl_pieces + 12 + 8  # and the parquet row groups, the .txt files
    for workers in (2, 3):
        shares = [_fingerprints(spec, w, workers) for w in range(workers)]
        assert {w: p for prints, _ in shares for w, p in prints.items()} == whole  # the same, however split
        read = [b for _, b in shares]
        assert max(read) < 1.25 * total / workers + 40_000, (workers, read, total)


def test_a_same_size_edit_changes_the_digest_of_its_piece_alone(corpus, tmp_path):
    """The manifest's fingerprint reads only the listing; the piece digests see every byte."""
    import shutil

    edited = tmp_path / "corpus"
    shutil.copytree(corpus, edited)
    spec = CorpusSpec(str(edited))
    before = share_fingerprints(spec, WRITERS, list(range(WRITERS)), jsonl_piece_bytes=PIECE_BYTES)
    listing = corpus_fingerprint(spec)
    for name, at in (("big.jsonl", 300_000), ("rows.parquet", 40_000), ("page3.txt", 100)):
        data = bytearray((edited / name).read_bytes())
        data[at] ^= 1
        (edited / name).write_bytes(bytes(data))
        after = share_fingerprints(spec, WRITERS, list(range(WRITERS)), jsonl_piece_bytes=PIECE_BYTES)
        changed = [label for w in before for label in before[w] if before[w][label] != after[w][label]]
        assert len(changed) == 1 and changed[0].startswith(name), (name, changed)
        if name == "big.jsonl":
            start, stop = map(int, changed[0].split("@")[1].split("-"))
            assert start <= at < stop
        before = after
    assert corpus_fingerprint(spec) == listing


def test_identity_does_not_depend_on_the_split(corpus):
    """Keys name where a document lies; the held-out side follows its content."""
    whole = CorpusSpec(str(corpus))
    keys = {key: data for key, data, _ in writer_documents(whole, 1, [0], jsonl_piece_bytes=1 << 30)}
    for piece_bytes in (PIECE_BYTES, 1000):
        split = {k: d for w in range(WRITERS) for k, d, _ in writer_documents(whole, WRITERS, [w], None, piece_bytes)}
        assert split == keys
    sides = {}
    for subset in ("train", "heldout"):
        spec = CorpusSpec(str(corpus), subset=subset, heldout_fraction=0.3)
        one = {k for k, _, _ in writer_documents(spec, 1, [0], jsonl_piece_bytes=1 << 30)}
        three = {k for w in range(3) for k, _ in _share(spec, w, 3)[0]}
        assert one == three
        sides[subset] = one
    assert sides["train"].isdisjoint(sides["heldout"]) and sides["train"] | sides["heldout"] == set(keys)
    assert 0.15 < len(sides["heldout"]) / len(keys) < 0.45


def test_limits_count_the_corpus_in_order(corpus):
    """--max-docs selects the first documents of the corpus, however many workers share them."""
    spec = CorpusSpec(str(corpus), max_docs=50)
    first = [key for key, _, _ in writer_documents(spec, 1, [0], jsonl_piece_bytes=PIECE_BYTES)]
    shared = {k for w in range(3) for k, _ in _share(spec, w, 3)[0]}
    assert len(first) == 50 and shared == set(first)


def test_streamed_and_saved_datasets_are_dealt_by_shard_and_rows(tmp_path):
    import datasets

    files = []
    for s in range(4):
        files.append(tmp_path / f"part{s}.jsonl")
        files[-1].write_text("\n".join(json.dumps({"text": _text(100 * s + i)}) for i in range(5)))
    spec = CorpusSpec("parts")
    streamed = datasets.load_dataset("json", data_files=[str(f) for f in files], split="train", streaming=True)
    pieces = DatasetRows(streamed, "parts", spec.source, spec.split, spec.text_field).pieces()
    assert len(pieces) == 4
    docs = {k: d for piece in pieces for k, d in piece.documents()}
    assert docs["parts[train][2:3]"] == _text(203).encode()
    assert len(docs) == 20
    rows = datasets.Dataset.from_dict({"text": [_text(i) for i in range(30)]})
    saved = {
        k: d
        for piece in DatasetRows(rows, "rows", spec.source, spec.split, spec.text_field).pieces()
        for k, d in piece.documents()
    }
    assert saved == {f"rows[train][{i}]": _text(i).encode() for i in range(30)}


@pytest.mark.parametrize(("name", "at"), [("page3.txt", 100), ("big.jsonl", 300_000), ("rows.parquet", 40_000)])
def test_a_piece_edited_after_it_was_fingerprinted_is_refused_as_it_is_read(corpus, tmp_path, name, at):
    """A dump fingerprints its pieces when it starts and reads them later: a byte changed in between
    stops the reading at that piece, before any of its documents is given out (the documents of
    the pieces before it are read as they were)."""
    import shutil

    from common.errors import UserError

    edited = tmp_path / "corpus"
    shutil.copytree(corpus, edited)
    spec = CorpusSpec(str(edited))
    prints = share_fingerprints(spec, 1, [0], jsonl_piece_bytes=PIECE_BYTES)[0]
    whole = [key for key, _, _ in writer_documents(spec, 1, [0], jsonl_piece_bytes=PIECE_BYTES, fingerprints=prints)]
    data = bytearray((edited / name).read_bytes())
    data[at] ^= 1
    (edited / name).write_bytes(bytes(data))
    given: list[str] = []
    with pytest.raises(UserError, match=rf"the corpus file .*{name} changed while the dump ran \({name}"):
        for key, _, _ in writer_documents(spec, 1, [0], jsonl_piece_bytes=PIECE_BYTES, fingerprints=prints):
            given.append(key)
    assert given == whole[: len(given)]
    changed = [
        label for label, digest in share_fingerprints(spec, 1, [0], PIECE_BYTES)[0].items() if digest != prints[label]
    ]
    assert not any(key.startswith(name) and _in_piece(key, changed[0]) for key in given)


def _in_piece(key: str, label: str) -> bool:
    """Whether a document's key lies in the piece ``label`` (a .jsonl piece: by the line's byte offset)."""
    if "@" not in label:
        return key.split("#")[0].split(":")[0] == label.split("#")[0]
    start, stop = map(int, label.split("@")[1].split("-"))
    return start <= int(key.split("@")[1]) < stop


def test_a_compressed_file_edited_after_it_was_fingerprinted_is_refused_once_read(tmp_path):
    import zstandard

    from common.errors import UserError

    lines = "".join(json.dumps({"text": _text(i)}) + "\n" for i in range(40)).encode()
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    spec = CorpusSpec(str(tmp_path / "c"))
    prints = share_fingerprints(spec, 1, [0])[0]
    assert len(list(writer_documents(spec, 1, [0], fingerprints=prints))) == 40
    (tmp_path / "c" / "a.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(lines.replace(b"record 7", b"RECORD 7"))
    )
    with pytest.raises(UserError, match="a.jsonl.zst changed while the dump ran"):
        list(writer_documents(spec, 1, [0], fingerprints=prints))
