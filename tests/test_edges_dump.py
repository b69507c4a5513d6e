"""The edges of ``dump`` and ``check-teacher``: one row per bad input (tests/edges.py), each one
line, exit 2, and every file around it unchanged."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import zstandard
from safetensors.torch import load_file, save_file

from logit_store import StoreWriter
from tests.edges import Edge, check_edge
from tests.gguf_teachers import save_small_teacher, write_tiny_gguf
from tests.store_data import tiny_vocab
from tests.teachers import dump_args

TEACHERS: dict[str, Path] = {}  # filled once per module (the rows' setups link them into their folder)
SMALL = ["--max-length", "64", "--stride", "16", "--batch-tokens", "256", "--progress", "false"]


@pytest.fixture(scope="module", autouse=True)
def teachers(tmp_path_factory):
    """Tiny teachers over a 2,000-id byte-level BPE (the first ids of SmolLM2's): a GGUF file, one
    holding only the embedding, a saved transformers folder and a copy of it without its MLPs."""
    root = tmp_path_factory.mktemp("edge-teachers")
    TEACHERS["gguf"] = write_tiny_gguf(root / "tiny.gguf")
    TEACHERS["embedding-only.gguf"] = write_tiny_gguf(root / "embedding-only.gguf", lambda n: n == "token_embd.weight")
    TEACHERS["small"] = save_small_teacher(root / "small", TEACHERS["gguf"])
    TEACHERS["no-mlp"] = _without_tensors(TEACHERS["small"], root / "no-mlp", "mlp")
    yield TEACHERS
    TEACHERS.clear()


def _without_tensors(teacher: Path, folder: Path, part: str) -> Path:
    """A copy of a real saved teacher whose safetensors lack every tensor named with ``part``."""
    shutil.copytree(teacher, folder)
    tensors = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if part not in k}, folder / "model.safetensors", {"format": "pt"})
    return folder


def corpus(tmp: Path) -> Path:
    folder = tmp / "corpus"
    folder.mkdir(exist_ok=True)
    (folder / "a.txt").write_bytes(b"In the beginning God created the heaven and the earth.")
    (folder / "b.txt").write_bytes(b"And the earth was without form, and void.")
    return folder


def with_file(name: str, data: bytes):
    """Setup: a corpus, and an output folder holding a user's file ``name``."""

    def setup(tmp: Path) -> None:
        corpus(tmp)
        (tmp / "out").mkdir()
        (tmp / "out" / name).write_bytes(data)
        (tmp / "out" / "notes.txt").write_text("mine")

    return setup


def store_with_file(name: str, data: bytes):
    """Setup: a corpus, and a (tiny) store holding a file ``name`` no writer wrote."""

    def setup(tmp: Path) -> None:
        corpus(tmp)
        StoreWriter(tmp / "out", tiny_vocab()).close()
        (tmp / "out" / name).write_bytes(data)

    return setup


def lock_linked_outside(tmp: Path) -> None:
    """Setup: a corpus, and an output folder whose writer lock is a symlink to a file outside it."""
    corpus(tmp)
    (tmp / "out").mkdir()
    (tmp / "outside.txt").write_text("the user's file")
    (tmp / "out" / ".writer-00000.lock").symlink_to(tmp / "outside.txt")


def lock_linked_nowhere(tmp: Path) -> None:
    """Setup: as above, the link's target missing (a dump must not create it)."""
    corpus(tmp)
    (tmp / "out").mkdir()
    (tmp / "out" / ".writer-00000.lock").symlink_to(tmp / "created-outside")


def zst_corpus(mangle):
    """Setup: a ``.jsonl.zst`` corpus of 2,000 records, its compressed bytes passed through ``mangle``."""

    def setup(tmp: Path) -> None:
        lines = b"".join(json.dumps({"text": f"record {i} of the corpus"}).encode() + b"\n" for i in range(2000))
        (tmp / "corpus.jsonl.zst").write_bytes(mangle(zstandard.ZstdCompressor().compress(lines)))

    return setup


def non_utf8_name(tmp: Path) -> None:
    corpus(tmp)
    Path(os.fsdecode(os.fsencode(tmp / "corpus") + b"/caf\xe9.txt")).write_bytes(b"a document")


def dangling_links(tmp: Path) -> None:
    """Setup: a corpus folder of two dangling links and a named pipe (never opened)."""
    (tmp / "corpus").mkdir()
    for name in ("a.txt", "b.txt"):
        (tmp / "corpus" / name).symlink_to(tmp / "nowhere" / name)
    os.mkfifo(tmp / "corpus" / "pipe.txt")


def output_is_a_file(tmp: Path) -> None:
    corpus(tmp)
    (tmp / "out").write_text("a file of mine")


def edited_big_jsonl(tmp: Path) -> None:
    """A dumped 2.4 MB .jsonl corpus (two documents read), then one byte in its middle changed
    (same length): the rerun must see it."""
    record = json.dumps({"text": "x" * 1000}).encode() + b"\n"
    path = tmp / "big.jsonl"
    path.write_bytes(record * 2400)
    args = dump_args(TEACHERS["small"], path, tmp / "out", "--max-docs", "2")
    from bytedistill.cli import main

    assert main(args) == 0
    data = bytearray(path.read_bytes())
    data[len(data) // 2 + 100] = ord("y")
    path.write_bytes(bytes(data))


def dumped_without_source_record(tmp: Path) -> None:
    """A finished dump of the corpus whose writer's record of its source was then deleted."""
    corpus(tmp)
    from bytedistill.cli import main

    assert main(dump_args(TEACHERS["small"], tmp / "corpus", tmp / "out")) == 0
    (tmp / "out" / "source-00000.json").unlink()


def dump(teacher: str, *extra: str, corpus_arg: str = "{tmp}/corpus", output: str = "{tmp}/out") -> list[str]:
    return ["dump", "--teacher", f"{{teacher:{teacher}}}", "--corpus", corpus_arg, "--output", output, *SMALL, *extra]


def cuda_row():
    row = Edge("dump --device cuda without CUDA", dump("small", "--device", "cuda"), "CUDA is not available", corpus)
    return pytest.param(row, marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA"))


EDGES = [
    # its lock files are never reached through a link
    Edge("writer lock symlinked outside", dump("small"), ".writer-00000.lock is a symbolic link", lock_linked_outside),
    Edge(
        "writer lock symlinked to nothing", dump("small"), ".writer-00000.lock is a symbolic link", lock_linked_nowhere
    ),
    # a dump never overwrites or deletes what it did not write
    Edge("user's vocab.bin in --output", dump("small"), "vocab.bin is not from a store", with_file("vocab.bin", b"v")),
    Edge(
        "user's writer-00000.json in --output",
        dump("small"),
        "writer-00000.json is not from a store",
        with_file("writer-00000.json", b'{"mine": 1}'),
    ),
    Edge(
        "user's shard .bds.tmp in --output",
        dump("small"),
        "shard-00000-00000.bds.tmp is not from a store",
        with_file("shard-00000-00000.bds.tmp", b"draft"),
    ),
    Edge(
        "foreign .bds.tmp in a store",
        dump("small"),
        "does not begin as a shard",
        store_with_file("shard-00000-00000.bds.tmp", b"not a shard at all"),
    ),
    Edge(
        "foreign source record in a store",
        dump("small"),
        "source-00001.json is not a record of a writer's source",
        store_with_file("source-00001.json", b'{"pieces": {}}'),
    ),
    Edge(
        "finished store whose source record was deleted",
        dump("small"),
        "writer 0 stored documents of another corpus (it kept no record of it)",
        dumped_without_source_record,
    ),
    Edge(
        "foreign completion record in a store",
        dump("small"),
        "is not a completion record",
        store_with_file("writer-00003.json", b"[1, 2, 3]"),
    ),
    Edge(
        "user's manifest.json.w0.tmp in --output",
        dump("small"),
        "manifest.json.w0.tmp is not a partial store manifest",
        with_file("manifest.json.w0.tmp", b"my draft"),
    ),
    Edge(
        "corpus folder of dangling links and a pipe",
        dump("small"),
        "corpus; not read: 3 corpus entries (dangling link: 2, not a regular file: 1)",
        dangling_links,
    ),
    Edge("--output is a file", dump("small"), "is a file, not a folder", output_is_a_file),
    # a teacher whose weights do not all load
    Edge(
        "checkpoint without its MLPs", dump("no-mlp"), "lacks 6 of its model's weights (model.layers.{0-1}.mlp", corpus
    ),
    Edge("check-teacher: checkpoint without its MLPs", ["check-teacher", "{teacher:no-mlp}"], "mlp.down_proj", corpus),
    Edge(
        "GGUF holding only the embedding",
        dump("embedding-only.gguf"),
        "lacks 19 of its model's weights (model.layers.{0-1}.input_layernorm.weight",
        corpus,
    ),
    Edge(
        "check-teacher: GGUF holding only the embedding",
        ["check-teacher", "{teacher:embedding-only.gguf}"],
        "lacks 19 of its model's weights",
    ),
    # corpus files
    Edge(
        "truncated .jsonl.zst",
        dump("small", corpus_arg="{tmp}/corpus.jsonl.zst"),
        "corpus.jsonl.zst: the zstd data ends early",
        zst_corpus(lambda data: data[: len(data) // 2]),
        creates_ok=True,  # found while reading, after the store was started: a rerun replaces it
    ),
    Edge(
        "corrupt .jsonl.zst",
        dump("small", corpus_arg="{tmp}/corpus.jsonl.zst"),
        "corpus.jsonl.zst: not a readable zstd file",
        zst_corpus(lambda data: b"\x00" * 8 + data[8:]),
        creates_ok=True,
    ),
    Edge("corpus file name not UTF-8", dump("small"), "caf\\xe9.txt' under", non_utf8_name),
    Edge(
        "same-length edit in the middle of a big .jsonl",
        dump("small", "--max-docs", "2", corpus_arg="{tmp}/big.jsonl"),
        "writer 0 stored documents of another corpus (big.jsonl@0-2431200 changed since they were stored)",
        edited_big_jsonl,
    ),
    Edge("--separator ''", dump("small", "--separator", ""), "--separator must not be empty", corpus),
    cuda_row(),
]


@pytest.mark.parametrize("edge", EDGES, ids=str)
def test_dump_edge(edge: Edge, tmp_path, capsys, monkeypatch):
    argv = [_teacher_path(arg) for arg in edge.argv]
    check_edge(dataclasses.replace(edge, argv=argv), tmp_path, capsys, monkeypatch)


def _teacher_path(arg: str) -> str:
    """``{teacher:NAME}`` → the module's teacher NAME (built once, outside the rows' folders)."""
    if arg.startswith("{teacher:"):
        return str(TEACHERS[arg[len("{teacher:") : -1]])
    return arg
