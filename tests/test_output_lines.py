"""What the commands print about themselves says what is true: the dump names each setup step
before its progress bar starts, and ``check-teacher`` reads a GGUF file's output layer."""

from __future__ import annotations

import json

import pytest

from bytedistill.cli import main as bytedistill
from tests.gguf_teachers import VOCAB, save_small_teacher, write_tiny_gguf


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_check_teacher_reads_the_output_layer_of_a_full_gguf(tiny_gguf, capsys):
    assert bytedistill(["check-teacher", str(tiny_gguf)]) == 0
    out = capsys.readouterr().out
    assert f"output layer     {VOCAB:,} rows" in out and "tokenizer only" not in out


def test_check_teacher_says_a_tokenizer_only_gguf_has_no_output_layer(tmp_path, capsys):
    bare = write_tiny_gguf(tmp_path / "tokenizer-only.gguf", keep=lambda name: False)
    bytedistill(["check-teacher", str(bare)])  # refused: it holds none of its model's weights
    assert "output layer     unknown (tokenizer only)" in capsys.readouterr().out


@pytest.mark.slow
def test_the_dump_names_each_setup_step_before_the_bar(tiny_gguf, tmp_path, capsys):
    teacher = save_small_teacher(tmp_path / "teacher", tiny_gguf)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "In the beginning God created the heaven and the earth."}))
    args = ["dump", "--teacher", str(teacher), "--corpus", str(corpus), "--output", str(tmp_path / "store")]
    assert bytedistill([*args, "--max-length", "64", "--stride", "16"]) == 0
    err = capsys.readouterr().err
    steps = ["dump: loading the teacher", "dump: building the conversion tables", "dump: ordering the output layer"]
    steps += ["dump: opening the store", "dump[0]"]  # the last: the bar
    where = [err.find(step) for step in steps]
    assert -1 not in where and where == sorted(where), err
    assert bytedistill([*args, "--max-length", "64", "--stride", "16", "--progress", "false"]) == 0
    assert "dump: " not in capsys.readouterr().err  # without the bar, no stage lines either
