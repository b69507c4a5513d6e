"""The README pipeline end to end through the CLI, on a tiny random teacher."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from bytedistill.cli import main as bytedistill
from logit_store import LogitStore
from tests.teachers import dump_args, save_tiny_llama3_teacher

TRAIN = [
    "In the beginning God created the heaven and the earth.",
    "And God said, Let there be light: and there was light.",
    "Grüße aus Köln 🙂 — 東京",
    "def f(x):\n    return x * 2\n",
]
HELDOUT = ["And the evening and the morning were the first day."]


@pytest.mark.slow
def test_dump_train_export_generate_push(tmp_path, llama3_tokenizer_path, capsys):
    teacher = save_tiny_llama3_teacher(tmp_path / "teacher", llama3_tokenizer_path)
    for name, docs in (("train", TRAIN), ("heldout", HELDOUT)):
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in docs))
        assert bytedistill(dump_args(teacher, tmp_path / f"{name}.jsonl", tmp_path / "store" / name)) == 0
        assert bytedistill(["verify", str(tmp_path / "store" / name)]) == 0
    assert len(LogitStore(tmp_path / "store/train")) == len(TRAIN)

    config = tmp_path / "train.yaml"  # options from a file, as a user would keep them
    config.write_text(
        f"train_stores: [{tmp_path / 'store/train'}]\neval_store: {tmp_path / 'store/heldout'}\n"
        "preset: tiny\nseq_len: 64\nbatch_size: 4\nmax_steps: 6\nwarmup_steps: 2\neval_every: 3\n"
    )
    assert (
        bytedistill(
            ["train", "--config", str(config), "--output-dir", str(tmp_path / "student"), "--progress", "false"]
        )
        == 0
    )
    metrics = [json.loads(line) for line in (tmp_path / "student/metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 3, 6]
    assert all(m["student_bpb"] > 0 and m["teacher_bpb"] > 0 for m in metrics)

    model_dir = tmp_path / "model"
    assert bytedistill(["export", str(tmp_path / "student"), str(model_dir)]) == 0
    assert {"config.json", "model.safetensors", "generation_config.json", "README.md"} <= {
        p.name for p in model_dir.iterdir()
    }
    AutoModelForCausalLM.from_pretrained(model_dir)
    AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)

    capsys.readouterr()
    assert bytedistill(["generate", str(model_dir), "--prompt", "In the", "--max-new-bytes", "20", "--seed", "1"]) == 0
    assert capsys.readouterr().out.startswith("In the")
    assert bytedistill(["push", str(model_dir), "me/tiny-byte-student", "--dry-run"]) == 0
    assert "model.safetensors" in capsys.readouterr().out
