"""On-policy training (docs/DESIGN.md, "On-policy distillation") with a tiny random teacher over a
2,000-id byte-level BPE and tiny students: the teacher's token ends replace the student's in what
it wrote, the teacher's distributions on a text equal a dump of that text in both streams, β = 0 / 1
are the forward / reverse KL, a resumed on-policy run ends with the weights of an uninterrupted
one, and a teacher that is not the store's is refused in one line."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bytedistill.cli import main as cli_main
from bytestream.stream_kind import StreamKind
from distill.teacher.windows import Reading
from logit_store import LogitStore
from logit_store.manifest import read_manifest
from students.models.architectures import student_cost
from students.training.checkpoints import ANSWERS, latest_checkpoint
from students.training.on_policy import OnPolicy, on_policy_row, written_by_student
from students.training.on_policy_config import OnPolicyConfig
from students.training.on_policy_loss import generalized_jsd
from students.training.on_policy_teacher import ScoringTeacher
from students.training.on_policy_writer import Answer, prompt_of
from students.training.trainer import train
from tests.gguf_teachers import save_small_teacher, write_tiny_gguf
from tests.launch import cpu_launch
from tests.teachers import dump_args, save_tiny_teacher
from tests.tiny_student import tiny_config

TEXTS = {
    "genesis.txt": b"In the beginning God created the heaven and the earth. And the earth was without form, and void;"
    b" and darkness was upon the face of the deep.",
    "light.txt": b"And God said, Let there be light: and there was light. And God saw the light, that it was good.",
    "waters.txt": b"And God called the firmament Heaven. And the evening and the morning were the second day.",
}
SCORED = b"In the beginning there were the heavens, and the earth thereafter: theirs, then there."


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("on-policy-teacher")
    return save_small_teacher(root / "teacher", write_tiny_gguf(root / "tiny.gguf"))


def _dump(teacher: Path, corpus: Path, out: Path, stream: str) -> Path:
    code = cli_main(dump_args(teacher, corpus, out, "--stream", stream, "--encoding", "float16"))
    assert code == 0
    return out


@pytest.fixture(scope="module")
def stores(teacher, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("on-policy-stores")
    (root / "corpus").mkdir()
    for name, data in TEXTS.items():
        (root / "corpus" / name).write_bytes(data)
    return {stream: _dump(teacher, root / "corpus", root / stream, stream) for stream in ("eot", "fused")}


def _on_policy(teacher_dir: Path, store: Path, stream: StreamKind, seq_len: int = 256) -> OnPolicy:
    from students.models.architectures import architecture_named
    from students.models.shape import StudentShape

    scoring = ScoringTeacher.load(str(teacher_dir), str(store), torch.device("cpu"))
    shape = StudentShape(
        stream=stream.value, preset="tiny", hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64
    )
    model = architecture_named("flat").build(shape, seq_len=seq_len, seed=0)
    config = OnPolicyConfig(share=1.0, max_bytes=32, teacher=str(teacher_dir))
    return OnPolicy(
        config,
        scoring,
        stream=stream,
        seq_len=seq_len,
        batch_size=1,
        grad_accum=1,
        seed=0,
        student_cost=student_cost(model),
    )


def test_the_teacher_tokenization_replaces_the_token_ends_the_student_wrote(teacher, stores):
    """The student wrote every byte of its answer as a token of its own; the sequence it trains on
    has the teacher's token ends (words of several bytes go on), counted from the answer on."""
    stream = StreamKind.FUSED
    op = _on_policy(teacher, stores["fused"], stream)
    prompt, text = b"In the beginning", b" there were the heavens"
    student = tuple(256 + b for b in text)  # every byte flagged "ends"
    (row,), kept = op.score([Answer(prompt, student, text, ended=False)])
    assert kept == [0]
    whole = op.teacher.layout(op.teacher.encode(prompt + text)).symbols.astype(np.int64)
    n = len(whole) - 1
    assert row["input_ids"][:n].tolist() == whole[:-1].tolist()
    answer_inputs = row["input_ids"][1 + len(prompt) : n]
    assert stream.text_bytes(answer_inputs) == text
    assert (answer_inputs < 256).any(), "the teacher's words go on past a byte: flags the student did not write"
    assert answer_inputs.tolist() != list(student)
    counted = np.flatnonzero(row["loss_mask"])
    assert counted[0] == len(prompt)  # the position that has read the whole prompt predicts the answer
    assert counted[-1] == n - 2  # the cut answer's final <eos> is not the student's: not counted
    assert row["target_ids"][n - 1] == stream.eos


