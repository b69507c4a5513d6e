"""Behaviour pinned by recorded hashes: a dump's content hash and a few training steps' weights.

The values were recorded before the code was rearranged into its current layout (docs/DESIGN.md,
"Layout") and must not change when code only moves: a rearrangement that changes a stored byte or a
trained weight is a change of behaviour. One torch thread, so that sums are added in one order.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file

from bytedistill.cli import main as bytedistill
from logit_store import LogitStore, store_content_hash
from tests.teachers import dump_args, save_tiny_llama3_teacher

TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "Grüße aus Köln 🙂 — 東京, naïve café",
    "def f(x):\n    return x * 2\n" * 3,
    "And the evening and the morning were the first day. " * 4,
]

RECORDED = {
    "store pow8-ans": "0c78b9aff347b3dd343eef72d7a1924899fd5d184cd9903f083d594078e54c67",
    "store float16": "ace9596c6bce8f6aa96789bada219dde037e9bb6d2a23204a41a390032be0327",
    "weights flat": "85c96dac4d437ebf67e35a4ce3893bbd41554ac237e76737becf2b21bd7344e0",
    "weights patched": "a8d5ec07274cccb3111268ece1d0e964c0ebaee0b65a455b2485644e959ebc24",
}


def weights_hash(run_dir) -> str:
    (checkpoint,) = sorted(run_dir.glob("checkpoints/step-*"))[-1:]
    tensors = load_file(next(checkpoint.glob("*.safetensors")))
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode() + tensors[name].contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_dump_and_training_reproduce_the_recorded_hashes(tmp_path, llama3_tokenizer_path, one_thread, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    teacher = save_tiny_llama3_teacher(tmp_path / "teacher", llama3_tokenizer_path)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": t}) for t in TEXTS))
    found = {}
    for encoding in ("pow8-ans", "float16"):
        store = tmp_path / f"store-{encoding}"
        assert bytedistill(dump_args(teacher, corpus, store, "--encoding", encoding)) == 0
        found[f"store {encoding}"] = store_content_hash(LogitStore(store))
    for architecture in ("flat", "patched"):
        run = tmp_path / f"run-{architecture}"
        args = ["train", "--train-stores", str(tmp_path / "store-pow8-ans"), "--output-dir", str(run)]
        args += ["--architecture", architecture, "--preset", "tiny", "--seq-len", "64", "--batch-size", "2"]
        args += ["--max-steps", "3", "--warmup-steps", "1", "--eval-every", "0", "--progress", "false"]
        assert bytedistill(args) == 0
        found[f"weights {architecture}"] = weights_hash(run)
    assert found == RECORDED
