"""A corpus is not all-or-nothing: documents the teacher cannot encode are skipped, counted and
listed, a resume passes over them, and a store without finished documents can be replaced.

The teacher is a tiny GGUF over SmolLM2's first ids (tests/gguf_teachers.py), which, like SmolLM2,
has no single-byte token for 21 byte values (0xFE among them)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bytedistill.cli import main as bytedistill
from common.threads import available_cpus
from logit_store import LogitStore, store_content_hash
from logit_store.manifest import read_manifest
from logit_store.skips import Skip, SkipList, read_skips
from tests.edges import Edge, check_edge
from tests.gguf_teachers import write_tiny_gguf
from tests.kill import kill_after_shards, start_bytedistill

KILLABLE = ["--max-length", "64", "--stride", "16", "--batch-tokens", "64", "--group-tokens", "64"]
ARGS = [*KILLABLE, "--progress", "false", "--docs-per-shard", "2"]
BAD = {2, 7, 12, 17, 22, 27, 32, 37, 42, 47}  # documents with a byte the teacher has no token for


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def mixed_corpus(folder: Path, count: int = 48) -> Path:
    """``count`` documents of growing length, those in BAD holding 0xFE; plus a dangling link and
    a file with an unsupported suffix, which are not read."""
    folder.mkdir()
    for i in range(count):
        bad = b"\xfe" if i in BAD else b""
        (folder / f"doc{i:02d}.txt").write_bytes(f"Document {i}: ".encode() + bad + b"lorem ipsum dolor " * (5 + i))
    (folder / "gone.txt").symlink_to(folder / "nowhere.txt")
    (folder / "notes.csv").write_text("a,b\n")
    return folder


def dump(teacher: Path, corpus: Path, output: Path, *extra: str) -> list[str]:
    return ["dump", "--teacher", str(teacher), "--corpus", str(corpus), "--output", str(output), *ARGS, *extra]


@pytest.mark.slow
def test_unencodable_documents_are_skipped_listed_and_resumed(teacher, tmp_path, capsys, monkeypatch):
    """The good documents are stored, the others listed with their reasons; a run killed midway
    and resumed gives the same store (content hash) and the same skip list, without encoding a
    listed document again. The runs up to the kill compute on one torch thread more than the machine
    has CPUs (a count the load never chooses); the resume, told no count, takes the one the store
    records, and a run told another count says its rows may round otherwise."""
    threads = available_cpus() + 1
    monkeypatch.setenv("OMP_NUM_THREADS", str(threads))
    corpus = mixed_corpus(tmp_path / "corpus")
    whole = tmp_path / "whole"
    assert bytedistill(dump(teacher, corpus, whole)) == 0
    out = capsys.readouterr().out
    assert "38 (+0 already stored, 0 empty skipped, 10 unencodable skipped)" in out
    assert "doc02.txt: the teacher vocabulary has no token for the byte 0xFE" in out
    assert (
        "… 5 more; all in" in out
        and "not read            2 corpus entries (dangling link: 1, not a supported suffix: 1)" in out
    )
    expected = [
        Skip(i, f"doc{i:02d}.txt", "the teacher vocabulary has no token for the byte 0xFE") for i in sorted(BAD)
    ]
    assert read_skips(whole) == expected
    assert [LogitStore(whole).document(i).key for i in range(3)] == ["doc00.txt", "doc01.txt", "doc03.txt"]

    killed = tmp_path / "killed"
    kill_after_shards([start_bytedistill(dump(teacher, corpus, killed))], killed, 2, timeout=180)
    assert 0 < len(read_skips(killed)) < len(BAD)  # doc02 was skipped before the second shard
    assert read_skips(killed) == expected[: len(read_skips(killed))]

    assert read_manifest(killed)["teacher_numerics"] == {"device": "cpu", "dtype": "float32", "cpu_threads": threads}

    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.delenv("TORCH_NUM_THREADS", raising=False)
    assert bytedistill(dump(teacher, corpus, killed)) == 0
    resumed = capsys.readouterr()
    assert "listed by an earlier run)" in resumed.out
    assert f"dump: resuming with {threads} torch threads, as the store was written" in resumed.err
    assert torch.get_num_threads() == threads
    assert store_content_hash(killed) == store_content_hash(whole)
    assert read_skips(killed) == expected

    assert bytedistill(["inspect", str(killed)]) == 0
    assert "skipped:         10 documents" in capsys.readouterr().out
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert bytedistill(dump(teacher, corpus, killed, "--verbose")) == 0  # nothing left; the entries by name
    captured = capsys.readouterr()
    assert f"dump: note: the store was written with the teacher's cpu_threads {threads} (now 1)" in captured.err
    assert "nothing left to dump" in captured.out and "(10 listed by an earlier run)" in captured.out
    assert f"not read: {corpus / 'gone.txt'} (dangling link)" in captured.err


def test_strict_refuses_the_first_unencodable_document(teacher, tmp_path, capsys, monkeypatch):
    def setup(tmp: Path) -> None:
        mixed_corpus(tmp / "corpus", count=4)

    edge = Edge(
        "--strict",
        dump(teacher, Path("{tmp}/corpus"), Path("{tmp}/out"), "--strict"),
        "document doc02.txt: the teacher vocabulary has no token for the byte 0xFE",
        setup,
        creates_ok=True,
    )
    check_edge(edge, tmp_path, capsys, monkeypatch)


def test_rerun_after_a_refusal_replaces_the_unfinished_store(teacher, tmp_path, capsys):
    """A store refused before its first finished shard is replaced by a rerun with the corpus
    fixed (one line says so); the user's own file in the folder stays; a store with finished
    documents is never replaced."""
    corpus = mixed_corpus(tmp_path / "corpus", count=4)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    strict = [*dump(teacher, corpus, out, "--strict"), "--docs-per-shard", "100"]
    assert bytedistill(strict) == 2
    assert (out / "manifest.json").exists() and not list(out.glob("shard-*.bds"))
    (corpus / "doc02.txt").unlink()
    assert bytedistill(dump(teacher, corpus, out)) == 0
    captured = capsys.readouterr()
    assert f"bytedistill dump: replacing {out}: it held no finished document (corpus_hash differed)" in captured.err
    assert "3 (+0 already stored, 0 empty skipped, 0 unencodable skipped)" in captured.out
    assert (out / "notes.txt").read_text() == "mine"

    (corpus / "doc03.txt").unlink()
    before = store_content_hash(out)
    assert bytedistill(dump(teacher, corpus, out)) == 2
    assert "it holds finished documents: choose another --output" in capsys.readouterr().err
    assert store_content_hash(out) == before


def test_check_teacher_says_what_dump_does_with_missing_bytes(teacher, capsys):
    bytedistill(["check-teacher", str(teacher)])
    out = capsys.readouterr().out
    assert "no single-byte token for 0x04 0x06" in out and "0xFE 0xFF" in out
    assert "dump skips a document that needs one" in out and "--strict refuses it" in out


@pytest.mark.parametrize(
    "stored, skipped, resume",
    [
        (0, [], 0),
        (3, [], 3),
        (2, [0], 3),  # skipped, stored, stored
        (2, [2], 2),  # the skip after the stored two is passed over as listed
        (2, [1, 2], 4),
        (1, [0, 2], 2),  # its documents 0 (skipped), 1 (stored), 2 (skipped, listed)
        (1, [0, 1, 2], 4),  # its documents 0, 1, 2 skipped, 3 stored
    ],
)
def test_resume_ordinal_passes_the_skips_among_the_stored(tmp_path, stored, skipped, resume):
    """Skips are numbered among the documents their writer was dealt."""
    skips = SkipList(tmp_path, 1)
    for index in skipped:
        skips.add(Skip(index, f"k{index}", "r"))
    skips.close()
    assert SkipList(tmp_path, 1).resume_ordinal(stored) == resume


def test_a_skip_line_cut_by_a_crash_is_dropped(tmp_path):
    skips = SkipList(tmp_path, 0)
    skips.add(Skip(4, "a", "r"))
    skips.close()
    with skips.path.open("ab") as f:
        f.write(b'{"index": 9, "ke')
    assert SkipList(tmp_path, 0).skips == [Skip(4, "a", "r")]
    assert skips.path.read_bytes().endswith(b"}\n")


def test_linked_folders_are_read_and_a_link_loop_is_named(tmp_path):
    """A link to a folder is followed as a link to a file is (its files keyed through the link); a
    link back to a folder on its own path is a loop, named, not followed; neither is silent."""
    from distill.corpus.files import list_corpus

    outside = tmp_path / "outside"
    (outside / "deeper").mkdir(parents=True)
    (outside / "deeper" / "b.txt").write_text("b")
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "sub" / "a.txt").write_text("a")
    (corpus / "linked").symlink_to(outside)
    (corpus / "sub" / "back").symlink_to(corpus)  # a loop
    (corpus / "sub" / "up").symlink_to(tmp_path)  # the corpus's own parent: a loop too
    listing = list_corpus(corpus)
    assert [p.relative_to(corpus).as_posix() for p in listing.files] == ["linked/deeper/b.txt", "sub/a.txt"]
    assert [(p.relative_to(corpus).as_posix(), why) for p, why in listing.not_read] == [
        ("sub/back", "link loop"),
        ("sub/up", "link loop"),
    ]
    assert listing.not_read_note() == "2 corpus entries (link loop: 2)"


@pytest.mark.slow
def test_a_store_inside_its_corpus_folder_resumes(teacher, tmp_path, capsys):
    """A store written inside the corpus folder it dumps (its skip list is a .jsonl) is never read
    as corpus: the rerun resumes, and its linked folder of documents is read (and said)."""
    corpus = mixed_corpus(tmp_path / "corpus", 8)
    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "extra.txt").write_bytes(b"a document in a linked folder")
    (corpus / "linked").symlink_to(tmp_path / "more")
    store = corpus / "store"
    assert bytedistill(dump(teacher, corpus, store)) == 0
    first = capsys.readouterr().out
    assert "7 (+0 already stored, 0 empty skipped, 2 unencodable skipped)" in first
    assert (store / "skipped-00000.jsonl").is_file()
    assert "linked/extra.txt" in [LogitStore(store).document(i).key for i in range(len(LogitStore(store)))]
    assert bytedistill(dump(teacher, corpus, store)) == 0
    again = capsys.readouterr().out
    assert "nothing left to dump" in again and "a logit store: 1" in again
