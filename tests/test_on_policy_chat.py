"""On-policy training on a store of conversations (docs/DESIGN.md, "On-policy distillation"), with a
tiny random teacher over SmolLM2's tokenizer and the bundled GGUF's chat template: the prompt is a
conversation up to an assistant turn, the student writes the turn until its end-of-turn special,
the teacher's distributions over it equal a ``dump --chat`` of the same conversation, the loss
counts exactly the assistant's positions, and a stopped run resumes to an uninterrupted one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bytedistill.cli import main as cli_main
from bytestream.stream_kind import StreamKind
from logit_store import LogitStore
from students.models.architectures import architecture_named, student_cost
from students.models.shape import StudentShape
from students.training.checkpoints import ANSWERS, latest_checkpoint
from students.training.loss import ASSISTANT
from students.training.on_policy import OnPolicy
from students.training.on_policy_config import OnPolicyConfig
from students.training.on_policy_teacher import ScoringTeacher
from students.training.on_policy_writer import Answer, chat_prompt_of, written
from students.training.trainer import train
from tests.gguf_teachers import write_tiny_gguf
from tests.teachers import dump_args
from tests.tiny_student import tiny_config

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello! How are you today?"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Where is Paris?"},
        {"role": "assistant", "content": "In France, by the river."},
    ],
    [
        {"role": "user", "content": "Say a word"},
        {"role": "assistant", "content": "Word."},
        {"role": "user", "content": "And another one"},
        {"role": "assistant", "content": "Yes, another."},
    ],
]
IM_END = 2  # <|im_end|>'s teacher id: the template's end of an assistant turn


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("on-policy-chat") / "tiny.gguf", chat_template=True)


def _chat_store(teacher: Path, root: Path, stream: str) -> Path:
    corpus = root / "chats.jsonl"
    corpus.write_text("".join(json.dumps({"messages": m}) + "\n" for m in CONVERSATIONS), encoding="utf-8")
    args = dump_args(teacher, corpus, root / f"store-{stream}", "--chat", "--stream", stream, "--encoding", "float16")
    assert cli_main(args) == 0
    return root / f"store-{stream}"


@pytest.fixture(scope="module")
def eot_store(teacher, tmp_path_factory) -> Path:
    return _chat_store(teacher, tmp_path_factory.mktemp("chat-store"), "eot")


def _on_policy(teacher: Path, store: Path, stream: StreamKind) -> OnPolicy:
    scoring = ScoringTeacher.load(str(teacher), str(store), torch.device("cpu"))
    shape = StudentShape(
        stream=stream.value, preset="tiny", hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64
    )
    model = architecture_named("flat").build(shape, seq_len=256, seed=0, reserved=("<|im_start|>", "<|im_end|>"))
    config = OnPolicyConfig(share=1.0, max_bytes=32, teacher=str(teacher))
    return OnPolicy(
        config,
        scoring,
        stream=stream,
        seq_len=256,
        batch_size=1,
        grad_accum=1,
        seed=0,
        student_cost=student_cost(model),
    )


@pytest.mark.parametrize("stream", StreamKind.stored_kinds(), ids=lambda s: s.value)
def test_the_teacher_on_a_written_turn_equals_a_chat_dump_of_the_conversation(teacher, eot_store, tmp_path, stream):
    """The student wrote the first conversation's answer and ended its turn: prompt + answer + end
    of turn, scored, is the dumped conversation up to that end of turn, position by position, and
    the positions counted are exactly the assistant's."""
    store = eot_store if stream is StreamKind.EOT else _chat_store(teacher, tmp_path, stream.value)
    stored = LogitStore(store).document(0)
    op = _on_policy(teacher, store, stream)
    assert op.stops == (stream.alphabet_size + 1,)  # <|im_end|>, the second reserved symbol
    symbols = stored.layout.symbols.astype(np.int64)
    prompt, specials = chat_prompt_of(symbols[:-1], np.asarray(stored.roles), stream, 1000, op.reserved)
    # the template's default system turn, the user's turn and the generation prompt, specials apart
    assert prompt.startswith(b"system\n") and prompt.endswith(b"\nuser\nHi there\nassistant\n")
    assert [teacher_id for _, teacher_id in specials] == [1, 2, 1, 2, 1]  # <|im_start|>, <|im_end|>, …
    text = CONVERSATIONS[0][1]["content"].encode()
    answer = Answer(prompt, (), text, True, specials, IM_END)
    ids = op.teacher.encode_pieces(answer.pieces())
    assert ids.tolist() == stored.token_ids[: len(ids)].tolist()  # as dump --chat tokenised it
    (scored,) = op.teacher.score([prompt + text], [ids])
    n = scored.layout.num_positions
    assert scored.layout.symbols[:-1].tolist() == symbols[:n].tolist()
    np.testing.assert_allclose(scored.dense(), stored.dense()[:n], atol=2e-3, rtol=2e-3)  # the store's float16
    wrote = (ord("a"), op.stops[0])  # what the student samples: a byte, then the end of its turn
    assert written([*wrote, ord("b")], stream, 32, op.stops) == (list(wrote), True)
    assert op.turn_end(Answer(prompt, wrote, b"a", True, specials)) == IM_END
    no_turn = np.zeros(len(symbols) - 1, dtype=np.uint8)  # a window inside one turn: nothing to write
    assert chat_prompt_of(symbols[:-1], no_turn, stream, 1000, op.reserved) is None
    (row,), kept = op.score([answer])
    assert kept == [0]
    assert row["loss_mask"][:n].tolist() == (np.asarray(stored.roles)[:n] == ASSISTANT).tolist()
    assert not row["loss_mask"][n:].any()


