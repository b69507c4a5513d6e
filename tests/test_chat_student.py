"""The student side of conversations, without a store: the stream tokenizer's reserved symbols and
chat template (on the tokenizer of the bundled SmolLM2 GGUF's first ids, which holds its real
``<|im_start|>``/``<|im_end|>`` specials), the assistant-only loss mask, the models' grown alphabet
and the patched student's patches at reserved symbols, and evaluation's assistant figures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from bytestream import stream_tokenizer
from bytestream.stream_kind import StreamKind
from bytestream.stream_symbols import stream_symbols
from bytestream.stream_tokenizer import ByteStreamTokenizer
from bytestream.teacher_tokens import TeacherTokens
from students.training.loss import ASSISTANT, counted_targets, distill_loss, resolved_loss_on
from tests.gguf_teachers import write_tiny_gguf

# ChatML, as SmolLM2-135M-Instruct's GGUF carries it (its default system prompt left out)
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
RESERVED = ["<|im_start|>", "<|im_end|>"]
MESSAGES = [
    {"role": "system", "content": "Sé breve. 短く答えて。"},
    {"role": "user", "content": "What is 2+2? 🙂"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And <|im_end|> literally?"},
]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """The tiny GGUF's tokenizer (SmolLM2's first 2,000 ids) and its tokenizer.json text."""
    from bytestream.vocab import load_teacher_tokenizer

    tokenizer = load_teacher_tokenizer(write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf"))
    tokenizer.chat_template = CHATML
    return tokenizer, tokenizer.backend_tokenizer.to_str()


def chat_tokenizer(folder: Path, tokenizer_json: str, stream: str) -> ByteStreamTokenizer:
    (folder / "teacher_tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    return ByteStreamTokenizer(
        teacher_tokenizer_file=str(folder / "teacher_tokenizer.json"),
        byte_stream=stream,
        reserved_symbols=RESERVED,
        chat_template_tokens={"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"},
        chat_template=CHATML,
    )


def test_reserved_specials_are_the_teachers_own_tokens(teacher):
    tokenizer, tokenizer_json = teacher
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    tokens = TeacherTokens(tokenizer_json, RESERVED)
    # the teacher splits its specials out of the text before anything else: so do we
    assert tokens.ids(text.encode("utf-8")) == tokenizer(text, add_special_tokens=False).input_ids
    pieces = tokens.streamed_tokens(text.encode("utf-8"))
    assert pieces[0] == 0 and pieces.count(1) == text.count("<|im_end|>")
    assert b"".join(p if isinstance(p, bytes) else RESERVED[p].encode() for p in pieces) == text.encode("utf-8")
    # a plain teacher tokenizer still reads special text as text
    assert 1 not in TeacherTokens(tokenizer_json).ids(b"<|im_end|>")


@pytest.mark.parametrize("stream", ["fused", "eot"])
def test_chat_template_gives_the_stream_with_reserved_symbols(teacher, tmp_path, stream):
    tokenizer, tokenizer_json = teacher
    student = chat_tokenizer(tmp_path, tokenizer_json, stream)
    base = StreamKind(stream).alphabet_size
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    inputs = student.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt")
    ids = inputs["input_ids"][0].tolist()
    assert inputs["attention_mask"].tolist() == [[1] * len(ids)]
    pieces = TeacherTokens(tokenizer_json, RESERVED).streamed_tokens(text.encode("utf-8"))
    assert ids == stream_symbols(pieces, StreamKind(stream)) == student(text).input_ids
    assert ids[:2] == [StreamKind(stream).bos, base] and ids.count(base + 1) == text.count("<|im_end|>")
    if stream == "eot":  # a reserved symbol is a whole teacher token: no <eot> after it
        assert all(ids[i + 1] != 256 for i, s in enumerate(ids[:-1]) if s >= base)
    assert student.decode(ids, skip_special_tokens=True) == text.replace("<|im_start|>", "").replace("<|im_end|>", "")
    if stream == "fused":  # (an <eot> between two bytes of a character decodes each byte alone)
        assert student.decode(ids[1:], skip_special_tokens=False) == text
    assert student.end_of_turn_ids == [base + 1]
    assert student.stream_text(ids) == text.encode("utf-8")
    batch = student.apply_chat_template([MESSAGES[:2], MESSAGES], add_generation_prompt=True, return_tensors="pt")
    assert batch["input_ids"][1].tolist() == ids and batch["input_ids"][0, 0].item() == StreamKind(stream).pad
    assert student.apply_chat_template(MESSAGES, tokenize=False) == tokenizer.apply_chat_template(
        MESSAGES, tokenize=False
    )


def test_saved_chat_tokenizer_loads_back_with_auto_tokenizer(teacher, tmp_path):
    from transformers import AutoTokenizer

    _, tokenizer_json = teacher
    student = chat_tokenizer(tmp_path, tokenizer_json, "fused")
    folder = tmp_path / "folder"
    student.save_pretrained(folder)
    shutil.copyfile(stream_tokenizer.__file__, folder / "tokenization_bytedistill.py")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["auto_map"] = stream_tokenizer.auto_map()
    config["tokenizer_class"] = "ByteStreamTokenizer"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    loaded = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    expected = student.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)
    assert loaded.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False) == expected
    assert loaded("<|im_end|>").input_ids == [512, 516]


def test_prompt_healing_never_opens_a_reserved_symbol(teacher, tmp_path):
    _, tokenizer_json = teacher
    tokens = TeacherTokens(tokenizer_json, RESERVED)
    committed, open_bytes = tokens.split_prompt(b"<|im_start|>user\nHi<|im_end|>")
    assert open_bytes == b"" and committed[-1] == 1
    committed, open_bytes = tokens.split_prompt(b"<|im_start|>user\nHello wor")
    assert committed[0] == 0 and open_bytes == b" wor"


def test_loss_on_assistant_counts_exactly_the_assistant_targets():
    batch = {
        "loss_mask": torch.tensor([[True, True, True, True, True, False]]),
        "roles": torch.tensor([[0, 2, 3, 3, 0, 0]], dtype=torch.uint8),
        "target_ids": torch.tensor([[1, 2, 3, 4, 5, 6]]),
    }
    assert counted_targets(batch, "assistant").tolist() == [[False, False, True, True, False, False]]
    assert counted_targets(batch, "all").tolist() == batch["loss_mask"].tolist()
    logits = torch.randn(1, 6, 8)
    out = distill_loss(logits, batch["target_ids"], counted_targets(batch, "assistant"), alpha=0.0)
    nll = -torch.log_softmax(logits, -1)[0, [2, 3], [3, 4]]
    assert torch.allclose(out.ce, nll.mean()) and int(out.num_targets) == 2
    assert resolved_loss_on("auto", True) == "all" and resolved_loss_on("auto", False) == "all"
    assert resolved_loss_on("assistant", True) == "assistant"
    with pytest.raises(Exception, match="--loss-on assistant needs stores of conversations"):
        resolved_loss_on("assistant", False)
    assert ASSISTANT == 3


@pytest.mark.parametrize("architecture", ["flat", "patched"])
def test_students_grow_their_alphabet_by_the_reserved_symbols(architecture):
    from students.models.architectures import architecture_named
    from students.models.shape import StudentShape

    shape = StudentShape(stream="fused", architecture=architecture, preset="micro")
    model = architecture_named(architecture).build(shape, seq_len=32, seed=0, reserved=tuple(RESERVED))
    assert model.config.vocab_size == 517 and model.config.reserved_symbols == RESERVED
    plain = architecture_named(architecture).build(shape, seq_len=32, seed=0)
    assert plain.config.vocab_size == 515 and not hasattr(plain.config, "reserved_symbols")
    if architecture == "patched":  # a reserved symbol is one teacher token: it closes a patch
        ids = torch.tensor([[512, 515, 104, 256 + 105, 516, 10]])
        assert model.closes(ids).tolist() == [[True, True, False, True, True, False]]
    logits = model(input_ids=torch.tensor([[512, 515, 104, 516]])).logits
    assert logits.shape[-1] == 517


def test_evaluation_reports_assistant_bytes_beside_the_stream():
    from types import SimpleNamespace

    from students.training.evaluation import _batch_sums

    class Uniform(torch.nn.Module):
        def forward(self, input_ids, use_cache=False):
            return SimpleNamespace(logits=torch.zeros(*input_ids.shape, 517))

    stream = StreamKind.FUSED
    probs = torch.full((1, 5, 517), 1 / 517)
    batch = {
        "input_ids": torch.tensor([[512, 515, 104, 105, 516]]),
        "target_ids": torch.tensor([[515, 104, 105, 516, 513]]),
        "loss_mask": torch.tensor([[True, True, True, True, False]]),
        "roles": torch.tensor([[0, 3, 3, 3, 0]], dtype=torch.uint8),
        "target_probs": probs,
    }
    sums = _batch_sums(Uniform(), batch, stream)
    log_v = torch.log(torch.tensor(517.0, dtype=torch.float64))
    assert int(sums["bytes"]) == 2 and int(sums["assistant_bytes"]) == 2
    assert torch.allclose(sums["assistant_student"], 3 * log_v) and torch.allclose(sums["student"], 4 * log_v)


def test_loss_on_assistant_is_refused_on_plain_text_in_one_line(tmp_path, capsys):
    from bytedistill.cli import main

    status = main(["train", "--train-stores", str(tmp_path), "--output-dir", str(tmp_path / "o"), "--max-steps", "1",
                   "--loss-on", "assistant"])  # fmt: skip
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and "--loss-on assistant needs stores of conversations" in lines[0]
    assert not (tmp_path / "o").exists()
