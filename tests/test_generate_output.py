"""``generate``'s output and bounds: ``--output-format jsonl`` keeps each prompt's continuation apart
and exact, a prompts file's empty lines are skipped, a long last word is healed over at most half
the trained context, and the window sliding past the context prints no transformers reminder."""

from __future__ import annotations

import json

import pytest

from bytedistill.cli import main as cli_main
from students.release.export import export_student
from students.release.generate import GenerateOptions, generate_bytes, load_folder
from students.training.synthetic import SYNTHETIC_SOURCE
from students.training.trainer import train
from tests.tiny_student import tiny_config

GREEDY = ["--max-new-bytes", "24", "--greedy"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory, llama3_tokenizer_path):
    root = tmp_path_factory.mktemp("flat")
    train(tiny_config(root / "run", max_steps=1), SYNTHETIC_SOURCE)
    return export_student(root / "run", root / "model", teacher_tokenizer=llama3_tokenizer_path)


def test_jsonl_keeps_each_continuation_apart_and_exact_and_empty_lines_are_skipped(folder, tmp_path, capsys):
    (tmp_path / "prompts.txt").write_bytes(b"And\n\n\r\nx = f(a1, b\n\n")
    argv = ["generate", str(folder), "--prompt", "In the", "--prompts-file", str(tmp_path / "prompts.txt"), *GREEDY]
    assert cli_main([*argv, "--output-format", "jsonl"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt"] for r in records] == ["In the", "And", "x = f(a1, b"]
    model, tokenizer = load_folder(folder)
    options = GenerateOptions(max_new_bytes=24, greedy=True)
    for record in records:
        exact = bytes.fromhex(record["continuation_hex"])
        assert record["continuation"].encode("utf-8", "surrogateescape") == exact
        assert exact == generate_bytes(model, tokenizer, record["prompt"], options)
    assert cli_main(argv) == 0  # text: each prompt and its continuation decoded, as before
    text = capsys.readouterr().out
    assert text.startswith("In the") and "And" in text and "\n\n" not in text.rstrip("\n")


def test_a_long_last_word_is_healed_over_at_most_half_the_context(folder):
    model, tokenizer = load_folder(folder)
    context = model.config.max_position_embeddings
    word = b"abracadabra" * 1000  # 11,000 bytes of one word
    symbols, open_bytes = tokenizer.encode_prompt(word, max_open=context // 2)
    assert 0 < len(open_bytes) <= context // 2 and word.endswith(open_bytes)
    assert tokenizer.text_bytes(symbols) + open_bytes == word
    assert tokenizer.encode_prompt(b"In the begi", max_open=context // 2) == tokenizer.encode_prompt(b"In the begi")
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    out = generate_bytes(model, tokenizer, word.decode(), GenerateOptions(max_new_bytes=4, greedy=True))
    assert len(out) == 4 and len(calls) <= context + 8  # not a step per byte of the word


def test_sliding_past_the_context_prints_only_our_own_line(folder, capsys):
    argv = ["generate", str(folder), "--prompt", "In the beginning God created the heaven", "x", "--max-new-bytes"]
    assert cli_main([*argv, "60", "--greedy"]) == 0
    err = capsys.readouterr().err
    assert "the window slides past it" in err and "predefined maximum length" not in err
