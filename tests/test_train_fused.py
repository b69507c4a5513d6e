"""Students of the fused stream (docs/DESIGN.md, "The fused stream"): both architectures train on
fused stores and evaluate to a BPB over text bytes; a store of the other stream, stores of two
streams and a resume with the other stream are refused in one line; the fused flat and patched
students are causal, and the fused patched student's cache equals recomputing, its patches
closing exactly after the bytes flagged "ends"."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from bytedistill.cli import main as cli_main
from bytestream.alphabet import FUSED_ENDS, NUM_BYTES
from bytestream.stream_kind import StreamKind
from logit_store import LogitStore
from students.models.architectures import architecture_named
from students.models.cost import rates_of_stores
from students.models.patched_model import PatchedStudentConfig
from students.models.shape import StudentShape
from students.models.speed import generation_speed
from students.training.batch_source import utf8_bytes
from students.training.checkpoints import latest_checkpoint
from students.training.store_windows import PackedStreamDataset
from students.training.synthetic import SYNTHETIC_SOURCE, bigram_teacher
from students.training.trainer import train
from tests.stores import random_texts, write_random_store
from tests.tiny_student import TINY, tiny_config

FUSED = StreamKind.FUSED
RUN = {"warmup_steps": 2, "lr": 3e-3, "seq_len": 32, "batch_size": 2, "max_steps": 3, "eval_bytes": 0}
ARCHITECTURES = {"flat": {}, "patched": {"architecture": "patched", "local_hidden_size": 16, "local_window": 6}}


@pytest.fixture(scope="module")
def stores(tmp_path_factory, llama3_vocab, llama3_converter, llama3_encoder) -> dict[str, str]:
    """A training and a held-out store of each stream, of the same texts."""
    root = tmp_path_factory.mktemp("stores")
    helpers = (llama3_vocab, llama3_converter, llama3_encoder)
    made = {}
    for kind in StreamKind.stored_kinds():
        made[kind.value] = write_random_store(root / kind.value, *helpers, random_texts(10, seed=1), stream=kind)
        held_out = random_texts(4, seed=2)
        made[f"{kind.value}-eval"] = write_random_store(
            root / f"{kind.value}-eval", *helpers, held_out, seed=9, stream=kind
        )
    return {name: str(path) for name, path in made.items()}


def _run(tmp_path: Path, stores, stream: str, architecture: str, **overrides):
    values = {
        "train_stores": [stores[stream]],
        "eval_store": stores[f"{stream}-eval"],
        "stream": stream,
        **RUN,
        **ARCHITECTURES[architecture],
        **overrides,
    }
    return tiny_config(tmp_path, **values)


@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
@pytest.mark.parametrize("stream", [kind.value for kind in StreamKind.stored_kinds()])
def test_each_student_trains_on_its_stream_to_a_bpb_over_text_bytes(tmp_path, stores, stream, architecture, capsys):
    """Both architectures train on stores of either stream; the held-out BPB is the NLL of every
    predicted position (``<eos>`` included) over the text bytes, recomputed here from the saved
    weights; the saved config reads the run's stream."""
    kind = StreamKind(stream)
    result = train(_run(tmp_path / "run", stores, stream, architecture, checkpoint_every=3))
    held_out = LogitStore(stores[f"{stream}-eval"])
    text_bytes = held_out.stats()["text_bytes"]
    assert result.last_eval["eval_bytes"] == text_bytes
    assert math.isfinite(result.last_eval["student_bpb"]) and result.last_eval["student_bpb"] > 0

    checkpoint = latest_checkpoint(tmp_path / "run")
    saved = json.loads((checkpoint / "config.json").read_text())
    assert StreamKind.of_config(saved) is kind and saved["vocab_size"] == kind.alphabet_size
    assert saved["eos_token_id"] == kind.eos and saved["pad_token_id"] == kind.pad
    if architecture == "flat" and kind is StreamKind.EOT:
        assert "byte_stream" not in saved  # the stock config of an <eot> student, as before
    model = architecture_named(architecture).load(checkpoint, saved)

    windows = PackedStreamDataset(held_out, RUN["seq_len"], 2, shuffle=False, teacher_dtype="float32")
    nll, positions, counted = 0.0, 0, 0
    with torch.no_grad():
        for batch in windows.loader():
            mask = batch["loss_mask"]
            logprobs = torch.log_softmax(model(input_ids=batch["input_ids"]).logits.double(), -1)
            nll -= float(logprobs.gather(-1, batch["target_ids"].unsqueeze(-1)).squeeze(-1)[mask].sum())
            positions += int(mask.sum())
            counted += int(utf8_bytes(batch, kind))
            assert batch["target_probs"].shape[-1] == kind.alphabet_size
    specials = len(held_out) + (0 if kind is FUSED else held_out.stats()["tokens"])  # <eos> (and the <eot>s)
    assert positions == text_bytes + specials  # fused: one position per text byte, and <eos>
    assert counted == text_bytes
    assert result.last_eval["student_bpb"] == pytest.approx(nll / (math.log(2) * text_bytes), rel=1e-4)

    stats = LogitStore(stores[stream]).stats()
    symbols_per_byte = (stats["positions"] + stats["documents"]) / stats["text_bytes"]
    assert rates_of_stores([stores[stream]])["symbols_per_byte"] == pytest.approx(symbols_per_byte)
    if kind is FUSED:
        assert symbols_per_byte == pytest.approx(1 + 2 * stats["documents"] / stats["text_bytes"])  # <bos>, <eos>
    assert f"{symbols_per_byte:.3f} symbols per byte" in capsys.readouterr().out