def test_an_eot_answer_keeps_the_teachers_eot_marks(teacher, stores):
    stream = StreamKind.EOT
    op = _on_policy(teacher, stores["eot"], stream)
    prompt, text = b"And God", b" said there"
    student = tuple(s for b in text for s in (b, 256))  # an <eot> after every byte
    (row,), _ = op.score([Answer(prompt, student, text, ended=True)])
    whole = op.teacher.layout(op.teacher.encode(prompt + text)).symbols.astype(np.int64)
    assert row["input_ids"][: len(whole) - 1].tolist() == whole[:-1].tolist()
    assert (row["input_ids"] == 256).sum() < len(text)
    assert row["loss_mask"][len(whole) - 2]  # it wrote <eos> itself: that target counts


@pytest.mark.parametrize("stream", ["eot", "fused"])
def test_the_teachers_distributions_on_a_text_equal_a_dump_of_it(stream, teacher, tmp_path):
    """The Numba conversion (a CPU teacher's) against the store, and the device path against it."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "text.txt").write_bytes(SCORED)
    store = _dump(teacher, corpus, tmp_path / "store", stream)
    stored = LogitStore(store).document(0)
    op = _on_policy(teacher, store, StreamKind(stream))
    (scored,) = op.teacher.score([SCORED], [op.teacher.encode(SCORED)])
    assert scored.layout.symbols.tolist() == stored.layout.symbols.tolist()
    np.testing.assert_allclose(scored.dense(), stored.dense(), atol=2e-3, rtol=2e-3)  # the store's float16
    torch_path = ScoringTeacher.load(str(teacher), str(store), torch.device("cpu"), on_device=True)
    (on_device,) = torch_path.score([SCORED], [torch_path.encode(SCORED)])  # the path a GPU teacher takes
    np.testing.assert_allclose(on_device.dense(), scored.dense(), atol=1e-9, rtol=1e-6)
    row = on_policy_row(scored, Answer(b"", (), SCORED, True), 256, StreamKind(stream))
    n = scored.layout.num_positions
    np.testing.assert_allclose(row["probs"][:n], scored.dense(), rtol=1e-6)


def test_on_policy_reads_with_the_stream_and_windows_the_dump_recorded(teacher, tmp_path):
    """A store dumped in short windows: the scoring teacher reads back the reading the dump recorded
    in the manifest (its stream, max_length and stride), cuts a text into the same several windows
    and gives the store's values."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "text.txt").write_bytes(SCORED)
    store = tmp_path / "store"
    assert cli_main(dump_args(teacher, corpus, store, "--max-length", "12", "--stride", "3", "--stream", "eot")) == 0
    scoring = ScoringTeacher.load(str(teacher), str(store), torch.device("cpu"))
    assert scoring.reading == Reading(StreamKind.EOT, 12, 3) == Reading.of_manifest(read_manifest(store))
    ids = scoring.encode(SCORED)
    assert len(scoring.reader.document(ids).windows) > 2
    (scored,) = scoring.score([SCORED], [ids])
    stored = LogitStore(store).document(0)
    assert scored.layout.symbols.tolist() == stored.layout.symbols.tolist()
    np.testing.assert_allclose(scored.dense(), stored.dense(), atol=2e-3, rtol=2e-3)


