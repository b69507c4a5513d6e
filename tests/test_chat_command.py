"""``bytedistill chat`` and ``generate --chat`` on an untrained chat student's folder (the bundled
SmolLM2 GGUF's tokenizer, its ChatML template): a template that raises (its own refusal of a role,
the sandbox's) or runs past its render budget is one line and exit 2, as is standard input that is closed or not UTF-8 text; an
answer that runs out of bytes before its end of turn is said so on stderr."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bytedistill.cli import main as bytedistill
from bytestream.stream_kind import StreamKind
from distill.teacher import template_budget
from students.release.generate_options import GenerateOptions
from tests.test_chat_student import RESERVED, chat_tokenizer, teacher  # noqa: F401 (teacher: a fixture)

REFUSES_SYSTEM = (
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}{% endfor %}"
)
ESCAPES = "{{ ''.__class__.__mro__[1].__subclasses__() }}"  # the sandbox refuses it
NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
STRING_BOMB = "{{ 'x' * 500000000 }}"
REPOSITORY = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def chat_folder(teacher, tmp_path_factory):  # noqa: F811
    """An exported chat student: a micro flat model on the fused stream, its turn ending at ``<|im_end|>``."""
    from students.models.architectures import architecture_named
    from students.models.shape import StudentShape

    root = tmp_path_factory.mktemp("chat-student")
    tokenizer = chat_tokenizer(root, teacher[1], "fused")
    shape = StudentShape(stream="fused", architecture="flat", preset="micro")
    model = architecture_named("flat").build(shape, seq_len=64, seed=0, reserved=tuple(RESERVED)).eval()
    stream = StreamKind.FUSED
    model.generation_config.eos_token_id = [stream.eos, end_of_turn()]
    model.generation_config.suppress_tokens = [stream.bos, stream.pad]
    model.generation_config.pad_token_id = stream.pad
    folder = root / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def end_of_turn() -> int:
    return StreamKind.FUSED.alphabet_size + RESERVED.index("<|im_end|>")


def variant(
    chat_folder: Path, tmp_path: Path, template_prefix: str = "", context: int | None = None, **generation
) -> Path:
    """A copy of the chat student's folder, its template opened with ``template_prefix``, its
    trained context set to ``context`` (its weights do not depend on it) and its generation
    config given ``generation``."""
    folder = tmp_path / "model"
    shutil.copytree(chat_folder, folder)
    template = folder / "chat_template.jinja"
    template.write_text(template_prefix + template.read_text(encoding="utf-8"), encoding="utf-8")
    edit_json(folder / "generation_config.json", **generation)
    if context is not None:
        edit_json(folder / "config.json", max_position_embeddings=context)
    return folder


def edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def writing_letters(chat_folder: Path, tmp_path: Path, context: int) -> Path:
    """The chat student made to write lowercase letters only and never end its turn (every other
    symbol suppressed): its answers are text the tokenizer reads back."""
    letters = set(range(ord("a"), ord("z") + 1))
    vocab = StreamKind.FUSED.alphabet_size + len(RESERVED)
    suppressed = [s for s in range(vocab) if s % 256 not in letters or s >= 512]
    return variant(chat_folder, tmp_path, context=context, suppress_tokens=suppressed)


def stdin_of(data: bytes) -> io.TextIOWrapper:
    """Standard input holding ``data``, decoded strictly as UTF-8 (a strict locale's)."""
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="strict")


