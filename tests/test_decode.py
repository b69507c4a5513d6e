"""The compiled decode path (``students/models/decode.py``) for both architectures: greedy, a
left-padded batch of three prompts of different lengths generates the same symbols compiled as
eagerly, the patched student's global model stepping for subsets of the rows (each row closes its
patches at its own steps); ``generate_batch`` with ``compile`` gives the eager bytes (flat); the model
card's compiled-decoding block runs on an exported patched folder loaded with its own code; and with
no working C++ compiler, generation decodes eagerly with one warning line and the same symbols."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from bytestream.alphabet import BOS, EOT, PAD
from students.models.decode import compiled_decoding, generate_compiled
from students.release.export import export_student
from students.release.generate import GenerateOptions, generate_batch
from students.training.synthetic import SYNTHETIC_SOURCE
from students.training.trainer import train
from tests.test_generation import GREEDY, PATCHED, PROMPTS, flat_model, patched_model, stream_tokenizer  # noqa: F401
from tests.tiny_student import tiny_config

pytestmark = pytest.mark.slow  # each test compiles (tens of seconds on 2 CPUs)


class StaggeredEot(LogitsProcessor):
    """Row ``r`` must place ``<eot>`` at each step ``s`` with ``(s + r) % 3 == 0`` (else the model chooses):
    rows close patches at different steps, so the global model steps for subsets of them."""

    def __init__(self, prompt_length: int):
        self.prompt_length = prompt_length

    def __call__(self, input_ids, scores):
        step = input_ids.shape[1] - self.prompt_length
        rows = (torch.arange(scores.shape[0], device=scores.device) + step) % 3 == 0
        scores = scores.clone()
        scores[rows, EOT] = scores.max() + 1.0
        return scores


@pytest.mark.parametrize("build", [flat_model, patched_model], ids=["flat", "patched"])
def test_compiled_decoding_gives_the_eager_symbols(build, stream_tokenizer):  # noqa: F811
    model = build()
    batch = dict(stream_tokenizer.prompt(PROMPTS, padding=True))
    width = batch["input_ids"].shape[1]
    healing = batch.pop("logits_processor")  # the prompts' last words, healed, then the staggered marks
    common = {
        **GREEDY,
        "suppress_tokens": [BOS, PAD],
        "logits_processor": LogitsProcessorList([*healing, StaggeredEot(width)]),
    }
    eager = model.generate(**batch, **common)
    decoding = compiled_decoding(model)
    assert decoding, "this machine has a C++ compiler: the step must compile"
    compiled = model.generate(**batch, **common, **decoding)
    assert torch.equal(compiled, eager)
    closes = (eager[:, width:] == EOT).T  # (steps, rows)
    assert bool((closes.any(1) & ~closes.all(1)).any()), "some step closes patches for a subset of the rows"
    compiled_parts = getattr(model, "_compiled_steps", None) if build is patched_model else model._compiled_call
    assert compiled_parts, "generate ran the compiled step"
    if build is patched_model:  # each row kept its own global steps and entries, whichever rows closed with it
        caches = [
            model.generate(**batch, **common, **options, return_dict_in_generate=True).past_key_values
            for options in ({}, decoding)
        ]
        lengths = caches[0].global_steps()
        assert torch.equal(caches[1].global_steps(), lengths)
        assert not any(_static(tensor) for tensor in _updated_in_place(caches[0]))
        # CUDA graphs replay a step only if what it updates in place has a static address (DESIGN, "Decoding")
        assert all(_static(tensor) for tensor in _updated_in_place(caches[1]))
        for row, length in enumerate(lengths.tolist()):
            for eager_keys, compiled_keys in zip(caches[0].global_k, caches[1].global_k):
                torch.testing.assert_close(compiled_keys[row, :, :length], eager_keys[row, :, :length])

    if build is flat_model:  # bytedistill generate --compile (the patched student's path is the same call)
        options = GenerateOptions(max_new_bytes=24, greedy=True)
        eager_bytes = generate_batch(model, stream_tokenizer, PROMPTS, options)
        options.compile = True
        assert generate_batch(model, stream_tokenizer, PROMPTS, options) == eager_bytes


def _updated_in_place(cache) -> list[torch.Tensor]:
    """Every tensor of a patched cache that a decoding step writes into."""
    state = [cache.step, cache.slot_index, cache.global_length, cache.open_sum, cache.open_count, cache.context]
    return [*state, *(tensor for ring in cache.local for tensor in ring), *cache.global_k, *cache.global_v]


def _static(tensor: torch.Tensor) -> bool:
    return getattr(tensor, "_dynamo_static_input_type", None) == "unguarded"


class EotEveryOtherStep(LogitsProcessor):
    """``<eot>`` at every other step: one row closes more patches than the first bucket of global entries."""

    def __init__(self, prompt_length: int):
        self.prompt_length = prompt_length

    def __call__(self, input_ids, scores):
        if (input_ids.shape[1] - self.prompt_length) % 2:
            scores = scores.clone()
            scores[:, EOT] = scores.max() + 1.0
        return scores


def test_one_prompt_compiled_is_one_graph_a_step_across_buckets_of_global_entries(stream_tokenizer):  # noqa: F811
    """Batch 1: every step runs ``whole_step`` (no row or every row closes), its global step reading
    a power-of-two bucket of the cache's entries; past the first bucket (64 entries) the next one
    compiles, and the symbols stay the eager ones."""
    model = patched_model()
    batch = dict(stream_tokenizer.prompt(PROMPTS[0]))
    width = batch["input_ids"].shape[1]
    healing = batch.pop("logits_processor")
    common = {
        "max_new_tokens": 150,
        "do_sample": False,
        "suppress_tokens": [BOS, PAD],
        "logits_processor": LogitsProcessorList([*healing, EotEveryOtherStep(width)]),
    }
    eager = model.generate(**batch, **common)
    torch._dynamo.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled = model.generate(**batch, **common, **compiled_decoding(model))
    assert torch.equal(compiled, eager)
    assert int(model.closes(eager).sum()) > 64 + 8, "the global step read more than the first bucket"
    new_graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs
    assert new_graphs == 3, "whole_step, once with no row closing and once for each of two buckets"


def test_without_a_cxx_compiler_generation_decodes_eagerly(stream_tokenizer, capsys):  # noqa: F811
    model = flat_model()
    batch = stream_tokenizer.prompt(PROMPTS, padding=True)
    common = {**GREEDY, "suppress_tokens": [BOS, PAD]}
    eager = model.generate(**batch, **common)
    torch._dynamo.reset()
    with torch._inductor.config.patch({"cpp.cxx": ("/nonexistent/g++",), "force_disable_caches": True}):
        output = generate_compiled(model, **batch, **common)
    assert torch.equal(output, eager)
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and warning[0].startswith("warning: decoding eagerly: compiling the step failed")


@pytest.fixture(scope="module")
def patched_folder(tmp_path_factory, llama3_tokenizer_path):
    root = tmp_path_factory.mktemp("patched")
    train(tiny_config(root / "run", max_steps=1, **PATCHED), SYNTHETIC_SOURCE)
    return export_student(root / "run", root / "model", teacher_tokenizer=llama3_tokenizer_path)


def test_the_cards_compiled_decoding_runs_as_it_says(patched_folder):
    """The card's usage, then its compiled-decoding block, on the patched folder loaded with the
    folder's own code: the compiled output is the eager greedy one."""
    card = (patched_folder / "README.md").read_text()
    usage, compiled_block = re.findall(r"```python\n(.*?)```", card, re.DOTALL)[:2]
    assert "cache_implementation" in compiled_block
    namespace: dict = {}
    exec(re.sub(r'repo = "[^"]*"', f"repo = {str(patched_folder)!r}", usage), namespace)  # noqa: S102 - the card's own code
    exec(compiled_block, namespace)  # noqa: S102
    model, tokenizer = namespace["model"], namespace["tokenizer"]
    assert type(model).__name__ == "PatchedStudent"  # the folder's class (or the library's, once registered)
    eager = model.generate(**tokenizer.prompt("The meaning of life is"), max_new_tokens=200, do_sample=False)
    assert torch.equal(namespace["output"], eager)
    assert model._compiled_steps
