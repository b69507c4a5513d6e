"""A store's size, as dump's summary and inspect print it: each figure says what it counts, and the
two share the per-text-byte figure of the shards alone; dump's progress count is named by its summary."""

from __future__ import annotations

import pytest

from bytedistill.cli import main as cli_main
from distill.dump.summary import DumpSummary
from logit_store import LogitStore
from tests.stores import random_texts, write_random_store


@pytest.fixture(scope="module")
def store(tmp_path_factory, llama3_vocab, llama3_converter, llama3_encoder):
    folder = tmp_path_factory.mktemp("sizes") / "store"
    return write_random_store(folder, llama3_vocab, llama3_converter, llama3_encoder, random_texts(4, 1))


def test_dump_and_inspect_name_what_each_size_counts(store, capsys):
    stats = LogitStore(store).stats()
    summary = DumpSummary(
        documents=stats["documents"],
        text_bytes=stats["text_bytes"],
        tokens=stats["tokens"],
        teacher_rows=stats["tokens"] + stats["documents"],
        store=str(store),
        store_bytes=stats["shard_bytes"],
    )
    lines = summary.lines()
    shards = f"{stats['shard_bytes_per_text_byte']:.2f}"
    size = next(line for line in lines if line.startswith("store size"))
    assert f"{stats['shard_bytes']:,} bytes in the shards alone ({shards} per text byte;" in size
    assert "inspect also counts the manifest and the vocabulary file" in size
    tokens = next(line for line in lines if line.startswith("teacher tokens"))
    assert f"({stats['tokens'] + stats['documents']:,} teacher rows, the progress bar's count" in tokens
    assert cli_main(["inspect", str(store)]) == 0
    out = capsys.readouterr().out
    assert f"({stats['size_on_disk']:,} bytes: the shards, the manifest and the one-off vocabulary file)" in out
    assert f"on disk; {shards} in the shards alone (what dump reports)" in out
