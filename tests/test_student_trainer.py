"""The trainer on a synthetic bigram teacher (students.synthetic): no logit store needed."""

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from distill.config import add_config_arguments, config_from_args
from distill.errors import UserError
from students.synthetic import SYNTHETIC_SOURCE
from students.checkpoints import latest_checkpoint
from students.trainer import TrainConfig, learning_rate, train
from tests.launch import cpu_launch

TINY = dict(
    preset="tiny", hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
    seq_len=16, batch_size=2, progress=False, warmup_steps=2, lr=3e-3,
)


def _config(out: Path, **overrides) -> TrainConfig:
    values = dict(TINY, train_stores=["train"], output_dir=str(out), checkpoint_every=0, eval_every=0)
    values.update(overrides)
    return TrainConfig(**values)


def test_resumed_run_equals_uninterrupted_run(tmp_path):
    # 2 micro-batches per step, 16 batches per epoch: step 12 crosses an epoch boundary
    common = dict(max_steps=12, grad_accum=2)
    full = train(_config(tmp_path / "full", **common), SYNTHETIC_SOURCE)
    first = train(_config(tmp_path / "parts", stop_at_step=5, **common), SYNTHETIC_SOURCE)
    assert first.step == 5 and latest_checkpoint(tmp_path / "parts").name == "step-00000005"
    second = train(_config(tmp_path / "parts", resume="latest", **common), SYNTHETIC_SOURCE)
    assert second.step == 12 and sorted(second.losses) == list(range(6, 13))
    for step in range(6, 13):
        assert second.losses[step] == pytest.approx(full.losses[step], abs=1e-6), step
    assert second.train_bytes == full.train_bytes
    a, b = load_file(full.checkpoint / "model.safetensors"), load_file(second.checkpoint / "model.safetensors")
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_training_lowers_kl_and_writes_metrics(tmp_path):
    config = _config(tmp_path, eval_store="eval", max_steps=24, eval_every=12, batch_size=4, seq_len=32)
    result = train(config, SYNTHETIC_SOURCE)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 12, 24]
    assert {"step", "train_bytes", "student_bpb", "teacher_bpb", "kl_per_byte"} <= set(lines[0])
    assert lines[-1]["kl_per_byte"] < lines[0]["kl_per_byte"] - 0.3
    assert lines[-1]["train_bytes"] == result.train_bytes > 0
    # the teacher is the data's own distribution: student BPB - teacher BPB ~ KL per byte
    assert lines[-1]["student_bpb"] - lines[-1]["teacher_bpb"] == pytest.approx(lines[-1]["kl_per_byte"], abs=0.5)
    info = json.loads((tmp_path / "run_info.json").read_text())
    assert info["last_eval"]["step"] == 24 and info["data"]["teacher"].startswith("synthetic")
    assert list((tmp_path / "logs").rglob("events.out.tfevents.*"))


def test_baseline_trains_without_teacher_probabilities(tmp_path):
    seen = []

    def build(paths, seq_len, batch_size, **kwargs):
        seen.append(kwargs["with_teacher"])
        return SYNTHETIC_SOURCE.build(paths, seq_len, batch_size, **kwargs)

    source = type(SYNTHETIC_SOURCE)(build=build, describe=SYNTHETIC_SOURCE.describe)
    result = train(_config(tmp_path, alpha=0.0, max_train_bytes=200), source)
    assert seen == [False] and result.train_bytes >= 200


def test_schedule_warms_up_then_decays_to_min_lr():
    config = TrainConfig(train_stores=["x"], output_dir="o", max_steps=100, lr=1.0, min_lr=0.1, warmup_steps=10)
    assert learning_rate(config, 5, 0.05) == pytest.approx(0.5 * (0.1 + 0.9 * 0.5 * (1 + torch.cos(torch.tensor(0.05 * torch.pi)).item())))
    assert learning_rate(config, 50, 0.0) == pytest.approx(1.0)
    assert learning_rate(config, 100, 1.0) == pytest.approx(0.1)


def test_config_from_flags_and_file(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    add_config_arguments(parser, TrainConfig)
    (tmp_path / "c.yaml").write_text("train_stores: [a, b]\nmax-steps: 7\nalpha: 0.5\n")
    args = parser.parse_args(["--config", str(tmp_path / "c.yaml"), "--output-dir", "o", "--alpha", "0.25"])
    config = config_from_args(TrainConfig, args)
    assert config.train_stores == ["a", "b"] and config.max_steps == 7 and config.alpha == 0.25
    with pytest.raises(UserError, match="max-steps or --max-train-bytes"):
        TrainConfig(train_stores=["a"], output_dir="o")


@pytest.mark.slow
def test_two_process_cpu_accelerate_launch(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(f"""
        from students.synthetic import SYNTHETIC_SOURCE
        from students.trainer import TrainConfig, train
        config = TrainConfig(**{dict(TINY)!r}, train_stores=["train"], eval_store="eval",
                             output_dir={str(tmp_path / "out")!r}, max_steps=4, eval_every=2, checkpoint_every=2)
        train(config, SYNTHETIC_SOURCE)
    """))
    launch, env = cpu_launch(2)
    cmd = launch + [str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "out"
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 2, 4]
    final = latest_checkpoint(out)
    assert {"data_position_rank0.json", "data_position_rank1.json", "model.safetensors"} <= {p.name for p in final.iterdir()}
    assert (final / "random_states_1.pkl").is_file()  # really two ranks
    assert json.loads((final / "trainer_state.json").read_text())["train_bytes"] > 0
