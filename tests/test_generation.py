"""Generation as users call it, for the flat and the patched student: a left-padded batch of prompts
of different lengths gives each row what it gives alone (cached, recomputed, transformers' static
cache), every call form of the exported folder's ``generate`` (remote code or not) gives the same
symbols, ``bytedistill generate`` batches prompts, lm-evaluation-harness's ``generate_until`` runs
the patched student at batch size 8, and the generation benchmark runs (``--smoke``)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from transformers.generation.streamers import BaseStreamer

from bytedistill.cli import main as cli_main
from bytestream.alphabet import BOS, PAD
from bytestream.stream_tokenizer import ByteStreamTokenizer
from students.models.llama import build_student, student_config
from students.models.patched_model import PatchedStudent, PatchedStudentConfig
from students.release.export import export_student
from students.release.generate import GenerateOptions, generate_batch, generate_bytes, load_folder
from students.training.synthetic import SYNTHETIC_SOURCE
from students.training.trainer import train
from tests.tiny_student import tiny_config

PROMPTS = ["In the beginning God creat", "And", "x = f(a1, b"]  # three lengths, each cut inside a word
PATCHED = {"architecture": "patched", "local_hidden_size": 16, "local_window": 6}
GREEDY = {"max_new_tokens": 20, "do_sample": False}


def flat_model() -> torch.nn.Module:
    config = student_config("tiny", hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_positions=96)
    model = build_student(config, seed=0).eval()
    model.generation_config.pad_token_id = PAD
    return model


def patched_model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = PatchedStudentConfig(
        local_hidden_size=16,
        local_heads=2,
        local_intermediate_size=32,
        local_window=6,
        global_hidden_size=32,
        global_layers=2,
        global_heads=2,
        global_intermediate_size=64,
        max_position_embeddings=96,
    )
    model = PatchedStudent(config).eval()
    torch.nn.init.normal_(model.global_down.weight, std=0.5)  # trained-like: the global output reaches the decoder
    model.generation_config.pad_token_id = PAD
    return model


@pytest.fixture(scope="module")
def stream_tokenizer(llama3_tokenizer_path):
    return ByteStreamTokenizer(teacher_tokenizer_file=llama3_tokenizer_path)


def continuation(output: torch.Tensor, width: int, pad: int = PAD) -> list[int]:
    """A row's generated symbols (the padding after a row that stopped early left out)."""
    return [s for s in output[width:].tolist() if s != pad]


@pytest.mark.parametrize("build", [flat_model, patched_model], ids=["flat", "patched"])
def test_a_padded_batch_generates_what_each_prompt_generates_alone(build, stream_tokenizer):
    model = build()
    common = {**GREEDY, "suppress_tokens": [BOS, PAD]}
    batch = stream_tokenizer.prompt(PROMPTS, padding=True)
    width = batch["input_ids"].shape[1]
    assert len({int(m.sum()) for m in batch["attention_mask"]}) == 3  # three lengths, padded on the left
    ways = {"cached": {}, "recomputed": {"use_cache": False}}
    if build is flat_model:
        ways["static cache"] = {"cache_implementation": "static"}
    for way, options in ways.items():
        output = model.generate(**stream_tokenizer.prompt(PROMPTS, padding=True), **common, **options)
        for row, prompt in enumerate(PROMPTS):
            alone = stream_tokenizer.prompt(prompt)
            single = model.generate(**alone, **common, **options)[0]
            assert continuation(output[row], width) == continuation(single, alone["input_ids"].shape[1]), (way, prompt)
    with pytest.raises(ValueError, match="padding=True"):
        stream_tokenizer.prompt(PROMPTS, padding=False)