def _train_cli(tmp_path: Path, capsys, train_stores: list[str], *flags: str) -> tuple[int, str]:
    args = ["train", "--train-stores", *train_stores, "--output-dir", str(tmp_path / "run"), "--max-steps", "1"]
    args += ["--preset", "tiny", "--seq-len", "16", "--progress", "false", *flags]
    capsys.readouterr()
    status = cli_main(args)
    return status, capsys.readouterr().err


@pytest.mark.parametrize(
    ("store", "flags", "said"),
    [
        (
            "eot",
            ["--stream", "fused"],
            "is a <eot>-stream store; this student reads the fused stream: give --stream eot",
        ),
        (
            "fused",
            ["--stream", "eot"],
            "is a fused-stream store; this student reads the <eot> stream: give --stream fused",
        ),
    ],
)
def test_a_store_of_the_other_stream_is_refused_naming_the_flag(tmp_path, stores, capsys, store, flags, said):
    status, err = _train_cli(tmp_path, capsys, [stores[store]], *flags)
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("bytedistill train: error: ") and stores[store] in err and said in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("store", "architecture", "student"),
    [("eot", "flat", "eot"), ("fused", "flat", "bytes"), ("eot", "patched", "eot"), ("fused", "patched", "fused")],
)
def test_without_stream_a_student_reads_its_stores_stream(tmp_path, stores, capsys, store, architecture, student):
    """``--stream auto`` (the default) trains a student of the stream its stores hold, except that a
    flat student reads fused stores as the bytes stream (the patched one cannot); a resume without
    the flag keeps the stream, a fused student's included."""
    flags = ["--architecture", architecture, "--checkpoint-every", "1"]
    status, err = _train_cli(tmp_path, capsys, [stores[store]], *flags)
    assert status == 0, err
    checkpoint = latest_checkpoint(tmp_path / "run")
    assert StreamKind.of_config(json.loads((checkpoint / "config.json").read_text())) is StreamKind(student)
    status, err = _train_cli(tmp_path, capsys, [stores[store]], *flags, "--resume", "latest", "--max-steps", "2")
    assert status == 0, err


def test_a_fused_flat_student_resumes_on_its_stream_without_the_flag(tmp_path, stores, capsys):
    status, err = _train_cli(tmp_path, capsys, [stores["fused"]], "--stream", "fused", "--checkpoint-every", "1")
    assert status == 0, err
    status, err = _train_cli(tmp_path, capsys, [stores["fused"]], "--resume", "latest", "--max-steps", "2")
    assert status == 0, err
    checkpoint = latest_checkpoint(tmp_path / "run")
    assert StreamKind.of_config(json.loads((checkpoint / "config.json").read_text())) is StreamKind.FUSED


@pytest.mark.parametrize("flags", [[], ["--stream", "fused"]])
def test_stores_of_two_streams_are_refused(tmp_path, stores, capsys, flags):
    status, err = _train_cli(tmp_path, capsys, [stores["eot"], stores["fused"]], *flags)
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert "hold different streams: train on stores of one stream" in err
    status, err = _train_cli(tmp_path, capsys, [stores["fused"], "--eval-store", stores["eot-eval"]], *flags)
    assert status == 2 and "hold different streams" in err, err


def test_a_resume_with_the_other_stream_is_refused(tmp_path, stores, capsys):
    train(_run(tmp_path / "run", stores, "fused", "flat", max_steps=2, checkpoint_every=1, eval_store=None))
    status, err = _train_cli(tmp_path, capsys, [stores["eot"]], "--resume", "latest", "--max-steps", "4")
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert "it is a student of the fused stream, and this run reads the <eot> stream" in err


# ------------------------------------------------------------------------------ the models