def _run(out: Path, store: Path, teacher: Path, **overrides):
    values = {
        "train_stores": [str(store)],
        "seq_len": 128,
        "batch_size": 2,
        "max_steps": 4,
        "warmup_steps": 1,
        "lr": 3e-3,
        "on_policy": 0.5,
        "on_policy_bytes": 12,
        "teacher": str(teacher),
        "checkpoint_every": 2,
        "log_every": 1,
        **overrides,
    }
    return train(tiny_config(out, **values))


def test_an_on_policy_run_on_conversations_writes_assistant_turns_and_resumes(teacher, eot_store, tmp_path):
    whole = _run(tmp_path / "whole", eot_store, teacher)
    assert whole.step == 4
    records = [json.loads(line) for line in (tmp_path / "whole" / ANSWERS).read_text().splitlines()]
    answers = [a for record in records for a in record["answers"]]
    assert answers and all(a["prompt"].endswith("<|im_start|>assistant\n") for a in answers)
    _run(tmp_path / "resumed", eot_store, teacher, stop_at_step=2)
    resumed = _run(tmp_path / "resumed", eot_store, teacher, resume="latest")
    assert resumed.losses == {k: v for k, v in whole.losses.items() if k > 2}
    first = load_file(latest_checkpoint(tmp_path / "whole") / "model.safetensors")
    second = load_file(latest_checkpoint(tmp_path / "resumed") / "model.safetensors")
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_a_bytes_student_on_policy_is_scored_with_the_teachers_fused_rows_summed(teacher, tmp_path):
    """On a fused chat store a bytes student writes in the bytes stream; the teacher scores prompt +
    answer in the fused stream as ``dump --chat`` does, and the training row is that stream with its
    flags dropped and its rows' halves summed, counting exactly the assistant's positions; a run trains."""
    from bytestream.bytes_stream import bytes_rows, bytes_symbols

    stream = StreamKind.BYTES
    store = _chat_store(teacher, tmp_path, "fused")
    stored = LogitStore(store).document(0)
    op = _on_policy(teacher, store, stream)
    assert op.stops == (stream.alphabet_size + 1,)  # <|im_end|>, the second reserved symbol: 260
    symbols = bytes_symbols(stored.layout.symbols.astype(np.int64))
    prompt, specials = chat_prompt_of(symbols[:-1], np.asarray(stored.roles), stream, 1000, op.reserved)
    assert prompt.startswith(b"system\n") and prompt.endswith(b"\nuser\nHi there\nassistant\n")
    text = CONVERSATIONS[0][1]["content"].encode()
    answer = Answer(prompt, (), text, True, specials, IM_END)
    (scored,) = op.teacher.score([prompt + text], [op.teacher.encode_pieces(answer.pieces())])
    n = scored.layout.num_positions
    (row,), kept = op.score([answer])
    assert kept == [0]
    assert row["input_ids"][:n].tolist() == symbols[:n].tolist()
    np.testing.assert_array_equal(row["probs"][:n], bytes_rows(scored.dense()).astype(np.float32))
    np.testing.assert_allclose(row["probs"][:n], bytes_rows(stored.dense())[:n], atol=2e-3, rtol=2e-3)
    assert row["loss_mask"][:n].tolist() == (np.asarray(stored.roles)[:n] == ASSISTANT).tolist()
    result = _run(tmp_path / "run", store, teacher, stream="bytes")
    assert result.step == 4
    records = [json.loads(line) for line in (tmp_path / "run" / ANSWERS).read_text().splitlines()]
    assert any(record["answers"] for record in records)