@pytest.mark.parametrize("build", [flat_model, patched_model], ids=["flat", "patched"])
def test_return_sequences_and_beams_heal_each_row_with_its_own_prompt(build, stream_tokenizer):
    """``generate`` expands each prompt into consecutive rows (``num_return_sequences``, ``num_beams``):
    each row is healed with its own prompt's word. Sampled rows start with their prompt's bytes; beam
    search gives each prompt's rows what that prompt alone gives, cached or recomputed."""
    model = build()
    common = {"max_new_tokens": 12, "suppress_tokens": [BOS, PAD]}
    torch.manual_seed(0)
    sampled = model.generate(**stream_tokenizer.prompt(PROMPTS), do_sample=True, num_return_sequences=2, **common)
    assert len(sampled) == 2 * len(PROMPTS)
    for row, output in enumerate(sampled):
        assert stream_tokenizer.text_bytes(output).startswith(PROMPTS[row // 2].encode()), row
    beams = {"do_sample": False, "num_beams": 3, "num_return_sequences": 2, **common}
    batch = stream_tokenizer.prompt(PROMPTS)
    width = batch["input_ids"].shape[1]
    for options in ({}, {"use_cache": False}):
        output = model.generate(**batch, **beams, **options)
        for k, prompt in enumerate(PROMPTS):
            alone = stream_tokenizer.prompt(prompt)
            single = model.generate(**alone, **beams, **options)
            for j in range(2):
                assert stream_tokenizer.text_bytes(output[2 * k + j]).startswith(prompt.encode())
                got, want = continuation(output[2 * k + j], width), continuation(single[j], alone["input_ids"].shape[1])
                assert got == want, (options, prompt, j)
    one = stream_tokenizer.prompt("abcdefgh")  # one prompt, two beams: every byte of the word fed
    beamed = model.generate(**one, do_sample=False, num_beams=2, **common)[0]
    assert stream_tokenizer.text_bytes(beamed)[:8] == b"abcdefgh"


@pytest.mark.parametrize("build", [flat_model, patched_model], ids=["flat", "patched"])
def test_batched_byte_generation_equals_each_prompt_alone(build, stream_tokenizer):
    """``generate_batch`` (``bytedistill generate`` with several prompts), greedy and past the
    trained context (the window slides per row)."""
    model = build()
    model.generation_config.suppress_tokens = [BOS, PAD]
    options = GenerateOptions(max_new_bytes=70, greedy=True)  # past the 96 symbols of context
    together = generate_batch(model, stream_tokenizer, PROMPTS, options)
    assert together == [generate_bytes(model, stream_tokenizer, p, options) for p in PROMPTS]
    assert all(len(c) == 70 for c in together)


# ------------------------------------------------------------------ the exported folder


@pytest.fixture(scope="module", params=["flat", "patched"])
def folder(request, tmp_path_factory, llama3_tokenizer_path):
    root = tmp_path_factory.mktemp(request.param)
    extra = PATCHED if request.param == "patched" else {}
    train(tiny_config(root / "run", max_steps=1, **extra), SYNTHETIC_SOURCE)
    return export_student(root / "run", root / "model", teacher_tokenizer=llama3_tokenizer_path)


class Collect(BaseStreamer):
    def __init__(self):
        self.parts: list[list[int]] = []

    def put(self, value):
        self.parts.append(value.reshape(-1).tolist())

    def end(self):
        pass


def test_every_call_form_gives_the_same_symbols(folder):
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    remote = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    stock, _ = load_folder(folder)  # no remote code: the library's classes and the stock generate
    for sampling in ({"do_sample": False}, {"do_sample": True, "top_k": 20, "temperature": 0.8}):
        check_call_forms(tokenizer, remote, stock, sampling)


def check_call_forms(tokenizer, remote, stock, sampling: dict) -> None:
    """Every call form gives the symbols ``tokenizer.prompt`` + the stock ``generate`` give (for the
    folder's stream: its tokenizer's ``text_bytes`` drops ``<eot>`` or the flags)."""
    decode_bytes = tokenizer.text_bytes
    prompt = "In the beginning God creat"
    fed = len(tokenizer.encode_prompt(prompt.encode())[1])
    prompted = tokenizer.prompt(prompt)
    stream = tokenizer(prompt, return_tensors="pt")
    ids, width = stream["input_ids"], stream["input_ids"].shape[1]
    config = GenerationConfig(max_new_tokens=40, pad_token_id=PAD, **sampling)
    streamer = Collect()

    def healed_prompt(model) -> bytes:  # tokenizer.prompt: the word is fed in the same call
        output = model.generate(**prompted, max_new_tokens=40, **sampling)[0]
        return decode_bytes(output[prompted["input_ids"].shape[1] :])[fed:]

    def prompted_positional() -> bytes:
        output = stock.generate(
            prompted["input_ids"],
            attention_mask=prompted["attention_mask"],
            logits_processor=prompted["logits_processor"],
            max_new_tokens=40,
            **sampling,
        )
        return decode_bytes(output[0, prompted["input_ids"].shape[1] :])[fed:]

    def caller_frame(output) -> bytes:  # a complete stream: the folder's generate heals it, the caller's frame
        assert torch.equal(output[0, :width], ids[0])
        return decode_bytes(output[0, width:])

    def seeded(call):
        torch.manual_seed(7)
        return call()

    want = seeded(lambda: healed_prompt(stock))[:16]
    assert len(want) == 16
    forms = {
        "prompt(), remote": lambda: healed_prompt(remote),
        "prompt() positional, stock": prompted_positional,
        "positional ids": lambda: caller_frame(remote.generate(ids, max_new_tokens=30, **sampling)),
        "inputs=": lambda: caller_frame(remote.generate(inputs=ids, max_new_tokens=30, **sampling)),
        "input_ids=": lambda: caller_frame(remote.generate(input_ids=ids, max_new_tokens=30, **sampling)),
        "**tokenizer(...)": lambda: caller_frame(remote.generate(**stream, max_new_tokens=30, **sampling)),
        "GenerationConfig": lambda: caller_frame(remote.generate(ids, config)),
        "generation_config=": lambda: caller_frame(remote.generate(input_ids=ids, generation_config=config)),
        "streamer": lambda: caller_frame(remote.generate(ids, max_new_tokens=30, streamer=streamer, **sampling)),
    }
    for name, call in forms.items():
        assert seeded(call)[:16] == want, (name, sampling)
    assert streamer.parts[0] == ids[0].tolist()  # the streamer is shown the caller's input first
    assert decode_bytes([s for part in streamer.parts[1:] for s in part])[:16] == want


def test_a_padded_batch_of_complete_streams_heals_each_row_as_alone(folder):
    """``tokenizer([...], padding=True)`` pads on the left; the folder's generate heals each row."""
    check_padded_batch_heals_each_row(folder, PAD)


def check_padded_batch_heals_each_row(folder, pad: int) -> None:
    """A left-padded batch of complete streams through the folder's ``generate`` continues each row as
    that prompt alone does; ``pad`` is the folder's stream's padding symbol."""
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    remote = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    batch = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    assert batch["attention_mask"][:, 0].tolist().count(0) == 2  # two shorter rows, padded on the left
    assert batch["input_ids"][1, 0] == pad
    output = remote.generate(**batch, max_new_tokens=12, do_sample=False)
    width = batch["input_ids"].shape[1]
    for row, prompt in enumerate(PROMPTS):
        alone = tokenizer(prompt, return_tensors="pt")
        single = remote.generate(**alone, max_new_tokens=12, do_sample=False)[0]
        assert continuation(output[row], width, pad) == continuation(single, alone["input_ids"].shape[1], pad), prompt


def test_complete_streams_with_return_sequences_and_beams_heal_each_row(folder):
    """``tokenizer(texts)`` through the folder's ``generate`` with several return sequences: one row per
    prompt and sequence, each in its caller's frame; beam search gives each prompt what it gives alone."""
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    remote = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    batch = tokenizer(PROMPTS[:2], padding=True, return_tensors="pt")
    width = batch["input_ids"].shape[1]
    torch.manual_seed(0)
    sampled = remote.generate(**batch, do_sample=True, num_return_sequences=3, max_new_tokens=4)
    assert sampled.shape[0] == 6
    assert all(torch.equal(sampled[r, :width], batch["input_ids"][r // 3]) for r in range(6))
    beams = {"do_sample": False, "num_beams": 2, "num_return_sequences": 2, "max_new_tokens": 6}
    output = remote.generate(**batch, **beams)
    for k, prompt in enumerate(PROMPTS[:2]):
        alone = tokenizer(prompt, return_tensors="pt")
        single = remote.generate(**alone, **beams)
        for j in range(2):
            got = continuation(output[2 * k + j], width)
            assert got == continuation(single[j], alone["input_ids"].shape[1]), (prompt, j)


def test_generate_cli_batches_prompts_and_a_prompts_file(folder, tmp_path, capsys):
    (tmp_path / "prompts.txt").write_text("And\nx = f(a1, b\n")
    flags = ["--max-new-bytes", "12", "--greedy"]
    assert (
        cli_main(
            ["generate", str(folder), "--prompt", PROMPTS[0], "--prompts-file", str(tmp_path / "prompts.txt"), *flags]
        )
        == 0
    )
    together = capsys.readouterr().out
    alone = ""
    for prompt in PROMPTS:
        assert cli_main(["generate", str(folder), "--prompt", prompt, *flags]) == 0
        alone += capsys.readouterr().out
    assert together == alone and together.startswith(PROMPTS[0]) and all(p in together for p in PROMPTS)
    (tmp_path / "bad.txt").write_bytes(b"ok\n\xff\n")
    assert cli_main(["generate", str(folder), "--prompts-file", str(tmp_path / "bad.txt")]) == 2
    assert (
        capsys.readouterr().err.strip()
        == f"bytedistill generate: error: --prompts-file {tmp_path / 'bad.txt'} is not UTF-8 text (byte 3)"
    )


@pytest.mark.slow
def test_lm_eval_generate_until_at_batch_size_8_on_the_patched_student(folder, tmp_path, monkeypatch):
    """Eight prompts of different lengths in one batch, each healed as it is alone (batch size 1)."""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    if json.loads((folder / "config.json").read_text())["model_type"] != "bytedistill_patched":
        pytest.skip("the patched student's case")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    prompts = [
        "In the begi",
        "And the morn",
        "x",
        "And God said, Let",
        "Grüße aus Kö",
        "def f(",
        "A b c d",
        "<|eot_id|>he",
    ]
    (tmp_path / "cuts.jsonl").write_text("\n".join(json.dumps({"context": p, "target": "x"}) for p in prompts))
    (tmp_path / "cuts.yaml").write_text(
        "task: bytedistill_cuts8\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {tmp_path / 'cuts.jsonl'}\n"
        'test_split: test\noutput_type: generate_until\ndoc_to_text: "{{context}}"\ndoc_to_target: "{{target}}"\n'
        "generation_kwargs:\n  until: ['\\u0000']\n  do_sample: false\n  max_gen_toks: 6\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
    )

    tasks = TaskManager(include_path=str(tmp_path), include_defaults=False)  # not lm-eval's own 14k task files

    def responses(batch_size: int) -> list[str]:
        results = lm_eval.simple_evaluate(
            model="hf",
            model_args=f"pretrained={folder},trust_remote_code=True",
            tasks=["bytedistill_cuts8"],
            task_manager=tasks,
            batch_size=batch_size,
            device="cpu",
            log_samples=True,
        )
        samples = sorted(results["samples"]["bytedistill_cuts8"], key=lambda s: s["doc_id"])
        return [s["resps"][0][0] for s in samples]

    batched = responses(8)
    assert len(batched) == 8 and any(batched)
    assert batched == responses(1)


def test_generation_benchmark_smoke(capsys):
    from tests.benchmark_smoke import run_smoke

    lines = run_smoke("generation", capsys).splitlines()
    assert any(line.startswith("| patched") for line in lines) and any(line.startswith("| flat") for line in lines)
    summary = [line for line in lines if line.startswith("summary")]
    assert len(summary) == 1 and all(goal in summary[0] for goal in ("overhead", "2.5x", "token model", "bound"))


def test_the_tokenizer_without_remote_code_refuses_instead_of_placing_no_eot(folder):
    """No silent plain bytes: the plain byte tokenizer is there by name."""
    from transformers import PreTrainedTokenizerFast

    with pytest.raises(ValueError, match=r"trust_remote_code=True"):
        AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    assert AutoTokenizer.from_pretrained(folder, trust_remote_code=True)("ab").input_ids[-1] == 256  # <eot>
    assert PreTrainedTokenizerFast.from_pretrained(folder)("ab").input_ids == [257, 97, 98]


def test_the_generation_summary_names_a_goal_whose_row_failed_as_not_measured():
    """A row that failed on a new device leaves its goal 'not measured', the others judged."""
    from benchmarks.generation import Row, summary

    def row(model: str, batch: int, decode_bps: float, overhead_ms: float = 0.5) -> Row:
        return Row(model, 1, batch, 1, "compiled", 1.0, decode_bps, 1.0, 4 * decode_bps, overhead_ms, None)

    rows = [row(f"{kind} S", batch, bps) for kind, bps in (("flat", 100), ("patched", 300)) for batch in (1, 8)]
    rows += [row("token model S", 1, 200)]  # its batch-8 row failed
    line = summary(rows)
    assert "per-step overhead 0.50 ms at batch 1, compiled (goal <= 1.0 ms): met" in line
    assert "patched/flat 3.00x at batch 8, size S" in line and "MISSED" in line  # 25% of the bound
    assert "patched over token model: not measured (token model S at batch 8 failed)" in line
