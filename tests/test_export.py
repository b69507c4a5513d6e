"""Export: a trained student becomes a folder transformers loads as-is (the model with no remote code, the
stream tokenizer with it); generate; model card snippet; stale files and local paths."""

import json
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from bytedistill.cli import main as cli_main
from bytestream.alphabet import EOT
from common.errors import UserError
from students.release.card import model_card
from students.release.export import export_student
from students.release.export_record import EXPORT_RECORD
from students.release.generate import (
    GenerateOptions,
    generate_bytes,
    load_folder,
)
from students.release.trained_student import load_student, resolve_checkpoint
from students.training.synthetic import SYNTHETIC_SOURCE
from students.training.trainer import train
from tests.tiny_student import tiny_config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    config = tiny_config(out, eval_store="eval", max_steps=3)
    train(config, SYNTHETIC_SOURCE)
    return out


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory, llama3_tokenizer_path):
    return export_student(
        trained,
        tmp_path_factory.mktemp("hf") / "student",
        teacher_tokenizer=llama3_tokenizer_path,
        repo_id="me/byte-student",
    )


def test_folder_loads_with_auto_classes_and_logits_match(trained, exported):
    names = {p.name for p in exported.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "README.md"} <= names
    model = AutoModelForCausalLM.from_pretrained(exported)
    reference = load_student(resolve_checkpoint(trained))
    ids = torch.tensor([[257, 72, 105, 256, 32, 0xE4, 0xB8, 0x96, 256]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
    assert model.generation_config.eos_token_id == 258 and model.generation_config.pad_token_id == 259
    with pytest.raises(ValueError, match=r"trust_remote_code=True"):  # no silent plain bytes
        AutoTokenizer.from_pretrained(exported, trust_remote_code=False)
    assert PreTrainedTokenizerFast.from_pretrained(exported)("ab").input_ids == [257, 97, 98]  # plain bytes, by name
    assert AutoTokenizer.from_pretrained(exported, trust_remote_code=True)("ab").input_ids == [257, 97, 98, EOT]
    assert model.config.max_position_embeddings == 16  # the trained context


def test_generate_drops_eot(exported):
    model, tokenizer = load_folder(exported)
    model.generation_config.suppress_tokens = [257, 258, 259]
    model.generation_config.eos_token_id = None
    out = generate_bytes(model, tokenizer, "Hi", GenerateOptions(max_new_bytes=40, greedy=True))
    assert len(out) == 40
    text = generate_bytes(model, tokenizer, "Hi", GenerateOptions(max_new_bytes=20, seed=1)).decode(errors="replace")
    assert "<eot>" not in text and len(text.encode("utf-8", errors="surrogateescape")) >= 1


def test_generate_cli(exported, capsys):
    assert cli_main(["generate", str(exported), "--prompt", "ab", "--max-new-bytes", "5", "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("ab") and "<eot>" not in printed


def test_model_card_has_metadata_and_snippet_runs(exported, capsys):
    card = (exported / "README.md").read_text()
    header = card.split("---")[1]
    for key in (
        "license",
        "teacher",
        "training_bytes",
        "heldout_bpb_student",
        "heldout_bpb_teacher",
        "heldout_kl_bits_per_byte",
    ):
        assert re.search(rf"^{key}: ", header, re.MULTILINE), key
    code = re.search(r"```python\n(.*?)```", card, re.DOTALL).group(1)
    assert 'repo = "me/byte-student"' in code
    exec(code.replace('"me/byte-student"', repr(str(exported))), {})  # noqa: S102 - runs the model card's own snippet
    assert capsys.readouterr().out.startswith("The meaning of life is")


def test_export_cli_and_errors(trained, tmp_path, llama3_tokenizer_path):
    args = ["export", str(trained), str(tmp_path / "x"), "--teacher-tokenizer", llama3_tokenizer_path]
    assert cli_main([*args, "--teacher", "meta-llama/Llama-3.2-1B"]) == 0
    assert "base_model: meta-llama/Llama-3.2-1B" in (tmp_path / "x" / "README.md").read_text()
    with pytest.raises(UserError, match="neither a training checkpoint"):
        export_student(tmp_path / "nothing", tmp_path / "y", teacher_tokenizer=llama3_tokenizer_path)
    with pytest.raises(UserError, match="give --teacher-tokenizer"):
        export_student(trained, tmp_path / "y")


def test_export_replaces_its_own_files_and_refuses_other_content(trained, tmp_path, llama3_tokenizer_path):
    out = export_student(trained, tmp_path / "out", teacher_tokenizer=llama3_tokenizer_path)
    written = json.loads((out / EXPORT_RECORD).read_text())["files"]
    assert sorted(written) == sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert "custom_generate/generate.py" in written
    (out / "model-00001-of-00002.safetensors").write_text("stale shard")  # as if a larger export had been here
    record = json.loads((out / EXPORT_RECORD).read_text())
    (out / EXPORT_RECORD).write_text(json.dumps({"files": record["files"] + ["model-00001-of-00002.safetensors"]}))
    (out / ".git").mkdir()
    export_student(trained, out, teacher_tokenizer=llama3_tokenizer_path)
    assert not (out / "model-00001-of-00002.safetensors").exists() and (out / ".git").is_dir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not empty and not a bytedistill export"):
        export_student(trained, out, teacher_tokenizer=llama3_tokenizer_path)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "weights.bin").write_text("x")
    with pytest.raises(UserError, match="not empty"):
        export_student(trained, tmp_path / "other", teacher_tokenizer=llama3_tokenizer_path)
    assert (tmp_path / "other" / "weights.bin").read_text() == "x"


def test_model_card_names_no_local_path(trained, tmp_path, llama3_tokenizer_path):
    teacher = tmp_path / "teachers" / "SmolLM2.gguf"
    teacher.parent.mkdir()
    teacher.write_text("")
    out = export_student(trained, tmp_path / "m", teacher_tokenizer=llama3_tokenizer_path, teacher=str(teacher))
    card = (out / "README.md").read_text()
    assert "SmolLM2.gguf" in card and str(tmp_path) not in card and "trained_context: 16" in card


def test_shipped_tokenizer_is_the_librarys_module_and_self_contained(exported):
    import ast

    from bytestream import stream_tokenizer
    from students.release import custom_generate

    shipped = (exported / "tokenization_bytedistill.py").read_text()
    assert shipped == Path(stream_tokenizer.__file__).read_text()
    imported = set()
    for node in ast.walk(ast.parse(shipped)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
    assert imported <= {
        "__future__",
        "dataclasses",
        "functools",
        "json",
        "os",
        "re",
        "tokenizers",
        "transformers",
        "torch",
    }, imported
    generate = (exported / "custom_generate" / "generate.py").read_text()
    assert generate == Path(custom_generate.__file__).read_text()
    assert {n.module for n in ast.walk(ast.parse(generate)) if isinstance(n, ast.ImportFrom)} == {"transformers"}


@pytest.mark.parametrize(
    "teacher, shown",
    [("../teacher", "teacher"), ("./teachers/smol", "smol"), ("~/models/smol", "smol"), ("a/../b", "b")],
)
def test_the_card_records_no_local_path_as_base_model(teacher, shown):
    card = str(model_card({"data": {"teacher": teacher}}, 16))
    assert "base_model" not in card.split("---")[1]  # the metadata block
    assert f"teacher: {shown}" in card and teacher not in card


def test_the_card_records_a_hub_id_as_base_model():
    card = str(model_card({"data": {"teacher": "HuggingFaceTB/SmolLM2-135M"}}, 16))
    assert "base_model: HuggingFaceTB/SmolLM2-135M" in card