def _by_hand(p: np.ndarray, q: np.ndarray, beta: float) -> float:
    """The divergence of one position, term by term in float64."""
    if beta == 0:
        return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q) if pi > 0)
    support = p > 0
    if beta == 1:
        mass = q[support].sum()
        return sum(qi / mass * math.log(qi / mass / pi) for pi, qi in zip(p[support], q[support])) - math.log(mass)
    m = beta * p + (1 - beta) * q
    kl_p = sum(pi * math.log(pi / mi) for pi, mi in zip(p, m) if pi > 0)
    kl_q = sum(qi * math.log(qi / mi) for qi, mi in zip(q, m))
    return beta * kl_p + (1 - beta) * kl_q


@pytest.mark.parametrize("beta", [0.0, 1.0, 0.3])
def test_beta_gives_forward_reverse_and_the_mixture_divergence(beta):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 7))
    q = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    p = rng.random((3, 7))
    p[0] = p[0] / p[0].sum()  # full support
    p[1:, [1, 4]] = 0.0  # sparse supports: the student has mass off them
    p[1:] /= p[1:].sum(-1, keepdims=True)
    got = generalized_jsd(torch.tensor(p), torch.log_softmax(torch.tensor(logits), -1), beta).numpy()
    want = [_by_hand(p[i], q[i], beta) for i in range(3)]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    if beta == 1.0:  # with the whole alphabet as support it is KL(q || p) itself
        assert got[0] == pytest.approx(float((q[0] * np.log(q[0] / p[0])).sum()), rel=1e-10)
    if beta == 0.0:
        assert got[0] == pytest.approx(float((p[0] * np.log(p[0] / q[0])).sum()), rel=1e-10)


def test_the_divergence_has_finite_gradients_off_the_support():
    p = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    logits = torch.zeros(1, 4, requires_grad=True)
    for beta in (0.0, 0.5, 1.0):
        logits.grad = None
        generalized_jsd(p, torch.log_softmax(logits, -1), beta).sum().backward()
        assert torch.isfinite(logits.grad).all()
        assert logits.grad[0, 2] > 0  # mass off the support is pushed down


def test_the_share_of_written_sequences_is_lambda_over_a_splits_windows():
    assert [written_by_student(0.5, j) for j in range(4)] == [False, True, False, True]
    assert sum(written_by_student(0.3, j) for j in range(160)) == 48
    assert not any(written_by_student(0.0, j) for j in range(16))
    assert all(written_by_student(1.0, j) for j in range(16))


def test_a_prompt_is_a_windows_text_cut_before_a_word():
    stream = StreamKind.EOT
    inputs = np.array([stream.bos, *b"ab", 256, *b" cd", 256, *b" ef", 256, stream.eos, *b"zz"])
    assert prompt_of(inputs, stream, 100) == b"ab cd"
    assert prompt_of(inputs, stream, 4) == b"ab"


def _run(out: Path, store: Path, teacher_dir: Path, **overrides):
    values = {
        "train_stores": [str(store)],
        "seq_len": 64,
        "batch_size": 2,
        "max_steps": 4,
        "warmup_steps": 1,
        "lr": 3e-3,
        "on_policy": 0.5,
        "on_policy_beta": 0.5,
        "on_policy_bytes": 12,
        "teacher": str(teacher_dir),
        "checkpoint_every": 2,
        "log_every": 1,
        **overrides,
    }
    return train(tiny_config(out, **values))


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(latest_checkpoint(out) / "model.safetensors")


def _answers(out: Path) -> list[dict]:
    """The logging steps' records: step, loss and the answers written."""
    return [json.loads(line) for line in (out / ANSWERS).read_text().splitlines()]


