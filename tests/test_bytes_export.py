"""The plain export of a bytes-stream student (docs/DESIGN.md, "The bytes stream"): a real pipeline (a
tiny random GGUF teacher with SmolLM2's tokenizer and chat template, fused stores of text and of
conversations, ``train --stream bytes``, ``export``) gives folders with no code and no teacher
tokenizer that a fresh process loads without ``trust_remote_code``, generates from (a mid-word prompt,
a left-padded batch) and chats with; ``generate``, ``chat``, ``score``, ``serve`` and ``push``'s check
run them, and a prompt's stream is the same whatever the cut."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from bytedistill.cli import main as cli_main
from bytestream.bytes_stream import bytes_symbols
from bytestream.stream_kind import StreamKind
from logit_store import LogitStore
from tests.gguf_teachers import write_tiny_gguf
from tests.teachers import dump_args

TEXTS = [
    "In the beginning God created the heaven and the earth. " * 3,
    "Grüße aus Köln 🙂 — 東京",
    "def f(x): return x",
]
CONVERSATION = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How are you?"}]
TRAIN = ["--preset", "micro", "--seq-len", "64", "--batch-size", "2", "--max-steps", "3", "--warmup-steps", "1"]
BYTES = StreamKind.BYTES
END_OF_TURN = BYTES.alphabet_size + 1  # <|im_end|>, the chat store's second reserved symbol


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """Fused stores of text and of conversations, a bytes student trained on each, and their exports,
    made where the teacher the stores name is no longer found."""
    root = tmp_path_factory.mktemp("bytes-export")
    teacher = write_tiny_gguf(root / "tiny.gguf", chat_template=True)
    (root / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    (root / "chats.jsonl").write_text("".join(json.dumps({"messages": CONVERSATION}) + "\n" for _ in range(3)))
    assert cli_main(dump_args(teacher, root / "train.jsonl", root / "store")) == 0
    assert cli_main(dump_args(teacher, root / "chats.jsonl", root / "chat-store", "--chat")) == 0
    teacher.rename(root / "teacher-gone.gguf")  # training and export read the stores alone
    for name, store in (("plain", "store"), ("chat", "chat-store")):
        run = root / f"run-{name}"
        args = [
            "--train-stores",
            str(root / store),
            "--stream",
            "bytes",
            "--output-dir",
            str(run),
            "--progress",
            "false",
        ]
        assert cli_main(["train", *args, *TRAIN, "--eval-bytes", "0"]) == 0
        assert cli_main(["export", str(run), str(root / name), "--teacher", "tiny"]) == 0
    return {"root": root, "plain": root / "plain", "chat": root / "chat", "store": root / "store"}


@pytest.mark.parametrize("store", ["store", "chat-store"])
def test_a_bytes_student_is_trained_and_exported_without_its_teacher(built, store):
    from logit_store.manifest import read_manifest, tokenizer_location

    path = built["root"] / store
    teacher = Path(tokenizer_location(path, read_manifest(path)))
    assert teacher.name == "tiny.gguf" and not (path / teacher).exists()  # relative to the store, or absolute
    assert (built["plain" if store == "store" else "chat"] / "model.safetensors").is_file()


@pytest.mark.parametrize("name", ["plain", "chat"])
def test_a_bytes_folder_holds_no_code_and_no_teacher_tokenizer(built, name):
    folder = built[name]
    assert not list(folder.rglob("*.py")) and not (folder / "teacher_tokenizer.json").exists()
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= {
        p.name for p in folder.iterdir()
    }
    config = json.loads((folder / "config.json").read_text())
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert "auto_map" not in config and "auto_map" not in tokenizer_config
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tokenizer_config["model_max_length"] == config["max_position_embeddings"] == 64
    assert config["vocab_size"] == BYTES.alphabet_size + (2 if name == "chat" else 0)
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == ([BYTES.eos, END_OF_TURN] if name == "chat" else BYTES.eos)
    card = (folder / "README.md").read_text()
    assert "trust_remote_code=True" not in card and "AutoTokenizer.from_pretrained(repo)" in card
    assert ("apply_chat_template" in card) == (name == "chat")


LOAD = r"""
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer

folder, chat = sys.argv[1], sys.argv[2] == "chat"
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModelForCausalLM.from_pretrained(folder)
ours = sorted(m for m in sys.modules if m.split(".")[0] in ("bytestream", "students", "bytedistill", "distill",
              "logit_store", "common", "configs", "tests"))
text = "naïve 🙂 <eos> 東京\x00\t"
ids = tokenizer(text).input_ids
out = {"ours": ours, "model": type(model).__name__, "ids": ids, "decoded": tokenizer.decode(ids, skip_special_tokens=True)}
out["invalid"] = tokenizer.decode([104, 0xFF, 0xC3, 105, 0xE2, 0x82])

def greedy(prompts, n=16):
    inputs = tokenizer(prompts, return_tensors="pt", padding=True)
    output = model.generate(**inputs, max_new_tokens=n, do_sample=False)
    return inputs.input_ids.tolist(), [row.tolist() for row in output[:, inputs.input_ids.shape[1]:]]

out["alone"] = [greedy([p])[1][0] for p in ("In the begi", "Grüße aus Kö")]
out["batch_inputs"], out["batch"] = greedy(["In the begi", "Grüße aus Kö"])
if chat:
    messages = [{"role": "user", "content": "Hi there"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    # the end of turn made certain: generate must stop there, by the folder's generation config alone
    ended = model.generate(**inputs, max_new_tokens=20, do_sample=False, sequence_bias={(260,): 100.0})
    out["chat_ids"] = inputs["input_ids"][0].tolist()
    out["chat_new"] = ended[0, inputs["input_ids"].shape[1]:].tolist()
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", ["plain", "chat"])
def test_a_fresh_process_loads_generates_and_chats_without_remote_code(built, name, tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRUST_REMOTE_CODE", "HF_TRUST_REMOTE_CODE")}
    done = subprocess.run(
        [sys.executable, "-c", LOAD, str(built[name]), name],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["ours"] == [] and out["model"] == "LlamaForCausalLM"
    text = "naïve 🙂 <eos> 東京\x00\t"
    if name == "plain":  # any text is its bytes, exactly, after <bos>
        assert out["ids"] == [BYTES.bos, *text.encode()] and out["decoded"] == text
    assert out["invalid"] == b"h\xff\xc3i\xe2\x82".decode("utf-8", errors="replace") == "h\ufffd\ufffdi\ufffd"
    assert out["batch"] == out["alone"]  # the left-padded batch gives each prompt what it gets alone
    assert out["batch_inputs"][0][:2] == [BYTES.pad, BYTES.pad] and out["batch_inputs"][1][0] == BYTES.bos
    assert all(0 <= s < BYTES.alphabet_size for row in out["alone"] for s in row)
    if name == "chat":
        assert out["chat_ids"][:2] == [BYTES.bos, BYTES.alphabet_size] and out["chat_new"] == [END_OF_TURN]


def test_the_chat_template_gives_the_stream_the_student_was_trained_on(built):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(built["chat"])
    ids = tokenizer.apply_chat_template(CONVERSATION, return_dict=False)
    stored = LogitStore(built["root"] / "chat-store").document(0).layout.symbols.astype(int)
    assert ids + [BYTES.eos] == bytes_symbols(stored).tolist()


def test_generate_needs_no_healing_whatever_the_cut(built, capsys):
    """Every cut of a text is a prefix of the text's own stream, and ``generate`` (the engine) continues
    it with what the stock ``model.generate`` gives the folder's own tokenizer's ids."""
    import torch
    from transformers import AutoTokenizer

    from students.release.generate import load_folder
    from students.release.generate_options import GenerateOptions
    from students.serving.offline import generate_batch

    model, tokenizer = load_folder(built["plain"])
    stock = AutoTokenizer.from_pretrained(built["plain"])
    text = "In the beginning 🙂"
    whole, _ = tokenizer.encode_prompt(text.encode())
    cuts = [text[:k] for k in (5, 9, 10, 12, len(text))]
    options = GenerateOptions(max_new_bytes=12, greedy=True)
    continued = generate_batch(model, tokenizer, cuts, options)
    for cut, got in zip(cuts, continued):
        symbols, open_bytes = tokenizer.encode_prompt(cut.encode())
        assert open_bytes == b"" and symbols == whole[: len(symbols)] == stock(cut).input_ids
        with torch.no_grad():
            ids = torch.tensor([symbols])
            want = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
        assert got == bytes(want[0, len(symbols) :].tolist())
    assert cli_main(["generate", str(built["plain"]), "--prompt", cuts[1], "--greedy", "--max-new-bytes", "12"]) == 0
    assert (
        capsys.readouterr().out.encode() == (cuts[1].encode() + continued[1]).decode(errors="replace").encode() + b"\n"
    )


def test_score_reads_the_text_and_the_fused_store_as_one_bytes_stream(built, tmp_path):
    """The fused store, its flags summed, and the same texts through the folder's tokenizer score alike;
    the store adds the teacher's bytes-stream BPB."""
    from students.release.score import score
    from students.release.score_options import ScoreOptions

    (tmp_path / "texts.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    options = ScoreOptions(progress=False)
    on_store, _ = score(built["plain"], [built["store"]], options)
    on_text, _ = score(built["plain"], [tmp_path / "texts.jsonl"], options)
    assert on_store.bytes == on_text.bytes == sum(len(t.encode()) for t in TEXTS)
    assert on_store.documents == on_text.documents == len(TEXTS)
    assert on_store.student_nll == pytest.approx(on_text.student_nll, rel=1e-5)
    assert on_text.teacher_nll is None and math.isfinite(on_store.teacher_nll) and on_store.teacher_nll > 0


def test_chat_serve_and_push_run_the_plain_folder(built, capsys, monkeypatch):
    import io

    import openai

    from students.release.chat import answers
    from students.release.generate import generate_bytes, load_folder
    from students.release.generate_options import GenerateOptions
    from students.release.push import check_loadable
    from students.serving.server import Server, load_served
    from tests.test_serve import OPTIONS

    for name in ("plain", "chat"):
        check_loadable(built[name])
    messages = [{"role": "user", "content": "Hi there"}]
    model, tokenizer = load_folder(built["chat"])
    options = GenerateOptions(max_new_bytes=16, greedy=True)
    expected = answers(model, tokenizer, [messages], options)[0]
    assert (
        cli_main(
            ["generate", str(built["chat"]), "--chat", "--prompt", "Hi there", "--greedy", "--max-new-bytes", "16"]
        )
        == 0
    )
    assert expected in capsys.readouterr().out
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi there\n"))
    assert cli_main(["chat", str(built["chat"]), "--greedy", "--max-new-bytes", "16"]) == 0
    assert capsys.readouterr().out == expected + "\n"
    assert cli_main(["chat", str(built["plain"])]) == 2
    assert "is not a chat student" in capsys.readouterr().err
    for name in ("plain", "chat"):
        running = Server(load_served(built[name], replace(OPTIONS, model_name=name))).start()
        try:
            client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
            answer = client.completions.create(model=name, prompt="In the begi", max_tokens=12, temperature=0)
            served = running.served
            want = generate_bytes(
                served.engine.model, served.tokenizer, "In the begi", replace(options, max_new_bytes=12)
            )
            assert answer.choices[0].text == want.decode("utf-8", errors="replace")
            if name == "chat":
                reply = client.chat.completions.create(model=name, messages=messages, max_tokens=16, temperature=0)
                assert reply.choices[0].message.content == expected
        finally:
            running.stop()


@pytest.mark.slow
def test_lm_eval_runs_the_plain_folder_without_remote_code(built, tmp_path, monkeypatch):
    """lm-evaluation-harness's ``hf`` model on the folder, no ``trust_remote_code``: a rolling loglikelihood
    of a document within one window (``add_bos_token=False``, as the card says) is ``score --packed false``'s
    NLL less its ``<eos>`` term (which the harness does not score), and its greedy ``generate_until`` from a mid-word prompt continues as
    ``generate --greedy`` does."""
    lm_eval = pytest.importorskip("lm_eval")
    import torch
    from lm_eval.tasks import TaskManager

    from students.release.generate import generate_bytes, load_folder
    from students.release.generate_options import GenerateOptions
    from students.release.score import score
    from students.release.score_options import ScoreOptions

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    texts, prompts = TEXTS[1:], ["Grüße aus K", "def f(x): ret"]  # within the 64-symbol context
    (tmp_path / "docs.jsonl").write_text(
        "".join(json.dumps({"text": t, "prompt": p}) + "\n" for t, p in zip(texts, prompts))
    )
    common = (
        f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tmp_path / 'docs.jsonl'}\ntest_split: test\n"
    )
    (tmp_path / "rolling.yaml").write_text(
        f"task: bytes_rolling\n{common}output_type: loglikelihood_rolling\n"
        'doc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: bits_per_byte\n    aggregation: bits_per_byte\n    higher_is_better: false\n"
    )
    (tmp_path / "until.yaml").write_text(
        f"task: bytes_until\n{common}output_type: generate_until\n"
        'doc_to_text: "{{prompt}}"\ndoc_to_target: ""\n'
        "generation_kwargs:\n  until: []\n  do_sample: false\n  max_gen_toks: 12\n"
        "metric_list:\n  - metric: exact_match\n"
    )
    tasks = TaskManager(include_path=str(tmp_path), include_defaults=False)

    def samples(task: str, model_args: str) -> list[dict]:
        results = lm_eval.simple_evaluate(
            model="hf",
            model_args=model_args,
            tasks=[task],
            task_manager=tasks,
            batch_size=2,
            device="cpu",
            log_samples=True,
        )
        return results["samples"][task]

    # as the card says: add_bos_token=False for rolling loglikelihood (the harness reads its own <bos> first)
    rolling = samples("bytes_rolling", f"pretrained={built['plain']},add_bos_token=False")
    until = samples("bytes_until", f"pretrained={built['plain']}")
    model, tokenizer = load_folder(built["plain"])
    harness_nll = {s["doc"]["text"]: -s["filtered_resps"][0] for s in rolling}
    for k, text in enumerate(texts):
        (tmp_path / f"doc{k}.jsonl").write_text(json.dumps({"text": text}) + "\n")
        ours = score(built["plain"], [tmp_path / f"doc{k}.jsonl"], ScoreOptions(packed=False, progress=False))[0]
        ids = torch.tensor([[BYTES.bos, *text.encode()]])
        with torch.no_grad():
            end = -torch.log_softmax(model(input_ids=ids).logits[0, -1].float(), -1)[BYTES.eos].item()
        assert harness_nll[text] == pytest.approx(ours.student_nll - end, rel=1e-5)
    options = GenerateOptions(max_new_bytes=12, greedy=True)
    harness_text = {s["doc"]["prompt"]: s["resps"][0][0] for s in until}
    for prompt in prompts:
        assert harness_text[prompt] == generate_bytes(model, tokenizer, prompt, options).decode(errors="replace")


@pytest.mark.slow
def test_llama_cpp_runs_the_trained_students_gguf_as_transformers_runs_the_folder(built, tmp_path):
    """``export-gguf`` of the students the pipeline trained: llama.cpp reads a text as the folder's
    tokenizer does, gives the same next-byte distributions (f32), and answers a conversation through
    its own chat path (the GGUF's template: SmolLM2's, as the store recorded it) as ``chat`` does."""
    pytest.importorskip("llama_cpp")
    import numpy as np
    import torch

    from students.release.chat import answers
    from students.release.generate import load_folder
    from students.release.generate_options import GenerateOptions
    from tests.test_gguf_parity import F32_KL_BITS, kl_bits, llama

    for name in ("plain", "chat"):
        gguf = tmp_path / f"{name}.gguf"
        assert cli_main(["export-gguf", str(built[name]), str(gguf), "--type", "f32"]) == 0
        model, tokenizer = load_folder(built[name])
        text = "".join(TEXTS)
        with llama(gguf) as runtime:
            ids = runtime.tokenize(text.encode())
            assert ids == [BYTES.bos, *text.encode()]
            runtime.eval(ids)
            theirs = np.array(runtime.scores[: len(ids)], dtype=np.float64)
            with torch.no_grad():
                ours = model(input_ids=torch.tensor([ids])).logits[0].double().numpy()
            assert ours.shape == theirs.shape and kl_bits(ours, theirs).max() <= F32_KL_BITS
            if name == "chat":
                messages = [{"role": "user", "content": "Hi there"}]
                expected = answers(model, tokenizer, [messages], GenerateOptions(max_new_bytes=16, greedy=True))[0]
                reply = runtime.create_chat_completion(
                    messages=messages, max_tokens=16, temperature=0.0, top_k=1, repeat_penalty=1.0, seed=0
                )
                assert reply["choices"][0]["message"]["content"] == expected and expected