def refused(status: int, err: str, command: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and "Traceback" not in err, err
    assert lines[-1].startswith(f"bytedistill {command}: error: "), err
    return lines[-1]


@pytest.mark.parametrize("template, system", [(REFUSES_SYSTEM, ["--system", "Be brief."]), (ESCAPES, [])])
def test_a_template_that_raises_is_one_line_in_chat_and_generate_chat(
    chat_folder, tmp_path, capsys, monkeypatch, template, system
):
    folder = variant(chat_folder, tmp_path, template)
    monkeypatch.setattr(sys, "stdin", stdin_of(b"What is 2+2?\n"))
    status = bytedistill(["chat", str(folder), "--max-new-bytes", "4", *system])
    line = refused(status, capsys.readouterr().err, "chat")
    assert "the conversation does not render with the chat template" in line
    status = bytedistill(["generate", str(folder), "--chat", "--prompt", "Hi", "--max-new-bytes", "4", *system])
    assert "the conversation does not render with the chat template" in refused(
        status, capsys.readouterr().err, "generate"
    )


@pytest.mark.parametrize("template", [NESTED_LOOPS, STRING_BOMB], ids=["nested loops", "string bomb"])
def test_a_template_past_its_render_budget_is_one_line_in_chat_and_generate_chat(
    chat_folder, tmp_path, capsys, monkeypatch, template
):
    monkeypatch.setattr(template_budget, "RENDER_SECONDS", 0.5)
    folder = variant(chat_folder, tmp_path, template)
    monkeypatch.setattr(sys, "stdin", stdin_of(b"What is 2+2?\n"))
    started = time.perf_counter()
    line = refused(bytedistill(["chat", str(folder), "--max-new-bytes", "4"]), capsys.readouterr().err, "chat")
    assert "to render one conversation (its render budget)" in line
    status = bytedistill(["generate", str(folder), "--chat", "--prompt", "Hi", "--max-new-bytes", "4"])
    assert "(its render budget)" in refused(status, capsys.readouterr().err, "generate")
    assert time.perf_counter() - started < 10


def test_chat_refuses_closed_standard_input_in_one_line(chat_folder, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", None)  # what Python makes of a closed descriptor 0
    line = refused(bytedistill(["chat", str(chat_folder)]), capsys.readouterr().err, "chat")
    assert "standard input is closed" in line


@pytest.mark.parametrize("data", [b"caf\xe9\n", b"Hi\n\xff\xfe\x80 random\n"])
def test_chat_refuses_a_line_that_is_not_utf8_in_one_line(chat_folder, capsys, monkeypatch, data):
    monkeypatch.setattr(sys, "stdin", stdin_of(data))
    status = bytedistill(["chat", str(chat_folder), "--max-new-bytes", "4"])
    assert "of standard input is not UTF-8 text (byte 0x" in refused(status, capsys.readouterr().err, "chat")


def test_chat_refuses_a_system_prompt_that_is_not_utf8_in_one_line(chat_folder, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", stdin_of(b"Hi\n"))
    status = bytedistill(["chat", str(chat_folder), "--system", "caf\udce9"])  # the bytes caf\xe9 of an argument
    assert "--system is not UTF-8 text (byte 0xe9" in refused(status, capsys.readouterr().err, "chat")


@pytest.mark.slow
def test_chat_with_standard_input_closed_or_latin1_under_a_strict_locale_is_one_line(chat_folder):
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY), "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8:strict"}
    argv = [sys.executable, "-m", "bytedistill", "chat", str(chat_folder), "--max-new-bytes", "4"]
    closed = subprocess.run(argv, check=False, env=env, capture_output=True, text=True, preexec_fn=lambda: os.close(0))
    assert closed.returncode == 2 and "Traceback" not in closed.stderr
    assert (
        closed.stderr.splitlines()[-1]
        == "bytedistill chat: error: standard input is closed: give the user's turns on it, one a line"
    )
    latin1 = subprocess.run(argv, check=False, env=env, capture_output=True, input=b"caf\xe9\n")
    err = latin1.stderr.decode()
    assert latin1.returncode == 2 and "Traceback" not in err
    assert (
        err.splitlines()[-1] == "bytedistill chat: error: line 1 of standard input is not UTF-8 text (byte 0xe9 at 3)"
    )


def test_chat_says_when_an_answer_ran_out_of_bytes_before_its_end_of_turn(chat_folder, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", stdin_of(b"Hello\n"))
    assert bytedistill(["chat", str(chat_folder), "--max-new-bytes", "5"]) == 0
    assert "(the answer reached --max-new-bytes 5 before it ended its turn)" in capsys.readouterr().err
    # a student that can only end its turn: every other symbol suppressed
    ends = variant(
        chat_folder,
        tmp_path,
        suppress_tokens=[s for s in range(StreamKind.FUSED.alphabet_size + 2) if s != end_of_turn()],
    )
    monkeypatch.setattr(sys, "stdin", stdin_of(b"Hello\n"))
    assert bytedistill(["chat", str(ends), "--max-new-bytes", "5"]) == 0
    assert "before it ended its turn" not in capsys.readouterr().err


QUESTIONS = [f"Question {n}: and then?" for n in range(10)]


def test_a_conversation_longer_than_the_context_is_read_from_its_latest_whole_turns(chat_folder, tmp_path):
    """The student reads the system prompt and the latest whole turns that leave room for the
    answer: one pair of turns more would not fit; the first turn it reads is a user's."""
    from students.release.chat import chat_stream
    from students.release.generate import load_folder
    from students.serving.offline import conversation

    model, tokenizer = load_folder(writing_letters(chat_folder, tmp_path, context=160))
    talk = conversation(model, tokenizer, GenerateOptions(max_new_bytes=12, greedy=True))
    system = {"role": "system", "content": "Be brief."}
    talk.messages.append(system)
    for question in QUESTIONS:
        talk.reply(question)
        assert len(talk.messages) == 1 + 2 * (QUESTIONS.index(question) + 1)  # the whole conversation is kept
    talk.messages.append({"role": "user", "content": "And last?"})
    turns = talk.messages[1:]
    symbols, room = talk.stream(), 12
    assert talk.left_out > 0 and talk.left_out % 2 == 0 and turns[talk.left_out]["role"] == "user"
    assert symbols == chat_stream(tokenizer, [system, *turns[talk.left_out :]]) and len(symbols) + room <= 160
    assert len(chat_stream(tokenizer, [system, *turns[talk.left_out - 2 :]])) + room > 160


def test_chat_says_when_the_conversation_outgrew_the_context(chat_folder, tmp_path, capsys, monkeypatch):
    folder = writing_letters(chat_folder, tmp_path, context=160)
    monkeypatch.setattr(sys, "stdin", stdin_of("".join(q + "\n" for q in QUESTIONS).encode()))
    assert bytedistill(["chat", str(folder), "--max-new-bytes", "12", "--greedy", "--system", "Be brief."]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == len(QUESTIONS) and all(line.isalpha() for line in out.splitlines())
    assert "(the conversation is longer than the trained context: the student no longer reads its 2 oldest" in err


def readme_chat_snippet() -> str:
    """The Python snippet of the README's "Chatting with a student"."""
    readme = (REPOSITORY / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Chatting with a student") :]
    return re.search(r"```python\n(.*?)```", section, flags=re.DOTALL).group(1)


def with_remote_tokenizer(folder: Path) -> None:
    """What export adds for ``AutoTokenizer``: the stream tokenizer's code and its ``auto_map``."""
    from bytestream import stream_tokenizer

    shutil.copyfile(stream_tokenizer.__file__, folder / "tokenization_bytedistill.py")
    edit_json(
        folder / "tokenizer_config.json", auto_map=stream_tokenizer.auto_map(), tokenizer_class="ByteStreamTokenizer"
    )


def test_the_readme_chat_snippet_holds_a_conversation_longer_than_the_context(chat_folder, tmp_path, capsys):
    folder = writing_letters(chat_folder, tmp_path, context=160)
    with_remote_tokenizer(folder)
    namespace: dict = {}
    exec(readme_chat_snippet().replace("runs/chat/model", str(folder)), namespace)  # noqa: S102 - the README's own code
    messages, tokenizer = namespace["messages"], namespace["tokenizer"]
    assert len(messages) >= 7 and [m["role"] for m in messages] == ["user", "assistant"] * (len(messages) // 2) + [
        "user"
    ]
    assert len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)) > 160
    answers = [m["content"] for m in messages[1::2]] + [capsys.readouterr().out.strip()]
    assert all(answer.isalpha() for answer in answers)  # each turn answered (letters: all this student writes)