def test_a_stopped_on_policy_run_resumes_to_the_weights_of_an_uninterrupted_one(teacher, stores, tmp_path, capsys):
    whole = _run(tmp_path / "whole", stores["fused"], teacher)
    assert whole.step == 4
    printed = capsys.readouterr().out
    assert "on-policy (lambda 0.5, beta 0.5): per step" in printed and "teacher forward" in printed
    _run(tmp_path / "resumed", stores["fused"], teacher, stop_at_step=2)
    assert latest_checkpoint(tmp_path / "resumed").name == "step-00000002"
    resumed = _run(tmp_path / "resumed", stores["fused"], teacher, resume="latest")
    assert resumed.losses == {k: v for k, v in whole.losses.items() if k > 2}
    assert _answers(tmp_path / "resumed") == _answers(tmp_path / "whole")  # the same answers, no sampling state
    first, second = _weights(tmp_path / "whole"), _weights(tmp_path / "resumed")
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_a_teacher_that_is_not_the_stores_is_refused_in_one_line(teacher, stores, tmp_path, capsys):
    from bytestream.vocab import load_teacher_tokenizer

    tokenizer = load_teacher_tokenizer(teacher)
    other = save_tiny_teacher(tmp_path / "other", tokenizer, tokenizer.vocab_size, seed=1)
    out = tmp_path / "run"
    capsys.readouterr()
    args = [
        "train",
        "--train-stores",
        str(stores["eot"]),
        "--output-dir",
        str(out),
        "--max-steps",
        "1",
        "--seq-len",
        "64",
        "--on-policy-bytes",
        "8",
        "--on-policy",
        "0.5",
        "--teacher",
        str(other),
        "--progress",
        "false",
    ]
    assert cli_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not the teacher the store" in err[0], err
    assert err[0].startswith("bytedistill train: error: ")
    assert not out.exists()
    assert cli_main([*args[:-4], "--progress", "false"]) == 2
    assert "--on-policy needs --teacher" in capsys.readouterr().err
    too_long = [*args[:-2], "--on-policy-bytes", "64", "--progress", "false"]
    too_long[too_long.index("--teacher") + 1] = str(teacher)
    assert cli_main(too_long) == 2
    assert "does not fit a --seq-len 64 sequence" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
def test_one_and_two_processes_write_the_same_answers_and_train_the_same_weights(teacher, stores, tmp_path):
    """The same run's sequences, once in one process (two loader workers: two splits, two
    micro-batches a step) and once under ``accelerate launch`` as two (one split and one micro-batch
    each): every rank loads the teacher and writes and scores its own share, and the answers, the
    loss of every step and the final weights are the same."""
    settings = {"seq_len": 64, "batch_size": 4, "max_steps": 3, "on_policy": 0.5, "on_policy_bytes": 12}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each launched rank runs
    try:
        one = _run(tmp_path / "one", stores["fused"], teacher, num_workers=2, grad_accum=2, **settings)
    finally:
        torch.set_num_threads(threads)
    launch, env = cpu_launch(2)
    out = tmp_path / "two"
    args = ["-m", "bytedistill", "train", "--train-stores", str(stores["fused"]), "--output-dir", str(out)]
    args += ["--preset", "tiny", "--hidden-size", "32", "--num-layers", "2", "--num-heads", "2"]
    args += ["--intermediate-size", "64", "--warmup-steps", "1", "--lr", "3e-3", "--on-policy-beta", "0.5"]
    args += ["--teacher", str(teacher), "--checkpoint-every", "2", "--log-every", "1", "--progress", "false"]
    args += [f"--{key.replace('_', '-')}={value}" for key, value in settings.items()]
    result = subprocess.run(launch + args, check=False, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "on-policy (lambda 0.5, beta 0.5): per step" in result.stdout
    records = {"one": _answers(tmp_path / "one"), "two": _answers(out)}
    assert [r["step"] for r in records["two"]] == [1, 2, 3]
    answers = [[(a["split"], a["window"], a["prompt"], a["answer"]) for a in r["answers"]] for r in records["two"]]
    assert {split for step in answers for split, *_ in step} == {0, 1}  # both ranks wrote
    assert answers == [
        [(a["split"], a["window"], a["prompt"], a["answer"]) for a in r["answers"]] for r in records["one"]
    ]
    assert [r["loss"] for r in records["two"]] == pytest.approx([one.losses[step] for step in (1, 2, 3)], rel=1e-5)
    first, second = _weights(tmp_path / "one"), _weights(out)
    for key in first:
        torch.testing.assert_close(first[key], second[key], rtol=1e-5, atol=1e-6)
