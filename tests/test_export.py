"""Export: a trained student becomes a folder transformers loads as-is; generate; model card snippet."""

import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from distill.alphabet import EOT
from distill.cli import main as cli_main
from distill.errors import UserError
from students.export import export_student, load_student, resolve_checkpoint
from students.generate import GenerateOptions, generate_bytes, generate_text
from students.synthetic import SYNTHETIC_SOURCE
from students.trainer import TrainConfig, train


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    config = TrainConfig(
        train_stores=["train"], eval_store="eval", output_dir=str(out), preset="tiny", hidden_size=32,
        num_layers=2, num_heads=2, intermediate_size=64, seq_len=16, batch_size=2, max_steps=3,
        eval_every=0, checkpoint_every=0, progress=False,
    )
    train(config, SYNTHETIC_SOURCE)
    return out


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    return export_student(trained, tmp_path_factory.mktemp("hf") / "student", repo_id="me/byte-student")


def test_folder_loads_with_auto_classes_and_logits_match(trained, exported):
    names = {p.name for p in exported.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "README.md"} <= names
    model = AutoModelForCausalLM.from_pretrained(exported)
    reference = load_student(resolve_checkpoint(trained))
    ids = torch.tensor([[257, 72, 105, 256, 32, 0xE4, 0xB8, 0x96, 256]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
    assert model.generation_config.eos_token_id == 258 and model.generation_config.pad_token_id == 259
    assert AutoTokenizer.from_pretrained(exported)("ab").input_ids == [257, 97, 98]


def test_generate_drops_eot(exported):
    tokenizer = AutoTokenizer.from_pretrained(exported)

    class StreamModel:  # generates the symbols of a stream: bytes with <eot> marks, then <eos>
        def generate(self, input_ids, **kwargs):
            stream = [0xE4, 0xB8, EOT, 0x96, 0x21, EOT, 0x21, EOT, 258]
            return torch.cat([input_ids, torch.tensor([stream])], dim=1)

    assert generate_bytes(StreamModel(), tokenizer, "Hi", GenerateOptions(max_new_bytes=3)) == "世".encode()
    assert generate_bytes(StreamModel(), tokenizer, "Hi", GenerateOptions(max_new_bytes=9)) == "世!!".encode()
    text = generate_text(exported, "Hi", GenerateOptions(max_new_bytes=20, seed=1))
    assert "<eot>" not in text and len(text.encode("utf-8", errors="surrogateescape")) >= 1


def test_generate_cli(exported, capsys):
    assert cli_main(["generate", str(exported), "--prompt", "ab", "--max-new-bytes", "5", "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("ab") and "<eot>" not in printed


def test_model_card_has_metadata_and_snippet_runs(exported, capsys):
    card = (exported / "README.md").read_text()
    header = card.split("---")[1]
    for key in ("license", "teacher", "training_bytes", "heldout_bpb_student", "heldout_bpb_teacher", "heldout_kl_bits_per_byte"):
        assert re.search(rf"^{key}: ", header, re.M), key
    code = re.search(r"```python\n(.*?)```", card, re.S).group(1)
    assert 'repo = "me/byte-student"' in code
    exec(code.replace('"me/byte-student"', repr(str(exported))), {})
    assert capsys.readouterr().out.startswith("The meaning of life is")


def test_export_cli_and_errors(trained, tmp_path):
    assert cli_main(["export", str(trained), str(tmp_path / "x"), "--teacher", "meta-llama/Llama-3.2-1B"]) == 0
    assert "base_model: \"meta-llama/Llama-3.2-1B\"" in (tmp_path / "x" / "README.md").read_text()
    with pytest.raises(UserError, match="neither a training checkpoint"):
        export_student(tmp_path / "nothing", tmp_path / "y")
