"""The patched student: causal with no lookahead (``<eot>`` included), cached generation equal to
recomputing, trained by the same trainer (resume, two processes), exported with its modeling file
and scored there as train evaluates, and never confused with a flat student."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import LogitsProcessor, LogitsProcessorList

from bytestream.alphabet import BOS, EOT, PAD
from common.errors import UserError
from students.models import patched_model
from students.models.architectures import student_cost
from students.models.cost import StreamRates, summary_line
from students.models.llama import build_student, count_parameters, student_config
from students.models.patched import MODELING_FILE
from students.models.patched_model import PatchedCache, PatchedStudent, PatchedStudentConfig, _global_bucket
from students.release.export import export_student
from students.release.push import push_folder
from students.release.score import ScoreOptions, score
from students.training.checkpoints import checkpoint_dir, latest_checkpoint
from students.training.synthetic import SYNTHETIC_SOURCE
from students.training.trainer import train
from tests.launch import cpu_launch
from tests.stores import random_texts, write_random_store
from tests.test_export_push import FakeHub, hub  # noqa: F401 - the local Hub server fixture
from tests.tiny_student import TINY, tiny_config

PATCHED = {"architecture": "patched", "local_hidden_size": 16, "local_window": 6, "warmup_steps": 2, "lr": 3e-3}


def tiny_model(pooling: str = "mean", seed: int = 0) -> PatchedStudent:
    torch.manual_seed(seed)
    config = PatchedStudentConfig(
        local_hidden_size=16,
        local_heads=2,
        local_intermediate_size=32,
        local_window=6,
        global_hidden_size=32,
        global_layers=2,
        global_heads=2,
        global_intermediate_size=64,
        patch_pooling=pooling,
    )
    model = PatchedStudent(config).eval()
    torch.nn.init.normal_(model.global_down.weight, std=0.5)  # trained-like: the global output reaches the decoder
    return model


def random_stream(rows: int, length: int, seed: int, start_mid_token: bool = False) -> torch.Tensor:
    """Bytes with an ``<eot>`` every 1-6 symbols, ``<bos>`` first (or, mid-token, not)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 256, (rows, length), generator=generator)
    ids[torch.rand(rows, length, generator=generator) < 0.3] = EOT
    if not start_mid_token:
        ids[:, 0] = BOS
    return ids


@pytest.mark.parametrize("pooling", ["mean", "last"])
@pytest.mark.parametrize("start_mid_token", [False, True])
def test_no_position_reads_a_later_symbol(pooling, start_mid_token):
    model = tiny_model(pooling)
    ids = random_stream(2, 30, seed=1, start_mid_token=start_mid_token)
    with torch.no_grad():
        logits = model(ids).logits
        assert torch.isfinite(logits).all()
        for at in range(1, 30):
            for changed in (EOT, 65 if ids[0, at] != 65 else 66):  # a boundary appears / a symbol changes
                other = ids.clone()
                other[:, at] = changed
                if torch.equal(other, ids):
                    continue
                perturbed = model(other).logits
                torch.testing.assert_close(perturbed[:, :at], logits[:, :at], rtol=0, atol=1e-5)
                assert not torch.allclose(perturbed[:, at], logits[:, at], atol=1e-5)  # it does read its own


