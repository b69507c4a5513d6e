"""The trainer: on a synthetic bigram teacher (students.training.synthetic) for the loop's logic, and on
real logit stores for data loading with workers, resume, several processes and mixed precision."""

import dataclasses
import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from common.errors import UserError
from configs.fields import flat_values
from students.training.checkpoints import checkpoint_dir, latest_checkpoint
from students.training.optim import OptimConfig, check_schedule, learning_rate, warmup_steps
from students.training.synthetic import SYNTHETIC_SOURCE
from students.training.trainer import TrainConfig, train
from tests.configs import parse_config
from tests.launch import cpu_launch, run_on_two_machines
from tests.stores import random_texts, write_random_store
from tests.tiny_student import tiny_config

FAST = {"warmup_steps": 2, "lr": 3e-3}  # short runs that still learn


def _config(out: Path, **overrides) -> TrainConfig:
    return tiny_config(out, **{**FAST, **overrides})


def test_resumed_run_equals_uninterrupted_run(tmp_path, caplog):
    # 2 micro-batches per step, 16 batches per epoch: step 12 crosses an epoch boundary
    common = {"max_steps": 12, "grad_accum": 2}
    caplog.set_level("WARNING")
    full = train(_config(tmp_path / "full", **common), SYNTHETIC_SOURCE)
    assert "Removed shared tensor" not in caplog.text  # the tied output layer is saved once, as intended
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
    config = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=10)
    assert learning_rate(config, 5, 0.05) == pytest.approx(
        0.5 * (0.1 + 0.9 * 0.5 * (1 + torch.cos(torch.tensor(0.05 * torch.pi)).item()))
    )
    assert learning_rate(config, 50, 0.0) == pytest.approx(1.0)
    assert learning_rate(config, 100, 1.0) == pytest.approx(0.1)


def test_the_warm_up_follows_the_run_unless_given():
    """Left out, the warm-up is a twentieth of --max-steps (at least 1): a short run leaves it, and the
    learning rate is at its peak (times the cosine) from then on; with only --max-train-bytes it is 100."""
    config = OptimConfig(lr=1.0, min_lr=0.0)
    assert (warmup_steps(config, 100), warmup_steps(config, 10), warmup_steps(config, None)) == (5, 1, 100)
    cosine = 0.5 * (1 + math.cos(math.pi * 0.05))
    assert learning_rate(config, 5, 0.05, max_steps=100) == pytest.approx(cosine)
    assert learning_rate(config, 2, 0.02, max_steps=100) == pytest.approx(0.4 * 0.5 * (1 + math.cos(math.pi * 0.02)))
    assert learning_rate(OptimConfig(lr=1.0, min_lr=0.0, warmup_steps=0), 1, 0.0, max_steps=100) == 1.0


def test_a_warm_up_the_run_never_leaves_or_a_long_one_is_warned_about():
    never = check_schedule(OptimConfig(lr=3e-3, warmup_steps=100), 60)
    assert never.startswith("warning: --warmup-steps 100 is more than --max-steps 60: the learning rate never")
    assert "(it ends at 60% of it)" in never
    assert check_schedule(OptimConfig(warmup_steps=80), 100).startswith(
        "warning: --warmup-steps 80 is 80% of --max-steps 100"
    )
    assert check_schedule(OptimConfig(warmup_steps=50), 100) is None and check_schedule(OptimConfig(), 10) is None
    assert check_schedule(OptimConfig(warmup_steps=500), None) is None  # a length in bytes: nothing to compare


def test_config_from_flags_and_file(tmp_path):
    (tmp_path / "c.yaml").write_text("train_stores: [a, b]\nmax-steps: 7\nalpha: 0.5\n")
    config = parse_config(TrainConfig, ["--config", str(tmp_path / "c.yaml"), "--output-dir", "o", "--alpha", "0.25"])
    assert config.train_stores == ["a", "b"] and config.max_steps == 7 and config.loss.alpha == 0.25
    with pytest.raises(UserError, match="max-steps or --max-train-bytes"):
        TrainConfig(train_stores=["a"], output_dir="o")
    with pytest.raises(UserError, match="--max-steps must be at least 1, got -3"):  # not 0 steps and exit 0
        TrainConfig(train_stores=["a"], output_dir="o", max_steps=-3)


# ------------------------------------------------------------------------------ on real stores


@pytest.fixture(scope="module")
def stores(tmp_path_factory, llama3_vocab, llama3_converter, llama3_encoder):
    root = tmp_path_factory.mktemp("stores")
    helpers = (llama3_vocab, llama3_converter, llama3_encoder)
    train_store = write_random_store(root / "train", *helpers, random_texts(40, seed=1))
    eval_store = write_random_store(root / "eval", *helpers, random_texts(9, seed=2), seed=9)
    return str(train_store), str(eval_store)


