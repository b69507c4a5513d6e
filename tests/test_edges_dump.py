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

from bytestream.stream_kind import StreamKind
from logit_store import StoreIdentity, StoreWriter
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
    TEACHERS["chat.gguf"] = write_tiny_gguf(root / "chat.gguf", chat_template=True)
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
        StoreWriter(tmp / "out", StoreIdentity(tiny_vocab())).close()
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


def dumped(*extra: str):
    """Setup: a finished dump of the corpus by the small teacher, with ``extra`` flags."""

    def setup(tmp: Path) -> None:
        corpus(tmp)
        from bytedistill.cli import main

        assert main(dump_args(TEACHERS["small"], tmp / "corpus", tmp / "out", *extra)) == 0

    return setup


def dumped_then_corpus_grew(tmp: Path) -> None:
    """A finished dump of the corpus, then a document added to the corpus (another corpus)."""
    dumped()(tmp)
    (tmp / "corpus" / "c.txt").write_bytes(b"And darkness was upon the face of the deep.")


def dumped_then_weights_changed(kind: str):
    """Setup: a finished dump by a teacher copied into the folder (a saved folder, or a GGUF file),
    then that teacher's weights changed at the same path (same names, same sizes)."""

    def setup(tmp: Path) -> None:
        corpus(tmp)
        from bytedistill.cli import main

        if kind == "gguf":
            teacher = write_tiny_gguf(tmp / "teacher.gguf")
        else:
            teacher = tmp / "teacher"
            shutil.copytree(TEACHERS["small"], teacher)
        assert main(dump_args(teacher, tmp / "corpus", tmp / "out")) == 0
        if kind == "gguf":
            write_tiny_gguf(teacher, seed=1)
        else:
            tensors = load_file(teacher / "model.safetensors")
            name = max(tensors)
            tensors[name] = tensors[name] * 2
            save_file(tensors, teacher / "model.safetensors", {"format": "pt"})

    return setup


def dump(teacher: str, *extra: str, corpus_arg: str = "{tmp}/corpus", output: str = "{tmp}/out") -> list[str]:
    return ["dump", "--teacher", f"{{teacher:{teacher}}}", "--corpus", corpus_arg, "--output", output, *SMALL, *extra]


def chats(*messages_lists, template: str | None = None):
    """Setup: ``chats.jsonl``, one conversation per line (and a chat template file ``t.jinja``)."""

    def setup(tmp: Path) -> None:
        lines = "".join(json.dumps({"messages": m}) + "\n" for m in messages_lists)
        (tmp / "chats.jsonl").write_text(lines)
        if template is not None:
            (tmp / "t.jinja").write_text(template)

    return setup


CHATML = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
NO_SYSTEM = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system messages') }}{% endif %}" + CHATML
EXCHANGE = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def chat(*extra: str) -> list[str]:
    return dump("chat.gguf", "--chat", *extra, corpus_arg="{tmp}/chats.jsonl")


DEEP = "[" * 100_000 + "]" * 100_000  # deeper than Python's recursion limit


def deep_jsonl(tmp: Path) -> None:
    (tmp / "deep.jsonl").write_text('{"text": "fine"}\n{"text": "x", "more": ' + DEEP + "}\n")


def store_with_deep_manifest(tmp: Path) -> None:
    StoreWriter(tmp / "out", StoreIdentity(tiny_vocab())).close()
    (tmp / "out" / "manifest.json").write_text(DEEP)


