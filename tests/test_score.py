"""``score`` of an exported student: equal to ``train``'s evaluation, equal through the stream
tokenizer and the store's streams, sliding windows, and lm-evaluation-harness's bits_per_byte."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from bytedistill.cli import main as bytedistill
from logit_store import LogitStore
from students.release.score import ScoreOptions, score, windows
from tests.exported_student import SEQ_LEN, build

QUIET = ScoreOptions(progress=False)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return build(tmp_path_factory.mktemp("exported"))


@pytest.fixture(scope="module")
def store_texts(exported, tmp_path_factory):
    """The held-out store's documents as .txt files, in store order."""
    folder = tmp_path_factory.mktemp("texts")
    store = LogitStore(exported.heldout_store)
    paths = []
    for i in range(len(store)):
        paths.append(folder / f"{i:03d}.txt")
        paths[-1].write_bytes(store.document(i).layout.text_bytes())
    return paths


@pytest.mark.parametrize("context,stride", [(8, 8), (8, 3), (5, 1), (100, 7)])
def test_windows_score_every_position_once_within_the_context(context, stride):
    for total in (1, 5, 8, 9, 23):
        counts = np.zeros(total, int)
        for start, first, end in windows(total, context, stride):
            assert start <= first < end <= total and end - start <= context
            assert start == 0 or first - start >= context - stride  # at least context - stride symbols before
            counts[first:end] += 1
        assert counts.tolist() == [1] * total


@pytest.mark.slow
def test_score_of_the_store_equals_trains_evaluation(exported):
    last = json.loads((exported.run / "metrics.jsonl").read_text().splitlines()[-1])
    total = score(exported.folder, [exported.heldout_store], QUIET)[-1]
    assert total.bytes == last["eval_bytes"]
    assert total.student_bpb == pytest.approx(last["student_bpb"], abs=1e-4)
    assert total.teacher_bpb == pytest.approx(last["teacher_bpb"], abs=1e-4)


@pytest.mark.slow
def test_stream_tokenizer_reproduces_every_stored_stream(exported):
    store = LogitStore(exported.heldout_store)
    remote = AutoTokenizer.from_pretrained(exported.folder, trust_remote_code=True)
    assert type(remote).__name__ == "ByteStreamTokenizer"
    invalid = 0
    for i in range(len(store)):
        layout = store.document(i).layout
        data = layout.text_bytes()
        assert remote.encode_bytes(data, eos=True) == layout.symbols.tolist()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            invalid += 1
            continue
        assert remote(text).input_ids + [store.stream.eos] == layout.symbols.tolist()
    assert invalid == 1 and any(
        b"<|begin_of_text|>" in store.document(i).layout.text_bytes() for i in range(len(store))
    )


@pytest.mark.slow
def test_score_through_the_tokenizer_equals_the_stores_streams(exported, store_texts):
    from_store = score(exported.folder, [exported.heldout_store], QUIET)[-1]
    each = ScoreOptions(packed=False, progress=False)  # a file a document: the store's documents each alone
    from_text = score(exported.folder, store_texts, each)
    assert from_text[-1].bytes == from_store.bytes and from_text[-1].documents == len(store_texts)
    by_document = score(exported.folder, [exported.heldout_store], each)[-1]
    assert from_text[-1].student_nll == pytest.approx(by_document.student_nll, rel=1e-9)
    # packed, a source's figure is the one it gets alone, whatever is scored beside it
    beside = score(exported.folder, [*store_texts[:3], exported.heldout_store], QUIET)
    assert beside[3].student_nll == pytest.approx(from_store.student_nll, rel=1e-9)
    assert beside[3].teacher_nll == pytest.approx(from_store.teacher_nll, rel=1e-9)
    assert from_text[-1].teacher_nll is None and sum(r.bytes for r in from_text[:-1]) == from_store.bytes
    plain = score(exported.folder, store_texts, ScoreOptions(mode="plain", progress=False))[-1]
    assert plain.bytes == from_store.bytes and not math.isclose(plain.student_nll, from_store.student_nll, rel_tol=1e-3)