def _store_config(out: Path, stores, **overrides) -> TrainConfig:
    on_stores = {
        "train_stores": [stores[0]],
        "eval_store": stores[1],
        "seq_len": 64,
        "batch_size": 4,
        "grad_accum": 4,
        "num_workers": 2,
        "max_steps": 8,
        "eval_every": 4,
        "eval_bytes": 0,
        "checkpoint_every": 3,
    }
    return _config(out, **{**on_stores, **overrides})


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_store_run_with_workers_killed_and_resumed_equals_uninterrupted(tmp_path, stores):
    full = train(_store_config(tmp_path / "full", stores))
    first = train(_store_config(tmp_path / "parts", stores, stop_at_step=5))
    assert first.step == 5 and [m["step"] for m in _metrics(tmp_path / "parts")] == [0, 4]
    # killed while writing the step-5 checkpoint: step 3's is the latest, step 4's evaluation is on record
    shutil.rmtree(checkpoint_dir(tmp_path / "parts", 5))
    with pytest.raises(UserError, match="batch_size: checkpoint 4, now 2"):
        train(_store_config(tmp_path / "parts", stores, resume="latest", batch_size=2))
    second = train(_store_config(tmp_path / "parts", stores, resume="latest"))
    assert sorted(second.losses) == list(range(4, 9))  # 28 batches an epoch: step 7 crosses into epoch 1
    for step in second.losses:
        assert second.losses[step] == pytest.approx(full.losses[step], abs=1e-6), step
    assert second.train_bytes == full.train_bytes
    assert json.loads((second.checkpoint / "data_position_rank0.json").read_text()) == {"epoch": 1, "batches": 4}
    resumed, uninterrupted = _metrics(tmp_path / "parts"), _metrics(tmp_path / "full")
    assert [m["step"] for m in resumed] == [m["step"] for m in uninterrupted] == [0, 4, 8]
    for a, b in zip(resumed, uninterrupted):
        assert a["student_bpb"] == pytest.approx(b["student_bpb"], abs=1e-6)


def test_eval_store_of_another_teacher_is_refused(tmp_path, stores, llama3_vocab, llama3_converter, llama3_encoder):
    other_vocab = dataclasses.replace(llama3_vocab, adds_prefix_space=True)  # another vocabulary hash
    texts = random_texts(2, seed=3)
    other = write_random_store(tmp_path / "other", other_vocab, llama3_converter, llama3_encoder, texts)
    with pytest.raises(UserError, match="--eval-store .*other was dumped with another vocabulary"):
        train(_store_config(tmp_path / "out", stores, eval_store=str(other), num_workers=0, max_steps=2))


@pytest.fixture
def reset_accelerate():
    """accelerate keeps one process-wide state, fixed by the first Accelerator; a test that changes
    the mixed precision clears it (a real run is one process with one precision)."""
    from accelerate.state import AcceleratorState

    def reset() -> None:
        AcceleratorState._reset_state(reset_partial_state=True)

    reset()
    yield reset
    reset()


def test_bf16_autocast_trains_with_float32_loss(tmp_path, stores, reset_accelerate):
    common = {
        "max_steps": 4,
        "grad_accum": 1,
        "eval_every": 0,
        "num_workers": 0,
        "checkpoint_every": 0,
        "eval_store": None,
    }
    exact = train(_store_config(tmp_path / "fp32", stores, **common))
    reset_accelerate()
    mixed = train(_store_config(tmp_path / "bf16", stores, mixed_precision="bf16", **common))
    for step, loss in mixed.losses.items():
        assert loss == pytest.approx(exact.losses[step], rel=0.05)
    assert any(mixed.losses[s] != exact.losses[s] for s in mixed.losses)  # the forward really ran in bf16


def _train_cli_args(config: TrainConfig) -> list[str]:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in flat_values(config).items() if v is not None]
    stores = [a for k in config.train_stores for a in ("--train-stores", k)]
    return ["-m", "bytedistill", "train", *stores, *(f for f in flags if not f.startswith("--train-stores="))]


@pytest.mark.slow
def test_evaluation_is_the_same_with_one_and_two_processes(tmp_path, stores):
    """Two processes (``accelerate launch``, gloo ranks on the CPU) train, evaluate and checkpoint
    each rank's data position and random state, and evaluate as one process does; two machines of
    one process each (``--num_machines 2``, machine ranks 0 and 1) train the very weights of two
    processes on one."""
    flags = {"max_steps": 4, "eval_every": 2, "checkpoint_every": 2, "num_workers": 0, "batch_size": 3}
    train(_store_config(tmp_path / "one", stores, **flags))
    launch, env = cpu_launch(2)
    cmd = launch + _train_cli_args(_store_config(tmp_path / "two", stores, **flags))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [m["step"] for m in _metrics(tmp_path / "two")] == [0, 2, 4]
    final = latest_checkpoint(tmp_path / "two")
    assert {"data_position_rank0.json", "data_position_rank1.json", "model.safetensors"} <= {
        p.name for p in final.iterdir()
    }
    assert (final / "random_states_1.pkl").is_file()  # really two ranks
    assert json.loads((final / "trainer_state.json").read_text())["train_bytes"] > 0
    run_on_two_machines(_train_cli_args(_store_config(tmp_path / "machines", stores, **flags)), cwd=tmp_path)
    on_one, on_two = (load_file(latest_checkpoint(tmp_path / n) / "model.safetensors") for n in ("two", "machines"))
    assert on_one.keys() == on_two.keys() and all(torch.equal(on_one[k], on_two[k]) for k in on_one)
    one, two = _metrics(tmp_path / "one")[0], _metrics(tmp_path / "two")[0]
    assert one["eval_bytes"] == two["eval_bytes"] > 0
    for key in ("student_bpb", "teacher_bpb", "kl_per_byte"):
        assert two[key] == pytest.approx(one[key], abs=1e-6), key
