"""A teacher folder whose ``transformers`` tokenizer adds no BOS (a tiny random Llama saved with
``save_pretrained`` over the real Llama-3 ``tokenizer.json``, which names no template): its stores
record no prefix, the export ships a teacher tokenizer that says so, and ``score`` takes the
student's own stores, for the flat and the patched student on both streams."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from bytedistill.cli import main as bytedistill
from bytestream.vocab import vocab_from_tokenizer, with_prefix_template
from logit_store import LogitStore
from students.release.teacher_check import same_tokens
from tests.teachers import dump_args, save_tiny_teacher
from tests.tiny_student import TINY

LLAMA3_BOS = 128_000
TINY_FLAGS = [
    arg
    for key, value in TINY.items()
    for arg in (f"--{key.replace('_', '-')}", str(value).lower() if isinstance(value, bool) else str(value))
]
PATCHED = ["--architecture", "patched", "--local-hidden-size", "16", "--local-window", "6"]


def folder_tokenizer(llama3_tokenizer_path: str) -> PreTrainedTokenizerFast:
    """The real Llama-3 tokenizer.json as a ``transformers`` tokenizer: it adds no BOS."""
    return PreTrainedTokenizerFast(
        tokenizer_file=llama3_tokenizer_path, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>"
    )


def test_the_folder_reads_no_prefix_and_the_bare_file_reads_llama3s(llama3_tokenizer_path, llama3_vocab):
    """The two readings of one file differ in the prefix only, which decides no stream symbol; a
    prefix template makes the bare file name the prefix it is given (none included)."""
    folder = vocab_from_tokenizer(folder_tokenizer(llama3_tokenizer_path))
    assert folder.prefix_ids == () and llama3_vocab.prefix_ids == (LLAMA3_BOS,)
    assert folder.hash != llama3_vocab.hash
    assert same_tokens(llama3_vocab, folder) and same_tokens(folder, llama3_vocab)
    spec = json.loads(Path(llama3_tokenizer_path).read_text(encoding="utf-8"))
    none = Tokenizer.from_str(json.dumps(with_prefix_template(spec, ())))
    assert vocab_from_tokenizer(none).prefix_ids == ()
    assert none.encode("a b").ids == none.encode("a b", add_special_tokens=False).ids
    template = with_prefix_template(spec, (LLAMA3_BOS,))["post_processor"]["processors"][-1]
    assert template["special_tokens"] == {
        "<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [LLAMA3_BOS], "tokens": ["<|begin_of_text|>"]}
    }
    assert with_prefix_template(spec, (10**9,)) is None  # an id the file does not name


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, llama3_tokenizer_path) -> Path:
    root = tmp_path_factory.mktemp("no-bos")
    folder = save_tiny_teacher(
        root / "teacher",
        folder_tokenizer(llama3_tokenizer_path),
        128_256,
        bos_token_id=LLAMA3_BOS,
        eos_token_id=128_001,
    )
    (root / "corpus").mkdir()
    for k in range(8):
        (root / "corpus" / f"d{k}.txt").write_text(f"In the beginning God created the heaven and the earth {k}. " * 2)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("stream", ["eot", "fused"])
def test_score_takes_the_students_own_heldout_store(teacher, stream, tmp_path, capsys):
    corpus = teacher.parent / "corpus"
    split = ["--stream", stream, "--heldout-fraction", "0.5", "--subset", "heldout"]
    assert bytedistill(dump_args(teacher, corpus, tmp_path / "heldout", *split)) == 0  # one dump: the check reads
    # the teacher's vocabulary, which is the same in every store of the teacher, so the students train on it too
    assert LogitStore(tmp_path / "heldout").vocab.prefix_ids == ()  # the teacher read no BOS
    for name, extra in [("flat", []), ("patched", PATCHED)]:
        run, model = tmp_path / f"run-{name}", tmp_path / f"model-{name}"
        train = ["train", "--train-stores", str(tmp_path / "heldout"), "--output-dir", str(run), *TINY_FLAGS]
        train += ["--stream", stream]  # a student that reads the teacher's boundaries, as its tokenizer ships
        assert bytedistill([*train, *extra, "--max-steps", "2", "--warmup-steps", "1"]) == 0
        assert bytedistill(["export", str(run), str(model)]) == 0
        shipped = vocab_from_tokenizer(Tokenizer.from_file(str(model / "teacher_tokenizer.json")))
        assert shipped.prefix_ids == ()  # the folder carries what the dump's teacher read
        capsys.readouterr()
        assert bytedistill(["score", str(model), str(tmp_path / "heldout"), "--progress", "false"]) == 0, name
        assert "total" in capsys.readouterr().out