class EveryFifthIsEot(LogitsProcessor):
    """Force ``<eot>`` every fifth generated symbol so that patches close during generation."""

    def __init__(self, prompt_len: int):
        self.prompt_len = prompt_len

    def __call__(self, input_ids, scores):
        if (input_ids.shape[1] - self.prompt_len) % 5 == 4:
            scores[:, :] = -float("inf")
            scores[:, EOT] = 0.0
        return scores


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_cached_generation_equals_recomputing_every_step(pooling):
    model = tiny_model(pooling, seed=2)
    prompt = random_stream(3, 11, seed=3)  # rows close different numbers of patches
    common = {"max_new_tokens": 24, "do_sample": False, "pad_token_id": PAD, "suppress_tokens": [BOS, PAD]}
    for processors in ([], [EveryFifthIsEot(prompt.shape[1])]):
        cached = model.generate(prompt, logits_processor=LogitsProcessorList(processors), **common)
        recomputed = model.generate(prompt, use_cache=False, logits_processor=LogitsProcessorList(processors), **common)
        assert torch.equal(cached, recomputed)
    assert (cached[:, 11:] == EOT).sum() >= 12  # the global model stepped during generation
    with torch.no_grad():  # and the logits themselves, prompt in one pass then a symbol at a time
        full = model(cached).logits
        out = model(cached[:, :7], use_cache=True)
        steps = [out.logits] + [model(cached[:, i : i + 1], cache=out.cache).logits for i in range(7, cached.shape[1])]
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-5)
    closes = model.closes(cached).sum(1)
    assert out.cache.global_steps().tolist() == (closes + 1).tolist()  # one global step per patch, + the start
    assert out.cache.local[0][0].shape[2] == model.config.local_window  # local caches stay one window long


def test_batches_padded_on_the_right_or_with_an_empty_row_are_refused():
    """Left padding is generation's (tests/test_generation.py); other masks are refused, naming it."""
    model = tiny_model()
    ids = random_stream(2, 5, seed=4)
    with pytest.raises(ValueError, match="padded on the left"):
        model(ids, attention_mask=torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]))
    with pytest.raises(ValueError, match="at least one symbol"):
        model(ids, attention_mask=torch.tensor([[0, 0, 0, 0, 0], [1, 1, 1, 1, 1]]))


def test_costs_split_the_parameters_and_scale_with_patches():
    model = tiny_model()
    cost = student_cost(model)
    assert cost.global_parameters + cost.local_parameters == count_parameters(model)
    sparse, dense = StreamRates(1.25, 0.25), StreamRates(1.25, 0.5)
    assert cost.train_flops_per_symbol(dense, 64) > cost.train_flops_per_symbol(sparse, 64)
    assert cost.kv_bytes_per_byte(dense) == 2 * cost.kv_bytes_per_byte(sparse)
    assert cost.global_steps_per_byte(sparse) == 0.25


def test_the_train_line_names_only_what_the_architecture_has():
    """A patched student's line splits its parameters and gives the patch rate; a flat student has
    no local layers and reads no patches, so its line says neither."""
    rates = StreamRates(1.25, 0.25)
    patched = summary_line(student_cost(tiny_model()), rates, 64)
    assert "(global " in patched and "0.200 patches per symbol, 1.250 symbols per byte" in patched
    flat = summary_line(student_cost(build_student(student_config("tiny", max_positions=64), seed=0)), rates, 64)
    assert re.fullmatch(
        r"student: flat, [\d,]+ parameters; training FLOPs per stream symbol [\d.e+]+ "
        r"\(1\.250 symbols per byte\)",
        flat,
    ), flat
    assert "FLOPs per stream symbol unknown" not in summary_line(
        student_cost(build_student(student_config("tiny", max_positions=64), seed=0)), None, 64
    )


# ------------------------------------------------------------------------------ training