def one_line_too_long(tmp: Path) -> None:
    """A .jsonl of one document whose values could not wait in this machine's memory (its size
    follows the machine: the dump's own estimate, 4.7 KB a token, is over the memory it has)."""
    from distill.dump import memory as dump_memory

    per_token = dump_memory.TOKEN_COSTS[StreamKind.EOT].waiting_bytes
    size = int(dump_memory.capacity(torch.device("cpu")) / per_token * dump_memory.BYTES_PER_TOKEN * 1.2)
    words = b"lorem ipsum dolor sit amet "
    (tmp / "long.jsonl").write_bytes(b'{"text": "' + words * (size // len(words)) + b'"}\n')


def no_partial_vocab(tmp: Path) -> None:
    assert not list((tmp / "out").glob("*.tmp")) and not (tmp / "out" / "vocab.bin").exists()


def read_only_output(tmp: Path) -> None:
    corpus(tmp)
    (tmp / "locked").mkdir()
    (tmp / "locked").chmod(0o555)


def cuda_row():
    row = Edge("dump --device cuda without CUDA", dump("small", "--device", "cuda"), "CUDA is not available", corpus)
    return pytest.param(row, marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA"))


EDGES = [
    Edge(
        "--chat, a teacher without a chat template",
        dump("gguf", "--chat", corpus_arg="{tmp}/chats.jsonl"),
        "the teacher's tokenizer has no chat template: give one with --chat-template FILE",
        chats(EXCHANGE),
    ),
    Edge(
        "--chat-template file missing",
        chat("--chat-template", "{tmp}/none.jinja"),
        "none.jinja: no such file",
        chats(EXCHANGE),
    ),
    Edge(
        "--respond without --chat",
        dump("chat.gguf", "--respond"),
        "--respond, --chat-template and --prompt-field read conversations: add --chat",
        corpus,
    ),
    Edge(
        "a chat template that renders no conversation",
        chat("--chat-template", "{tmp}/t.jinja"),
        "the chat template renders none of the probe conversations",
        chats(EXCHANGE, template="{{ raise_exception('never') }}"),
    ),
    Edge(
        "conversation without a role, --strict",
        chat("--strict"),
        "document chats.jsonl@0: message 1 has no role (without --strict it is skipped and listed)",
        chats([{"content": "hi"}]),
        creates_ok=True,
    ),
    Edge(
        "conversation content not text, --strict",
        chat("--strict"),
        "document chats.jsonl@0: message 2's content is dict, not text",
        chats([EXCHANGE[0], {"role": "assistant", "content": {"text": "hello"}}]),
        creates_ok=True,
    ),
    Edge(
        "a chat template that raises on a conversation, --strict",
        chat("--strict", "--chat-template", "{tmp}/t.jinja"),
        "document chats.jsonl@0: the chat template refuses it: no system messages",
        chats([{"role": "system", "content": "be brief"}, *EXCHANGE], template=NO_SYSTEM),
        creates_ok=True,
    ),
    Edge(
        "records without the messages field",
        dump("chat.gguf", "--chat", corpus_arg="{tmp}/text.jsonl"),
        "text.jsonl:1: no field 'messages' (fields: text); use --messages-field, or --prompt-field for prompt/answer pairs",
        lambda tmp: (tmp / "text.jsonl").write_text('{"text": "hi"}\n'),
        creates_ok=True,
    ),
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
    # a store of another corpus holding finished documents: refused before the teacher loads (here: none to load)
    Edge(
        "store of another corpus, before the teacher loads",
        ["dump", "--teacher", "{tmp}/no-teacher", "--corpus", "{tmp}/corpus", "--output", "{tmp}/out", *SMALL],
        "(corpus_hash differ): corpus_hash: store has ",
        dumped_then_corpus_grew,
    ),
    # a store holds one stream: its rows of the other cannot be derived from them
    Edge(
        "resume of an <eot> store with --stream fused",
        dump("small", "--stream", "fused"),
        "(stream differ): stream: the store holds the <eot> stream, this run writes the fused stream",
        dumped("--stream", "eot"),
    ),
    Edge(
        "resume of a fused store with --stream eot",
        dump("small", "--stream", "eot"),
        "(stream differ): stream: the store holds the fused stream, this run writes the <eot> stream",
        dumped(),
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
    # a store never mixes two teachers: the teacher is its weights, not its path
    Edge(
        "resume after the teacher folder's weights changed",
        ["dump", "--teacher", "{tmp}/teacher", "--corpus", "{tmp}/corpus", "--output", "{tmp}/out", *SMALL],
        "teacher_hash: store has 'sha256:",
        dumped_then_weights_changed("folder"),
    ),
    Edge(
        "resume after the GGUF teacher was rewritten",
        ["dump", "--teacher", "{tmp}/teacher.gguf", "--corpus", "{tmp}/corpus", "--output", "{tmp}/out", *SMALL],
        "teacher_hash: store has 'sha256:",
        dumped_then_weights_changed("gguf"),
    ),
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
    # no traceback: JSON nested too deeply, a document too long for the memory, a folder it may not write
    Edge(
        "corpus .jsonl record nested too deeply",
        dump("small", corpus_arg="{tmp}/deep.jsonl"),
        "deep.jsonl:2: JSON nested too deeply to read",
        deep_jsonl,
        creates_ok=True,
    ),
    Edge(
        "inspect: manifest nested too deeply",
        ["inspect", "{tmp}/out"],
        "JSON nested too deeply",
        store_with_deep_manifest,
    ),
    Edge(
        "verify: manifest nested too deeply",
        ["verify", "{tmp}/out"],
        "JSON nested too deeply",
        store_with_deep_manifest,
    ),
    Edge(
        "one-line document beyond the memory, default flags",
        dump("small", corpus_arg="{tmp}/long.jsonl"),
        "to the dump's memory estimate (its values wait until it is written: 8.1 KB a token beyond --group-tokens)",
        one_line_too_long,
        creates_ok=True,  # refused when read, once the store was started: a rerun replaces it
    ),
    Edge(
        "--output where nothing may be written (/sys)",
        dump("small", output="/sys/bytedistill-edge-out"),
        "/sys/bytedistill-edge-out: ",
        corpus,
    ),
    pytest.param(
        Edge(
            "--output in a read-only folder",
            dump("small", output="{tmp}/locked/out"),
            "Permission denied",
            read_only_output,
        ),
        marks=pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders"),
    ),
    Edge(
        "file-size limit while writing vocab.bin",
        dump("small"),
        "out/vocab.bin: File too large",
        corpus,
        subprocess=True,
        file_size_limit=5_000,  # the manifest fits, vocab.bin (6 KB) does not
        creates_ok=True,
        after=no_partial_vocab,
    ),
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


def test_missing_weights_are_found_before_the_model_is_allocated():
    """The check reads the folder on ``meta`` (no memory for weights); a failing meta load would
    hide the gap until the full load (transformers' hub kernels refused ``meta``)."""
    from distill.teacher.weights import missing_weights

    assert missing_weights(str(TEACHERS["small"])) == []
    missing = missing_weights(str(TEACHERS["no-mlp"]))
    assert len(missing) == 6 and all(".mlp." in name for name in missing)
