"""``train --init-from``: a new run starts from a trained student's weights (a run directory, a
checkpoint or an exported folder) with a fresh optimiser, schedule and counters; a student of other
settings, and a resume that names another start, are refused in one line leaving nothing behind."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bytedistill.cli import main as bytedistill
from common.errors import UserError
from students.models.architectures import architecture_named
from students.release.trained_student import load_student
from students.training.checkpoints import latest_checkpoint
from students.training.init_from import load_initial_weights
from students.training.synthetic import SYNTHETIC_SOURCE
from students.training.trainer import settle, train
from tests.tiny_student import tiny_config

FAST = {"warmup_steps": 2, "lr": 3e-3, "eval_store": "eval", "eval_bytes": 0}


def _config(out: Path, **overrides):
    return tiny_config(out, **{**FAST, **overrides})


def _evals(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A finished run of 6 steps: the student the new runs start from."""
    out = tmp_path_factory.mktemp("init") / "source"
    train(_config(out, max_steps=6), SYNTHETIC_SOURCE)
    return out


def test_a_new_run_starts_from_exactly_the_sources_weights(tmp_path, source):
    checkpoint = latest_checkpoint(source)
    exported = tmp_path / "exported"
    load_student(checkpoint).save_pretrained(exported)  # what export writes of the model: config.json + weights
    # the model the run builds holds the checkpoint's tensors before its first step, whatever its seed
    plan = settle(_config(tmp_path / "probe", max_steps=2, seed=7, init_from=str(source)))
    model = architecture_named("flat").build(plan.config.student, seq_len=16, seed=7)
    load_initial_weights(model, plan.init_from)
    saved = load_file(checkpoint / "model.safetensors")
    assert saved and all(torch.equal(model.state_dict()[name], tensor) for name, tensor in saved.items())
    # and its step-0 evaluation is the source's last, from a run directory, a checkpoint or an export
    last = _evals(source)[-1]
    assert last["step"] == 6
    for name, given in (("run", source), ("checkpoint", checkpoint), ("exported", exported)):
        out = tmp_path / name
        result = train(_config(out, max_steps=2, seed=3, init_from=str(given)), SYNTHETIC_SOURCE)
        evals = _evals(out)
        assert evals[0]["step"] == 0 and evals[0]["train_bytes"] == 0, name
        assert evals[0]["student_bpb"] == last["student_bpb"], name
        assert result.step == 2 and sorted(result.losses) == [1, 2]  # fresh counters
        info = json.loads((out / "run_info.json").read_text())
        recorded = checkpoint if name != "exported" else exported
        assert info["init_from"] == {"path": str(recorded.resolve()), "step": 6 if name != "exported" else None}


def _refused(config, match: str) -> None:
    with pytest.raises(UserError, match=match):
        train(config, SYNTHETIC_SOURCE)
    assert not Path(config.output_dir).exists()  # nothing left behind


def test_a_student_of_other_settings_is_refused(tmp_path, source):
    _refused(
        _config(tmp_path / "a", max_steps=2, init_from=str(source), hidden_size=48), "hidden_size: 32 there, 48 here"
    )
    _refused(_config(tmp_path / "b", max_steps=2, init_from=str(source), seq_len=32), "max_position_embeddings")
    _refused(
        _config(tmp_path / "c", max_steps=2, init_from=str(source), architecture="patched"),
        "holds a flat student, and this run is --architecture patched",
    )
    _refused(
        _config(tmp_path / "d", max_steps=2, init_from=str(source), stream="fused"),
        "student of the <eot> stream, and this run reads the fused stream",
    )
    _refused(_config(tmp_path / "e", max_steps=2, init_from=str(tmp_path)), "neither a training output directory")
    before = sorted(p.relative_to(source) for p in source.rglob("*"))
    with pytest.raises(UserError, match="is inside --output-dir"):  # --overwrite would remove it
        train(_config(source, max_steps=2, init_from=str(source), overwrite=True), SYNTHETIC_SOURCE)
    assert sorted(p.relative_to(source) for p in source.rglob("*")) == before


def test_the_cli_refuses_in_one_line(tmp_path, source, capsys):
    out = tmp_path / "run"
    args = ["train", "--train-stores", str(tmp_path / "no-store"), "--output-dir", str(out), "--max-steps", "2"]
    assert bytedistill([*args, "--init-from", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bytedistill train: error: --init-from") and "\n" not in err
    assert not out.exists()


def test_a_resume_continues_its_own_start_and_refuses_another(tmp_path, source):
    out = tmp_path / "second"
    # a job script's line, given every time: the first starts the run from the source, later ones continue it
    config = _config(out, max_steps=4, checkpoint_every=1, init_from=str(source), resume="latest")
    first = train(dataclasses.replace(config, stop_at_step=2), SYNTHETIC_SOURCE)
    assert first.step == 2 and _evals(out)[0]["student_bpb"] == _evals(source)[-1]["student_bpb"]
    resumed = train(config, SYNTHETIC_SOURCE)
    assert resumed.step == 4 and sorted(resumed.losses) == [3, 4]
    assert json.loads((out / "run_info.json").read_text())["init_from"]["step"] == 6
    # another start, or a start given to a run that began from fresh weights: ambiguous, refused
    other = tmp_path / "other"
    train(_config(other, max_steps=1, seed=1), SYNTHETIC_SOURCE)
    with pytest.raises(UserError, match="started from .*step-00000006, not --init-from"):
        train(dataclasses.replace(config, max_steps=5, resume="latest", init_from=str(other)), SYNTHETIC_SOURCE)
    with pytest.raises(UserError, match="started from fresh weights"):
        train(_config(other, max_steps=2, resume="latest", init_from=str(source)), SYNTHETIC_SOURCE)
    # dropping --init-from continues the run, which keeps the record of its start
    train(dataclasses.replace(config, max_steps=5, resume="latest", init_from=None), SYNTHETIC_SOURCE)
    assert json.loads((out / "run_info.json").read_text())["init_from"]["step"] == 6
