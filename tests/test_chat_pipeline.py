"""A chat student end to end: conversations dumped with a tiny GGUF teacher (SmolLM2's first ids,
its real ``<|im_start|>``/``<|im_end|>`` specials, a ChatML template given with ``--chat-template``),
the training windows' roles and the assistant-only loss mask against a hand-computed one, then a
flat and a patched student trained on the assistant's turns (cross-entropy: every answer is
"OK.", which a tiny student learns in a few dozen steps), exported, and used the ways a user
would: ``apply_chat_template`` + ``generate`` stopping at the end-of-turn symbol (flat with no
remote code, patched with the folder's), ``bytedistill chat`` through standard input, ``generate
--chat``, ``score`` and lm-evaluation-harness with its chat template."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bytedistill.cli import main as bytedistill
from tests.gguf_teachers import write_tiny_gguf
from tests.test_chat_student import CHATML

pytestmark = pytest.mark.slow

QUESTIONS = [
    "What is two and two?",
    "Name a colour.",
    "Say hello.",
    "Count to three.",
    "Is the sky blue?",
    "Où est Paris ?",
]
SYSTEM = {"role": "system", "content": "Be brief."}
ANSWER = "OK."
IM_START, IM_END = 515, 516  # the fused stream's reserved symbols: 515 + their index
SHAPE = ["--seq-len", "64", "--batch-size", "4", "--max-steps", "120", "--lr", "1e-2", "--alpha", "0"]
SHAPE += ["--eval-every", "0", "--checkpoint-every", "0", "--progress", "false"]


def conversation(question: str) -> dict:
    return {"messages": [SYSTEM, {"role": "user", "content": question}, {"role": "assistant", "content": ANSWER}]}


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    teacher = write_tiny_gguf(root / "tiny.gguf")
    (root / "chatml.jinja").write_text(CHATML, encoding="utf-8")
    (root / "train.jsonl").write_text("".join(json.dumps(conversation(q)) + "\n" for q in QUESTIONS))
    heldout = [
        conversation("Why?"),
        {"messages": [{"role": "user", "content": "Und jetzt?"}, {"role": "assistant", "content": ANSWER}]},
    ]
    (root / "heldout.jsonl").write_text("".join(json.dumps(c) + "\n" for c in heldout))
    for name in ("train", "heldout"):
        args = [
            "dump",
            "--teacher",
            str(teacher),
            "--corpus",
            str(root / f"{name}.jsonl"),
            "--output",
            str(root / name),
        ]
        args += ["--chat", "--chat-template", str(root / "chatml.jinja"), "--max-length", "64", "--stride", "16"]
        assert bytedistill([*args, "--progress", "false"]) == 0
    return root


def test_windows_carry_roles_and_loss_on_assistant_masks_exactly_the_assistant_targets(stores):
    from students.training.loss import counted_targets
    from students.training.store_windows import PackedStreamDataset

    dataset = PackedStreamDataset([stores / "train"], seq_len=48, batch_size=64, shuffle=False, with_teacher=True)
    batch = next(iter(dataset.loader()))
    assert batch["roles"].dtype == torch.uint8 and batch["roles"].shape == batch["target_ids"].shape
    assert batch["target_probs"].shape[-1] == 517
    inputs = batch["input_ids"].reshape(-1).tolist()
    # by hand: after each "<|im_start|>assistant\n" come the answer's bytes and its <|im_end|>; those
    # targets and no other are the assistant's
    expected = np.zeros(len(inputs), dtype=bool)
    for i, symbol in enumerate(inputs):
        if symbol == IM_START and bytes(s % 256 for s in inputs[i + 1 : i + 11]) == b"assistant\n":
            start = i + 11  # the answer's first symbol; the target predicting it sits one position earlier
            assert bytes(s % 256 for s in inputs[start : start + 3]) == ANSWER.encode() and inputs[start + 3] == IM_END
            expected[start - 1 : start + 3] = True
    assert expected.sum() == 4 * len(QUESTIONS)
    assert counted_targets(batch, "assistant").reshape(-1).numpy().tolist() == expected.tolist()
    assert counted_targets(batch, "all").reshape(-1).tolist() == batch["loss_mask"].reshape(-1).tolist()


def train_and_export(stores: Path, architecture: str) -> Path:
    run, folder = stores / f"run-{architecture}", stores / f"model-{architecture}"
    args = ["train", "--train-stores", str(stores / "train"), "--eval-store", str(stores / "heldout")]
    args += ["--output-dir", str(run), "--architecture", architecture, "--stream", "fused", *SHAPE]
    args += ["--loss-on", "assistant"]  # a random teacher's prompts teach nothing: 120 steps for the answers alone
    if architecture == "flat":
        args += ["--preset", "tiny", "--hidden-size", "32", "--num-layers", "2", "--num-heads", "2"]
    assert bytedistill(args) == 0
    assert bytedistill(["export", str(run), str(folder)]) == 0
    return folder


def stock_answer(model, tokenizer, messages) -> list[int]:
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=40, do_sample=False)
    return output[0, inputs["input_ids"].shape[1] :].tolist()


def test_flat_chat_student_end_to_end(stores, tmp_path, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = train_and_export(stores, "flat")
    metrics = [json.loads(line) for line in (stores / "run-flat" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["assistant_student_bpb"] < 0.5 < metrics[0]["assistant_student_bpb"]
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == [513, IM_END]
    assert "## Chatting" in (folder / "README.md").read_text()
    assert not json.loads((folder / "config.json").read_text()).get("auto_map")  # a stock Llama

    model = AutoModelForCausalLM.from_pretrained(folder).eval()  # no remote code for the model
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    new = stock_answer(model, tokenizer, [SYSTEM, {"role": "user", "content": "Say hello."}])
    assert new[-1] == IM_END and tokenizer.decode(new, skip_special_tokens=True) == ANSWER

    card = (folder / "README.md").read_text()
    code = re.search(r"## Chatting.*?```python\n(.*?)```", card, re.DOTALL).group(1)
    capsys.readouterr()
    scope: dict = {}
    exec(code.replace('"your-name/byte-student"', repr(str(folder))), scope)  # noqa: S102 - the card's own chat snippet
    roles = [message["role"] for message in scope["messages"]]  # a conversation longer than the context
    assert roles == ["user", "assistant"] * 3 + ["user"] and capsys.readouterr().out.strip()
    assert (
        len(tokenizer.apply_chat_template(scope["messages"], return_dict=False)) > model.config.max_position_embeddings
    )

    script = "import sys; from bytedistill.cli import main; sys.exit(main(sys.argv[1:]))"
    chat = subprocess.run(  # noqa: PLW1510 (its status is checked below)
        [sys.executable, "-c", script, "chat", str(folder), "--greedy", "--system", "Be brief."],
        input="Say hello.\n\nName a colour.\n",
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout == f"{ANSWER}\n{ANSWER}\n"  # one answer per user line, the empty line skipped

    from students.release.chat import Conversation, chat_stream
    from students.release.generate import load_folder
    from students.release.generate_options import GenerateOptions

    student, stream_tokenizer = load_folder(folder)
    talk = Conversation(student, stream_tokenizer, GenerateOptions(greedy=True), [SYSTEM])
    written: list[str] = []
    assert talk.reply("Say hello.", write=written.append) == ANSWER and "".join(written) == ANSWER
    talk.reply("Is the sky blue?")
    assert [m["role"] for m in talk.messages] == ["system", "user", "assistant", "user", "assistant"]
    assert chat_stream(stream_tokenizer, talk.messages).count(IM_END) == 5  # the history is read each turn

    capsys.readouterr()
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Say hello.\nCount to three.\n")
    status = bytedistill(
        ["generate", str(folder), "--chat", "--prompts-file", str(prompts), "--greedy", "--system", "Be brief."]
    )
    assert status == 0 and capsys.readouterr().out == f"{ANSWER}\n{ANSWER}\n"

    from students.release.score import score
    from students.release.score_options import ScoreOptions

    scored = score(folder, [stores / "heldout"], ScoreOptions(progress=False))[-1]
    assert scored.student_bpb == pytest.approx(metrics[-1]["student_bpb"], rel=1e-4)

    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "qs.jsonl").write_text("\n".join(json.dumps({"question": q, "answer": ANSWER}) for q in QUESTIONS[:2]))
    (tmp_path / "chat.yaml").write_text(
        "task: bytedistill_chat\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {tmp_path / 'qs.jsonl'}\n"
        'test_split: test\noutput_type: generate_until\ndoc_to_text: "{{question}}"\ndoc_to_target: "{{answer}}"\n'
        "generation_kwargs:\n  until: ['\\u0000']\n  do_sample: false\n  max_gen_toks: 8\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n"
    )
    results = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={folder},trust_remote_code=True",
        tasks=["bytedistill_chat"],
        task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
        batch_size=2,
        device="cpu",
        apply_chat_template=True,
        system_instruction="Be brief.",
    )
    assert results["results"]["bytedistill_chat"]["exact_match,none"] == 1.0


def test_patched_chat_student_end_to_end(stores):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = train_and_export(stores, "patched")
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    messages = [SYSTEM, {"role": "user", "content": "Count to three."}]
    new = stock_answer(model, tokenizer, messages)
    assert new[-1] == IM_END and tokenizer.decode(new, skip_special_tokens=True) == ANSWER
    # the rendered text through tokenizer(text): the folder's generate heals its last word, same answer
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = tokenizer(text, return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=40, do_sample=False)
    assert output[0, inputs["input_ids"].shape[1] :].tolist() == new