def random_fused_stream(rows: int, length: int, seed: int) -> torch.Tensor:
    """``<bos>``, then bytes, about a third of them flagged "ends"."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, NUM_BYTES, (rows, length), generator=generator)
    ids += FUSED_ENDS * (torch.rand(rows, length, generator=generator) < 0.3).long()
    ids[:, 0] = FUSED.bos
    return ids


def tiny_fused(architecture: str, seed: int = 0):
    shape = StudentShape(
        stream="fused",
        architecture=architecture,
        **{key: TINY[key] for key in ("preset", "hidden_size", "num_layers", "num_heads", "intermediate_size")},
        local_hidden_size=16,
        local_window=6,
    )
    model = architecture_named(architecture).build(shape, seq_len=64, seed=seed).eval()
    if architecture == "patched":
        torch.nn.init.normal_(model.global_down.weight, std=0.5)  # trained-like: the global output reaches the decoder
    return model


def test_fused_configs_name_the_fused_alphabet():
    for architecture in ARCHITECTURES:
        config = tiny_fused(architecture).config
        assert StreamKind.of_config(config) is FUSED and config.vocab_size == FUSED.alphabet_size == 515
        assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (FUSED.bos, FUSED.eos, FUSED.pad)
    eot = PatchedStudentConfig()
    assert (eot.vocab_size, eot.eot_token_id, eot.bos_token_id) == (260, 256, 257)
    assert PatchedStudentConfig(byte_stream="fused").eot_token_id is None
    with pytest.raises(ValueError, match="byte_stream"):
        PatchedStudentConfig(byte_stream="other")


@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_no_fused_position_reads_a_later_symbol(architecture):
    model = tiny_fused(architecture)
    ids = random_fused_stream(2, 24, seed=1)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        assert logits.shape[-1] == FUSED.alphabet_size and torch.isfinite(logits).all()
        for at in range(1, 24):
            flag_toggled = torch.where(ids[:, at] < FUSED_ENDS, ids[:, at] + FUSED_ENDS, ids[:, at] - FUSED_ENDS)
            other_byte = (ids[:, at] % NUM_BYTES + 1) % NUM_BYTES + FUSED_ENDS * (ids[:, at] >= FUSED_ENDS)
            for changed in (flag_toggled, other_byte):  # a boundary appears or goes / a byte changes
                other = ids.clone()
                other[:, at] = changed
                perturbed = model(input_ids=other).logits
                torch.testing.assert_close(perturbed[:, :at], logits[:, :at], rtol=0, atol=1e-5)
                assert not torch.allclose(perturbed[:, at], logits[:, at], atol=1e-5)  # it does read its own


class EveryFifthEnds(LogitsProcessor):
    """Force a byte flagged "ends" every fifth generated symbol, and none flagged between."""

    def __init__(self, prompt_len: int):
        self.prompt_len = prompt_len

    def __call__(self, input_ids, scores):
        ends = (input_ids.shape[1] - self.prompt_len) % 5 == 4
        scores[:, FUSED_ENDS : FUSED.bos] = scores[:, :FUSED_ENDS] if ends else -float("inf")
        if ends:
            scores[:, :FUSED_ENDS] = -float("inf")
        return scores


def test_fused_patches_close_exactly_after_flagged_bytes():
    model = tiny_fused("patched")
    ids = random_fused_stream(3, 20, seed=4)
    expected = (ids == FUSED.bos) | ((ids >= FUSED_ENDS) & (ids < FUSED.bos))
    assert torch.equal(model.closes(ids), expected)
    assert not model.closes(torch.tensor([FUSED.eos, FUSED.pad, 255, 0])).any()
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
    assert out.cache.global_steps().tolist() == (expected.sum(1) + 1).tolist()  # one per patch, + the start


def test_fused_patched_cache_equals_recomputing():
    model = tiny_fused("patched", seed=2)
    prompt = random_fused_stream(3, 11, seed=3)  # rows close different numbers of patches
    common = {
        "max_new_tokens": 20,
        "do_sample": False,
        "pad_token_id": FUSED.pad,
        "suppress_tokens": [FUSED.bos, FUSED.pad, FUSED.eos],
    }
    for processors in ([], [EveryFifthEnds(prompt.shape[1])]):
        cached = model.generate(prompt, logits_processor=LogitsProcessorList(processors), **common)
        recomputed = model.generate(prompt, use_cache=False, logits_processor=LogitsProcessorList(processors), **common)
        assert torch.equal(cached, recomputed)
    new = cached[:, 11:]
    assert torch.equal(((new >= FUSED_ENDS) & (new < FUSED.bos)).sum(1), torch.full((3,), 4))  # patches closed
    with torch.no_grad():  # and the logits themselves, prompt in one pass then a symbol at a time
        full = model(cached).logits
        out = model(cached[:, :7], use_cache=True)
        steps = [out.logits] + [model(cached[:, i : i + 1], cache=out.cache).logits for i in range(7, cached.shape[1])]
        torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-5)
    assert out.cache.global_steps().tolist() == (model.closes(cached).sum(1) + 1).tolist()
    assert np.all(np.isfinite(full.numpy()))


def test_the_synthetic_teacher_trains_a_fused_student(tmp_path):
    """The synthetic bigram teacher draws over the fused alphabet when the run reads it."""
    result = train(tiny_config(tmp_path / "run", stream="fused", max_steps=2, warmup_steps=1), SYNTHETIC_SOURCE)
    assert result.step == 2 and result.train_bytes > 0 and all(map(math.isfinite, result.losses.values()))
    teacher = bigram_teacher(stream=FUSED)
    assert teacher.shape == (515, 515) and not teacher[:, [FUSED.bos, FUSED.pad]].any()


def test_generation_speed_counts_the_fused_text_bytes():
    speed = generation_speed(tiny_fused("patched"), random_fused_stream(2, 5, seed=6), new_symbols=6)
    assert speed.new_symbols == 6 and speed.new_bytes == 12  # <bos>, <eos>, <pad> suppressed: every symbol a byte