def test_patched_run_killed_and_resumed_equals_uninterrupted(tmp_path):
    common = {**PATCHED, "max_steps": 8, "checkpoint_every": 3}
    full = train(tiny_config(tmp_path / "full", **common), SYNTHETIC_SOURCE)
    train(tiny_config(tmp_path / "parts", stop_at_step=5, **common), SYNTHETIC_SOURCE)
    shutil.rmtree(checkpoint_dir(tmp_path / "parts", 5))  # killed while writing step 5's checkpoint
    with pytest.raises(UserError, match="it is a patched student, and this run is --architecture flat"):
        train(tiny_config(tmp_path / "parts", resume="latest", **{**common, "architecture": "flat"}), SYNTHETIC_SOURCE)
    second = train(tiny_config(tmp_path / "parts", resume="latest", **common), SYNTHETIC_SOURCE)
    assert sorted(second.losses) == list(range(4, 9))
    for step in second.losses:
        assert second.losses[step] == pytest.approx(full.losses[step], abs=1e-6), step
    a, b = load_file(full.checkpoint / "model.safetensors"), load_file(second.checkpoint / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    flat = tmp_path / "flat"
    train(tiny_config(flat, max_steps=1, checkpoint_every=1), SYNTHETIC_SOURCE)
    with pytest.raises(UserError, match="it is a flat student, and this run is --architecture patched"):
        train(tiny_config(flat, resume="latest", **{**common, "max_steps": 2}), SYNTHETIC_SOURCE)


@pytest.mark.slow
def test_evaluation_is_the_same_with_one_and_two_processes(tmp_path):
    settings = {**TINY, **PATCHED, "train_stores": ["train"], "eval_store": "eval", "max_steps": 1}
    train(tiny_config(tmp_path / "one", **{**PATCHED, "eval_store": "eval", "max_steps": 1}), SYNTHETIC_SOURCE)
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent(f"""
        from students.training.synthetic import SYNTHETIC_SOURCE
        from configs.fields import from_flat
        from students.training.trainer import TrainConfig, train
        train(from_flat(TrainConfig, dict(**{settings!r}, output_dir={str(tmp_path / "two")!r})), SYNTHETIC_SOURCE)
    """)
    )
    launch, env = cpu_launch(2)
    proc = subprocess.run(launch + [str(script)], capture_output=True, text=True, timeout=240, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (latest_checkpoint(tmp_path / "two") / "data_position_rank1.json").is_file()  # really two ranks
    one, two = (json.loads((tmp_path / run / "metrics.jsonl").read_text().splitlines()[0]) for run in ("one", "two"))
    assert one["eval_bytes"] == two["eval_bytes"] > 0
    for key in ("student_bpb", "teacher_bpb", "kl_per_byte"):
        assert two[key] == pytest.approx(one[key], abs=1e-6), key


# ------------------------------------------------------------------------------ export


@pytest.fixture(scope="module")
def exported(tmp_path_factory, llama3_vocab, llama3_converter, llama3_encoder, llama3_tokenizer_path):
    root = tmp_path_factory.mktemp("patched")
    helpers = (llama3_vocab, llama3_converter, llama3_encoder)
    train_store = write_random_store(root / "train", *helpers, random_texts(12, seed=1))
    eval_store = write_random_store(root / "eval", *helpers, random_texts(5, seed=2), seed=9)
    config = tiny_config(
        root / "run",
        **PATCHED,
        train_stores=[str(train_store)],
        eval_store=str(eval_store),
        eval_bytes=0,
        seq_len=32,
        max_steps=3,
    )
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        train(config)
    (root / "train.out").write_text(printed.getvalue())
    folder = export_student(root / "run", root / "model", teacher_tokenizer=llama3_tokenizer_path)
    return root, folder, eval_store


def test_train_prints_parameters_and_flops(exported):
    root = exported[0]
    line = (root / "train.out").read_text().splitlines()[0]
    assert re.fullmatch(
        r"student: patched on the <eot> stream, [\d,]+ parameters \(global [\d,]+, local [\d,]+\); training FLOPs per stream symbol "
        r"[\d.e+]+ \([\d.]+ patches per symbol, [\d.]+ symbols per byte\)",
        line,
    ), line
    info = json.loads((root / "run" / "run_info.json").read_text())
    assert info["student"]["architecture"] == "patched" and info["data"]["rates"]["patches_per_byte"] > 0
    assert info["student"]["global_parameters"] + info["student"]["local_parameters"] == info["parameters"]


def test_the_card_counts_its_threads_in_words(exported):
    card = (exported[1] / "README.md").read_text()
    count, word = re.search(r"CPU with (\d+) (\w+), caches on", card).groups()
    assert word == ("thread" if count == "1" else "threads"), card


def test_exported_folder_loads_with_remote_code_and_scores_as_train_evaluates(exported):
    root, folder, eval_store = exported
    last = json.loads((root / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    ours = score(folder, [eval_store], ScoreOptions(progress=False))[-1]
    assert ours.bytes == last["eval_bytes"] and ours.student_bpb == pytest.approx(last["student_bpb"], abs=1e-4)
    # a fresh interpreter that loads only what the folder ships (trust_remote_code), scored the same way
    code = textwrap.dedent(f"""
        import json
        from pathlib import Path
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        from students.release.score import ScoreOptions, documents, score_documents
        sources = [Path({str(eval_store)!r})]
        options = ScoreOptions(progress=False)
        total = score_documents(model, sources, list(documents(sources, None, options)), options)[-1]
        print(json.dumps({{"bpb": total.student_bpb, "bytes": total.bytes}}))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    remote = json.loads(proc.stdout.strip().splitlines()[-1])
    assert remote["bytes"] == last["eval_bytes"] and remote["bpb"] == pytest.approx(last["student_bpb"], abs=1e-4)


def test_card_names_the_architecture_and_its_costs(exported):
    card = (exported[1] / "README.md").read_text()
    assert "patched hierarchical architecture" in card and "trust_remote_code=True)  # the patched student" in card
    for row in ("large-model steps per text byte", "training FLOPs per text byte", "measured by `bytedistill export`"):
        assert row in card, row
    assert re.search(r"[\d,]+ symbols/s: \d+ greedy symbols after `<bos>`, batch 1", card)


def test_shipped_modeling_file_is_the_librarys_module_and_self_contained(exported):
    shipped = (exported[1] / MODELING_FILE).read_text()
    assert shipped == Path(patched_model.__file__).read_text()
    imported = set()
    for node in ast.walk(ast.parse(shipped)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
    assert imported <= {"__future__", "torch", "transformers"}, imported
    assert json.loads((exported[1] / "config.json").read_text())["auto_map"]["AutoModelForCausalLM"].startswith(
        MODELING_FILE.removesuffix(".py")
    )


def test_export_refuses_weights_of_the_other_architecture_naming_it(exported, tmp_path, llama3_tokenizer_path):
    root, _, _ = exported
    patched = latest_checkpoint(root / "run")
    flat = tmp_path / "flat"
    train(tiny_config(flat, max_steps=1, checkpoint_every=1), SYNTHETIC_SOURCE)
    flat = latest_checkpoint(flat)
    for weights, config, named in ((patched, flat, "a flat student"), (flat, patched, "a patched student")):
        mixed = tmp_path / f"mixed-{named[2:]}"
        shutil.copytree(weights, mixed)
        shutil.copyfile(config / "config.json", mixed / "config.json")
        with pytest.raises(UserError, match=rf"does not match its config \({named}\)"):
            export_student(mixed, tmp_path / "out", teacher_tokenizer=llama3_tokenizer_path)


def test_push_uploads_the_modeling_file(request, exported, monkeypatch):
    endpoint = request.getfixturevalue("hub")
    monkeypatch.setenv("HF_TOKEN", "hf_fake_token")
    monkeypatch.setenv("HF_ENDPOINT", endpoint)  # the Hub, as far as huggingface_hub is concerned
    push_folder(exported[1], "me/patched", endpoint=endpoint)
    (commit,) = FakeHub.commits
    assert {MODELING_FILE, "config.json", "model.safetensors"} <= set(commit["files"])


def test_a_compiled_global_step_reads_a_power_of_two_bucket_of_the_entries_in_use():
    """At least 64 entries, at most twice those in use (never the whole capacity); past the capacity
    the cache grows (doubling, to the bucket at least)."""
    model = tiny_model()
    with torch.no_grad():
        out = model(random_stream(2, 11, seed=5), cache=PatchedCache(capacity=200))
    cache, capacity = out.cache, out.cache.global_k[0].shape[2]
    assert capacity == 201
    for in_use, bucket in ((1, 64), (64, 64), (65, min(128, capacity)), (capacity, min(256, capacity))):
        cache.global_length = torch.tensor([in_use - 1, 0])
        assert _global_bucket(cache) == bucket
    assert cache.global_k[0].shape[2] == capacity  # nothing grew
    cache.global_length = torch.tensor([capacity + 3, 0])
    used = _global_bucket(cache)
    assert used == 256 and cache.global_k[0].shape[2] >= used