@pytest.mark.slow
def test_long_text_slides_within_the_trained_context(exported, tmp_path):
    (tmp_path / "long.txt").write_text("And the evening and the morning were the first day. " * 40)
    model_positions = []
    from students.release import score as score_module

    load = score_module.load_model

    def recording_load(folder, **options):
        model = load(folder, **options)
        model.register_forward_pre_hook(
            lambda m, args, kwargs: model_positions.append(kwargs["input_ids"].shape[1]), with_kwargs=True
        )
        return model

    score_module.load_model = recording_load
    try:
        whole = score(exported.folder, [tmp_path / "long.txt"], QUIET)[-1]
        sliding = score(exported.folder, [tmp_path / "long.txt"], ScoreOptions(stride=SEQ_LEN // 4, progress=False))[-1]
    finally:
        score_module.load_model = load
    assert max(model_positions) == SEQ_LEN and whole.bytes == sliding.bytes > 20 * SEQ_LEN
    assert whole.student_nll != sliding.student_nll


@pytest.mark.slow
def test_score_cli_prints_per_source_and_total(exported, store_texts, capsys):
    assert (
        bytedistill(
            [
                "score",
                str(exported.folder),
                str(exported.heldout_store),
                *map(str, store_texts[:2]),
                "--progress",
                "false",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[0] == "source" and lines[-1].startswith("total") and len(lines) == 5
    assert bytedistill(["score", str(exported.folder), str(exported.heldout_store / "nothing.txt")]) == 2
    assert "bytedistill score: error:" in capsys.readouterr().err
    (exported.folder.parent / "bad.jsonl").write_text("{not json\n")
    assert bytedistill(["score", str(exported.folder), str(exported.folder.parent / "bad.jsonl")]) == 2


@pytest.mark.slow
def test_generate_slides_past_the_trained_context(exported):
    from students.release.generate import GenerateOptions, generate_bytes, load_folder

    model, tokenizer = load_folder(exported.folder)
    model.generation_config.suppress_tokens = [257, 258, 259]  # no <eos>: run past the context
    lengths = []
    model.register_forward_pre_hook(
        lambda m, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    out = generate_bytes(model, tokenizer, "And the evening", GenerateOptions(max_new_bytes=3 * SEQ_LEN, greedy=True))
    assert len(out) == 3 * SEQ_LEN
    assert lengths and all(n <= SEQ_LEN for n in lengths)


@pytest.mark.slow
def test_lm_eval_bits_per_byte_equals_score(exported, tmp_path, monkeypatch):
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    docs = [
        "And the evening and the morning were the first day. " * 12,
        "Grüße aus Köln 🙂 — 東京 — السلام عليكم. " * 8,
    ]
    (tmp_path / "docs.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in docs))
    (tmp_path / "local.yaml").write_text(
        "task: bytedistill_local\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {tmp_path / 'docs.jsonl'}\n"
        'test_split: test\noutput_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: bits_per_byte\n    aggregation: bits_per_byte\n    higher_is_better: false\n"
    )

    tasks = TaskManager(include_path=str(tmp_path), include_defaults=False)  # not lm-eval's own 14k task files

    def harness_bpb(model_args: str) -> float:
        results = lm_eval.simple_evaluate(
            model="hf",
            model_args=model_args,
            tasks=["bytedistill_local"],
            task_manager=tasks,
            batch_size=4,
            device="cpu",
        )
        return results["results"]["bytedistill_local"]["bits_per_byte,none"]

    harness = harness_bpb(f"pretrained={exported.folder},trust_remote_code=True")
    ours = score(exported.folder, [tmp_path / "docs.jsonl"], ScoreOptions(packed=False, progress=False))[-1]
    assert harness == pytest.approx(ours.student_bpb, rel=0.01)
    with pytest.raises(ValueError, match=r"trust_remote_code=True"):  # without remote code: refused, not plain bytes
        harness_bpb(f"pretrained={exported.folder}")


@pytest.mark.slow
def test_prompts_heal_through_the_card_remote_generate_and_lm_eval(exported, tmp_path, monkeypatch):
    """The card's ``model.generate(**tokenizer.prompt(p))`` (stock model), ``tokenizer(p)`` streams
    given to the model loaded with ``trust_remote_code`` (the folder's custom_generate/generate.py)
    and lm-evaluation-harness's ``generate_until`` give the same healed greedy continuation."""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager
    from transformers import AutoModelForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(exported.folder, trust_remote_code=True)
    stock = AutoModelForCausalLM.from_pretrained(exported.folder).eval()
    remote = AutoModelForCausalLM.from_pretrained(exported.folder, trust_remote_code=True).eval()
    prompts = ["In the begi", "And the morn", "<|eot_id|>he"]  # short: lm-eval keeps context + 12 in 32 symbols

    def healed(prompt: str) -> bytes:
        inputs = tokenizer.prompt(prompt)
        output = stock.generate(**inputs, max_new_tokens=24, do_sample=False)[0]
        new = tokenizer.text_bytes(output[inputs["input_ids"].shape[1] :].tolist())
        return new[len(tokenizer.encode_prompt(prompt.encode())[1]) :]

    expected = [healed(p) for p in prompts]
    tokenizer.padding_side = "left"
    streams = tokenizer(prompts, padding=True, return_tensors="pt")
    width = streams["input_ids"].shape[1]
    first_inputs = []
    remote.register_forward_pre_hook(
        lambda m, args, kwargs: first_inputs.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    output = remote.generate(**streams, max_new_tokens=12, do_sample=False)
    assert first_inputs[0] < width  # it started from the streams cut back to their last words
    assert torch.equal(output[:, :width], streams["input_ids"])  # the caller's frame
    for row, want in enumerate(expected):
        got = tokenizer.text_bytes(output[row, width:].tolist())
        assert got and want.startswith(got), prompts[row]

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "cuts.jsonl").write_text("\n".join(json.dumps({"context": p, "target": "x"}) for p in prompts))
    (tmp_path / "cuts.yaml").write_text(
        "task: bytedistill_cuts\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {tmp_path / 'cuts.jsonl'}\n"
        'test_split: test\noutput_type: generate_until\ndoc_to_text: "{{context}}"\ndoc_to_target: "{{target}}"\n'
        "generation_kwargs:\n  until: ['\\u0000']\n  do_sample: false\n  max_gen_toks: 12\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
    )
    results = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={exported.folder},trust_remote_code=True",
        tasks=["bytedistill_cuts"],
        task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
        batch_size=2,
        device="cpu",
        log_samples=True,
    )
    samples = sorted(results["samples"]["bytedistill_cuts"], key=lambda s: s["doc_id"])
    for sample, want in zip(samples, expected, strict=True):
        text = sample["resps"][0][0]
        assert text and want.decode("utf-8", errors="replace").startswith(text.rstrip("\ufffd")), sample["doc"]
