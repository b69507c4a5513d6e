"""Training's memory estimate (students/training/memory.py): what it refuses, and the setting it names."""

from __future__ import annotations

import dataclasses

import pytest

from students.models.shape import StudentShape
from students.training.batch_source import BatchConfig
from students.training.memory import memory_terms, over_budget
from students.training.train_config import TrainConfig

GB = 10**9
CPU_8GB = ("cpu", 8 * GB, None)


def config(architecture: str = "flat", preset: str = "micro", **sizes) -> TrainConfig:
    batches = {k: sizes.pop(k) for k in ("seq_len", "batch_size", "num_workers") if k in sizes}
    return TrainConfig(
        train_stores=["s"],
        output_dir="o",
        max_steps=1,
        student=StudentShape(stream="fused", architecture=architecture, preset=preset, **sizes),
        batches=BatchConfig(**batches),
    )


@pytest.mark.parametrize("architecture", ["flat", "patched"])
def test_the_presets_a_cpu_trains_fit_and_the_terms_grow_with_their_settings(architecture):
    for preset in ("micro", "tiny", "small", "base"):
        assert over_budget(config(architecture, preset), 515, CPU_8GB) is None, preset
    small, wide = memory_terms(config(architecture), 515), memory_terms(config(architecture, hidden_size=256), 515)
    assert wide[0].bytes > small[0].bytes and wide[1].bytes > small[1].bytes
    longer = memory_terms(config(architecture, seq_len=2048), 515)
    assert all(b.bytes > a.bytes for a, b in zip(small[1:], longer[1:]))


@pytest.mark.parametrize(
    "sizes, named",
    [
        ({"num_layers": 2**62}, f"lower --num-layers ({2**62})"),
        ({"num_layers": 100_000}, "lower --num-layers (100000)"),
        ({"hidden_size": 1_000_000}, "lower --hidden-size (1000000)"),
        ({"seq_len": 10**10}, "lower --seq-len (10000000000)"),
        ({"batch_size": 10**10}, "lower --batch-size (10000000000)"),
        ({"batch_size": 4096, "seq_len": 4096}, "lower --batch-size (4096)"),
    ],
)
def test_a_size_that_cannot_fit_is_refused_naming_the_setting(sizes, named):
    problem = over_budget(config(**sizes), 515, CPU_8GB)
    assert problem is not None and problem.endswith(named) and "cpu has 8.00 GB" in problem


def test_a_preset_too_large_at_its_defaults_names_the_preset_or_the_batch():
    assert over_budget(config(preset="xl"), 515, ("cpu", 4 * GB, None)).endswith("choose a smaller --preset than xl")
    assert over_budget(config(preset="xl"), 515, ("cpu", 20 * GB, None)).endswith(
        "lower --batch-size (16) or --seq-len (512)"
    )


def test_on_a_gpu_the_batches_count_against_the_host():
    big_batches = dataclasses.replace(config(), batches=BatchConfig(num_workers=1000))
    terms = memory_terms(big_batches, 515)
    host_only = sum(t.bytes for t in terms if not t.on_device)
    device_only = sum(t.bytes for t in terms if t.on_device)
    assert over_budget(big_batches, 515, ("cuda", device_only + 1, host_only + 1)) is None
    assert "lower --num-workers (1000)" in over_budget(big_batches, 515, ("cuda", device_only + 1, host_only // 2))
