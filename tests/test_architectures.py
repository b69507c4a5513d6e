"""Student architectures are objects in one registry: a new one is one module and one registry line
(the toy of tests/toy_architecture.py trains, exports and scores), and no other module names one."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest
import torch

from students.models.architectures import ARCHITECTURES
from students.models.flat import FLAT
from students.models.patched import PATCHED
from tests.toy_architecture import TOY, ToyBigram

ROOT = Path(__file__).resolve().parents[1]
OWN_MODULES = {"students/models/flat.py", "students/models/patched.py", "students/models/patched_model.py"}


def test_each_architecture_is_told_by_its_configs_model_type():
    from transformers import LlamaConfig

    from students.models.patched_model import PatchedStudentConfig

    assert FLAT.model_type == LlamaConfig.model_type and PATCHED.model_type == PatchedStudentConfig.model_type
    assert list(ARCHITECTURES) == ["flat", "patched"]


def test_no_module_outside_an_architectures_own_names_it():
    """Names and model types are spelled in the architecture's module; the rest asks the registry."""
    spelled = {a.name for a in ARCHITECTURES.values()} | {a.model_type for a in ARCHITECTURES.values()}
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}"
        for package in ("students", "bytedistill")
        for path in sorted((ROOT / package).rglob("*.py"))
        if str(path.relative_to(ROOT)) not in OWN_MODULES
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in spelled
    ]
    assert not found, found


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setitem(ARCHITECTURES, TOY.name, TOY)  # the one registry line


@pytest.mark.slow
def test_a_toy_architecture_trains_exports_and_scores(toy_registered, tmp_path, llama3_tokenizer_path):
    from students.release.export import export_student
    from students.release.exported_folder import load_model
    from students.release.score import ScoreOptions, score
    from students.release.trained_student import load_student, resolve_checkpoint
    from students.training.synthetic import SYNTHETIC_SOURCE
    from students.training.trainer import train
    from tests.tiny_student import tiny_config

    run = tmp_path / "run"
    train(tiny_config(run, architecture="toy", max_steps=3, eval_store="eval"), SYNTHETIC_SOURCE)
    info = json.loads((run / "run_info.json").read_text())
    assert info["student"]["architecture"] == "toy" and info["student"]["local_layers"] == 0

    folder = export_student(run, tmp_path / "export", teacher_tokenizer=llama3_tokenizer_path)
    assert json.loads((folder / "config.json").read_text())["model_type"] == TOY.model_type
    card = (folder / "README.md").read_text()
    assert "toy bigram architecture" in card and "| architecture | toy |" in card

    model = load_model(folder)  # AutoModelForCausalLM, trust_remote_code=False: the toy's own class
    assert isinstance(model, ToyBigram)
    ids = torch.tensor([[257, 72, 105, 256, 32]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, load_student(resolve_checkpoint(run))(ids).logits)

    (tmp_path / "text.txt").write_text("In the beginning God created the heaven and the earth.")
    total = score(folder, [tmp_path / "text.txt"], ScoreOptions(progress=False))[-1]
    assert total.bytes > 0 and math.isfinite(total.student_bpb)
