"""The ONNX Runtime decode step that benchmarks/serve.py measures beside the engine: the exported
step, run on ONNX Runtime over its own caches, gives the model's own logits at every position
(rows at different positions, grouped key/value heads), and its replay decodes what it is given."""

import numpy as np
import pytest
import torch

from benchmarks.onnx_step import OnnxDecoder, export_step
from students.models.llama import build_student, student_config


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    config = student_config(
        "tiny", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64, max_positions=64
    )
    model = build_student(config, seed=0).eval()
    return model, export_step(model, tmp_path_factory.mktemp("onnx") / "step.onnx")


def random_text(model, seed: int, length: int) -> tuple[torch.Tensor, np.ndarray]:
    """Two rows of ``length`` random symbols and the model's own logits over them."""
    symbols = torch.randint(0, model.config.vocab_size, (2, length), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return symbols, model(input_ids=symbols).logits.numpy()


def test_each_step_gives_the_model_logits(exported):
    model, path = exported
    symbols, reference = random_text(model, 1, 12)
    decoder = OnnxDecoder(model, path, batch=2)
    prompt = 5
    logits = decoder.prefill(symbols[:, :prompt])
    np.testing.assert_allclose(logits, reference[:, prompt - 1], rtol=1e-4, atol=1e-5)
    for position in range(prompt, symbols.shape[1]):
        positions = np.full(2, position, dtype=np.int64)
        logits = decoder.step(symbols[:, position].numpy(), positions, position)
        np.testing.assert_allclose(logits, reference[:, position], rtol=1e-4, atol=1e-5)


def test_rows_at_different_positions(exported):
    """A row's later cache entries are masked: a row at position 6 reading 9 entries sees only its 6."""
    model, path = exported
    symbols, reference = random_text(model, 2, 10)
    decoder = OnnxDecoder(model, path, batch=2)
    decoder.prefill(symbols[:, :9])
    positions = np.array([9, 6], dtype=np.int64)
    ids = symbols[[0, 1], [9, 6]].numpy()
    logits = decoder.step(ids, positions, 9)
    np.testing.assert_allclose(logits[0], reference[0, 9], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(logits[1], reference[1, 6], rtol=1e-4, atol=1e-5)


def test_replay_takes_time_and_the_given_symbols(exported):
    model, path = exported
    decoder = OnnxDecoder(model, path, batch=1)
    prompts = torch.tensor([[3, 4, 5]])
    targets = torch.tensor([[6, 7, 8, 9]])
    assert decoder.replay(prompts, targets, 4) > 0
    # the replayed symbols went into the caches: the next step matches the model on the whole text
    with torch.no_grad():
        reference = model(input_ids=torch.tensor([[3, 4, 5, 6, 7, 8, 9]])).logits.numpy()
    logits = decoder.step(np.array([9]), np.array([6], dtype=np.int64), 6)
    np.testing.assert_allclose(logits[0], reference[0, 6], rtol=1e-4, atol=1e-5)
