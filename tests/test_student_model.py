"""Student presets: stock Llama configs over the 260-symbol alphabet that AutoModelForCausalLM loads."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from bytestream.alphabet import ALPHABET_SIZE, BOS, EOS, PAD
from common.errors import UserError
from students.models.llama import PRESETS, build_student, count_parameters, student_config


@pytest.mark.parametrize(
    "preset,low,high",
    [
        ("tiny", 0.5e6, 1.5e6),
        ("small", 4e6, 6e6),
        ("base", 20e6, 30e6),
        ("medium", 90e6, 120e6),
        ("large", 350e6, 450e6),
        ("xl", 0.9e9, 1.2e9),
    ],
)
def test_preset_sizes(preset, low, high):
    with torch.device("meta"):
        model = build_student(student_config(preset))
    assert low <= count_parameters(model) <= high


def test_overrides_and_special_ids():
    config = student_config(
        "tiny",
        hidden_size=64,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=96,
        max_positions=4096,
        rope_theta=5e5,
    )
    assert (config.vocab_size, config.bos_token_id, config.eos_token_id, config.pad_token_id) == (
        ALPHABET_SIZE,
        BOS,
        EOS,
        PAD,
    )
    assert (config.hidden_size, config.num_hidden_layers, config.num_key_value_heads) == (64, 3, 2)
    assert config.max_position_embeddings == 4096 and config.rope_parameters["rope_theta"] == 5e5
    with pytest.raises(UserError, match="unknown student preset"):
        student_config("huge")
    with pytest.raises(UserError, match="not divisible"):
        student_config("tiny", hidden_size=100, num_heads=3)
    assert set(PRESETS) >= {"tiny", "small", "base", "medium", "large", "xl"}


def test_auto_classes_load_a_saved_student(tmp_path):
    model = build_student(
        student_config("tiny", hidden_size=32, num_layers=1, num_heads=2, intermediate_size=32), seed=0
    )
    model.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).model_type == "llama"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.tensor([[BOS, 104, 105, 256]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def _rounded(count: int) -> str:
    """A parameter count as --help writes it: three significant figures, M or B."""
    return f"{count / 1e9:.3g}B" if count >= 1e9 else f"{count / 1e6:.3g}M"


@pytest.mark.parametrize("preset", list(PRESETS))
def test_the_help_states_every_presets_parameters(preset):
    """`train --help` lists each preset's parameters, flat / patched: built on the meta device here."""
    from students.models.architectures import architecture_named
    from students.models.shape import PRESET_HELP, StudentShape

    counts = []
    for architecture in ("flat", "patched"):
        with torch.device("meta"):
            shape = StudentShape(architecture=architecture, preset=preset, stream="fused")
            model = architecture_named(architecture).build(shape, seq_len=256, seed=0)
        counts.append(_rounded(count_parameters(model)))
    assert f"{preset} {counts[0]} / {counts[1]}" in PRESET_HELP
