"""``dump --chat``: a corpus of conversations into a chat store (docs/DESIGN.md, "Conversations";
logit_store/FORMAT.md, version 4), with a tiny random teacher over SmolLM2's tokenizer and the
bundled GGUF's chat template."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from bytedistill.cli import main
from bytestream.stream_kind import StreamKind
from distill.corpus.conversations import conversation_document
from distill.dump.respond import answers_path, checks_path, partial_path
from distill.teacher import template_budget
from logit_store import LogitStore
from tests.chat_families import smollm2_family
from tests.gguf_teachers import smollm2_chat_template, write_tiny_gguf
from tests.teachers import dump_args

CONVERSATIONS = [
    [
        {"role": "system", "content": "Sois bref."},
        {"role": "user", "content": "Où est Paris ? <|im_end|>"},
        {"role": "assistant", "content": "En France — 法国."},
    ],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Bye."},
    ],
]
MALFORMED = [[{"content": "no role"}], [{"role": "user", "content": ["not", "text"]}]]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("chat-teacher") / "tiny.gguf", chat_template=True)


@pytest.fixture(scope="module")
def family(teacher):
    return smollm2_family(teacher)


def write_jsonl(path, records) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")


@pytest.mark.parametrize("stream", StreamKind.stored_kinds(), ids=lambda s: s.value)
def test_a_chat_store_holds_reserved_symbols_and_roles(tmp_path, teacher, family, stream):
    corpus = tmp_path / "chats.jsonl"
    write_jsonl(corpus, [{"messages": m} for m in [CONVERSATIONS[0], *MALFORMED, CONVERSATIONS[1]]])
    assert main(dump_args(teacher, corpus, tmp_path / "store", "--chat", "--stream", stream.value)) == 0
    store = LogitStore(tmp_path / "store")
    assert store.format_version == 4 and store.stream is stream and len(store) == 2
    assert store.reserved_symbols == [
        {"text": "<|im_start|>", "teacher_id": 1},
        {"text": "<|im_end|>", "teacher_id": 2},
    ]
    settings = store.manifest["settings"]
    assert settings["chat_template"] == smollm2_chat_template() and settings["chat_prefix"] == ""
    assert settings["chat_template_tokens"] == {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    assert settings["end_of_text_ids"] == [0]  # <|im_end|> is a symbol of its own, not <eos>
    skipped = (tmp_path / "store" / "skipped-00000.jsonl").read_text().splitlines()
    assert [json.loads(line)["reason"] for line in skipped] == [
        "message 1 has no role",
        "message 1's content is list, not text",
    ]
    for i, messages in enumerate(CONVERSATIONS):
        document = family.chat.encode(conversation_document(messages))
        stored = store.document(i)
        assert stored.token_ids.tolist() == document.token_ids.tolist()
        assert stored.layout.alphabet_size == stream.alphabet_size + 2
        want = document.target_roles(stored.layout.symbols, stream)
        assert stored.roles.tolist() == want.tolist() and store.document_roles(i).tolist() == want.tolist()
        assert stored.text_bytes == stored.layout.num_text_bytes()
    assert main(["verify", str(tmp_path / "store")]) == 0


@pytest.mark.parametrize(
    "template",
    [
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{{ 'x' * 500000000 }}",
    ],
    ids=["nested loops", "string bomb"],
)
def test_a_template_past_its_render_budget_is_one_line_and_leaves_nothing_that_blocks_a_rerun(
    tmp_path, teacher, capsys, monkeypatch, template
):
    monkeypatch.setattr(template_budget, "RENDER_SECONDS", 0.5)
    corpus, costly = tmp_path / "chats.jsonl", tmp_path / "costly.jinja"
    write_jsonl(corpus, [{"messages": m} for m in CONVERSATIONS])
    costly.write_text(template, encoding="utf-8")
    started = time.perf_counter()
    assert main(dump_args(teacher, corpus, tmp_path / "store", "--chat", "--chat-template", str(costly))) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and time.perf_counter() - started < 10
    assert err.strip().splitlines()[-1].startswith("bytedistill dump: error: the chat template ")
    assert "(its render budget)" in err
    assert main(dump_args(teacher, corpus, tmp_path / "store", "--chat")) == 0
    assert len(LogitStore(tmp_path / "store")) == len(CONVERSATIONS)


def test_a_conversation_of_more_messages_than_max_messages_is_skipped_and_listed_at_once(tmp_path, teacher):
    """Every prefix of a conversation is rendered (the square of its messages): one of 10,000
    messages is skipped without rendering (the default --max-messages, 256), and --max-messages 3
    keeps a conversation of 3 and skips one of 4."""
    long = [{"role": "user" if k % 2 == 0 else "assistant", "content": f"turn {k}"} for k in range(10_000)]
    corpus = tmp_path / "chats.jsonl"
    write_jsonl(corpus, [{"messages": long}, *({"messages": m} for m in CONVERSATIONS)])
    started = time.perf_counter()
    assert main(dump_args(teacher, corpus, tmp_path / "default", "--chat")) == 0
    assert time.perf_counter() - started < 30
    assert main(dump_args(teacher, corpus, tmp_path / "three", "--chat", "--max-messages", "3")) == 0
    assert len(LogitStore(tmp_path / "default")) == 2 and len(LogitStore(tmp_path / "three")) == 1
    reasons = {
        name: [
            json.loads(line)["reason"] for line in (tmp_path / name / "skipped-00000.jsonl").read_text().splitlines()
        ]
        for name in ("default", "three")
    }
    assert reasons == {
        "default": ["10,000 messages, more than --max-messages 256 (each prefix is rendered)"],
        "three": [
            "10,000 messages, more than --max-messages 3 (each prefix is rendered)",
            "4 messages, more than --max-messages 3 (each prefix is rendered)",
        ],
    }


def test_resuming_a_chat_store_with_another_max_messages_is_refused_in_one_line(tmp_path, teacher, capsys):
    """--max-messages decides which conversations a store skips: the store records it (when it is not
    the default) and a run with another is refused."""
    corpus = tmp_path / "chats.jsonl"
    write_jsonl(corpus, [{"messages": m} for m in CONVERSATIONS])
    assert main(dump_args(teacher, corpus, tmp_path / "store", "--chat", "--max-messages", "3")) == 0
    assert LogitStore(tmp_path / "store").manifest["settings"]["max_messages"] == 3
    capsys.readouterr()
    assert main(dump_args(teacher, corpus, tmp_path / "store", "--chat")) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "max_messages" in err.strip().splitlines()[-1]


def test_a_plain_dump_is_unchanged_by_a_chat_template(tmp_path, teacher):
    """The same teacher without --chat writes the store it always wrote: no reserved symbols, no
    roles, the <eot> stream's format version 2."""
    corpus = tmp_path / "text.jsonl"
    write_jsonl(corpus, [{"text": "In the beginning <|im_end|> was the word."}])
    assert main(dump_args(teacher, corpus, tmp_path / "store", "--stream", "eot")) == 0
    store = LogitStore(tmp_path / "store")
    assert store.format_version == 2 and store.reserved_symbols == [] and "reserved_symbols" not in store.manifest
    assert store.document(0).roles is None and store.document_roles(0) is None
    assert 2 in store.manifest["settings"]["end_of_text_ids"]
    assert store.document(0).layout.alphabet_size == 260


@pytest.mark.slow  # three dumps, one with answers written
def test_the_teacher_writes_the_answers(tmp_path, teacher, family):
    corpus = tmp_path / "pairs.jsonl"
    write_jsonl(corpus, [{"prompt": "What is the capital of France?"}, {"prompt": "Say hi", "response": "Hi!"}])
    args = dump_args(
        teacher, corpus, tmp_path / "store", "--chat", "--prompt-field", "prompt", "--respond", "--respond-tokens", "8"
    )
    assert main(args) == 0
    kept = answers_path(tmp_path / "store")
    records = [json.loads(line) for line in kept.read_text(encoding="utf-8").splitlines()]
    assert [r["messages"][0]["content"] for r in records] == ["What is the capital of France?", "Say hi"]
    assert all([m["role"] for m in r["messages"]] == ["user", "assistant"] for r in records)
    answer = records[0]["messages"][1]["content"]
    assert answer and records[1]["messages"][1]["content"] != "Hi!"  # the teacher's own answer, not the data's
    store = LogitStore(tmp_path / "store")
    document = family.chat.encode(conversation_document(records[0]["messages"]))
    assert store.document(0).token_ids.tolist() == document.token_ids.tolist()
    # greedy answers do not depend on the run: a fresh dump writes the same file
    again = tmp_path / "again"
    assert main([*args[:6], str(again), *args[7:]]) == 0
    assert answers_path(again).read_bytes() == kept.read_bytes()
    before = kept.read_bytes()
    assert main(args) == 0  # a rerun reads the answers kept, and resumes the finished store
    assert kept.read_bytes() == before


QUESTIONS = [f"Question {n}: what comes after {n}?" for n in range(7)] + ["Dis bonjour — 你好"]


def answer_args(teacher, tmp_path, output: str, *extra: str) -> list[str]:
    corpus = tmp_path / "questions.jsonl"
    if not corpus.exists():
        write_jsonl(corpus, [{"prompt": q} for q in QUESTIONS])
    respond = ["--chat", "--prompt-field", "prompt", "--respond", "--respond-tokens", "6", "--max-docs", "8"]
    return dump_args(teacher, corpus, tmp_path / output, *respond, *extra)


@pytest.fixture(scope="module")
def other_teacher(tmp_path_factory):
    """The same tokenizer and template as ``teacher``, other weights."""
    return write_tiny_gguf(tmp_path_factory.mktemp("other-teacher") / "tiny.gguf", seed=1, chat_template=True)


@pytest.fixture(scope="module")
def answered(tmp_path_factory, teacher):
    """A finished ``--respond`` run over QUESTIONS, three answers a batch: the folder that holds its
    corpus and its answers files (``three.answers.jsonl`` and its checks)."""
    folder = tmp_path_factory.mktemp("answered")
    assert main(answer_args(teacher, folder, "three", "--respond-batch", "3")) == 0
    return folder


def stopped_partial(answered, tmp_path, output: str, batches: int, tail: bytes = b"") -> bytes:
    """Write, for ``output`` in ``tmp_path``, the partial answers file a run stopped after ``batches``
    whole batches leaves (the finished run's first line, answer lines and check lines), then ``tail``."""
    first, *checks = (answered / "three.answers.jsonl.checks").read_bytes().splitlines(keepends=True)
    lines = answers_path(answered / "three").read_bytes().splitlines(keepends=True)
    partial = first
    for k in range(batches):
        partial += b"".join(lines[3 * k : 3 * k + 3]) + checks[k]
    (tmp_path / "questions.jsonl").write_bytes((answered / "questions.jsonl").read_bytes())
    partial_path(tmp_path / output).write_bytes(partial + tail)
    return partial + tail


def refusal(capsys) -> str:
    """The one line a refused command wrote on stderr (after the GGUF loader's progress bar)."""
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert "Traceback" not in err and len(errors) == 1 and errors[0].startswith("bytedistill dump: error: "), err
    assert err.strip().splitlines()[-1] == errors[0]
    return errors[0]


@pytest.mark.slow  # three dumps of eight answers
def test_answers_do_not_depend_on_the_batch_and_a_stopped_run_resumes(tmp_path, teacher, answered, capsys):
    """Greedy answers written three at a time equal those written one at a time; a partial file as a
    run stopped in its third batch leaves it (two whole batches, one of the third's lines, a line cut
    part-way) resumes to the same file, and the partial file is gone once the answers are complete."""
    assert main(answer_args(teacher, tmp_path, "one", "--respond-batch", "1")) == 0
    whole = answers_path(answered / "three").read_bytes()
    assert answers_path(tmp_path / "one").read_bytes() == whole
    assert not partial_path(answered / "three").exists()
    lines = whole.splitlines(keepends=True)
    assert len(lines) == 8
    stopped_partial(answered, tmp_path, "resumed", 2, lines[6] + lines[7][:9])
    assert main(answer_args(teacher, tmp_path, "resumed", "--respond-batch", "3")) == 0
    assert answers_path(tmp_path / "resumed").read_bytes() == whole
    assert checks_path(tmp_path / "resumed").read_bytes() == checks_path(answered / "three").read_bytes()
    assert not partial_path(tmp_path / "resumed").exists()


def test_a_partial_answers_file_of_other_settings_is_refused(tmp_path, teacher, answered, capsys):
    kept = stopped_partial(answered, tmp_path, "store", 1)
    capsys.readouterr()
    assert main(answer_args(teacher, tmp_path, "store", "--respond-batch", "2")) == 2
    assert "other settings" in refusal(capsys)
    assert partial_path(tmp_path / "store").read_bytes() == kept
    assert not answers_path(tmp_path / "store").exists() and not (tmp_path / "store").exists()


def test_answers_of_another_teacher_are_refused_and_kept(tmp_path, other_teacher, answered, capsys):
    """A partial file a teacher wrote, resumed with another teacher (same tokenizer, other weights),
    is refused in one line and left as it is; so is a finished answers file."""
    kept = stopped_partial(answered, tmp_path, "store", 2)
    capsys.readouterr()
    assert main(answer_args(other_teacher, tmp_path, "store", "--respond-batch", "3")) == 2
    line = refusal(capsys)
    assert "another teacher" in line and "rerun with that teacher, or remove it" in line
    assert partial_path(tmp_path / "store").read_bytes() == kept
    assert not answers_path(tmp_path / "store").exists() and not (tmp_path / "store").exists()
    assert main(answer_args(other_teacher, answered, "three", "--respond-batch", "3")) == 2
    assert "another teacher" in refusal(capsys)


def test_answers_of_another_chat_template_are_refused(tmp_path, teacher, answered, capsys):
    template = tmp_path / "template.jinja"
    template.write_text(smollm2_chat_template() + "{# another template #}", encoding="utf-8")
    kept = stopped_partial(answered, tmp_path, "store", 1)
    capsys.readouterr()
    args = answer_args(teacher, tmp_path, "store", "--respond-batch", "3", "--chat-template", str(template))
    assert main(args) == 2
    assert "another chat template" in refusal(capsys)
    assert partial_path(tmp_path / "store").read_bytes() == kept


def edit_question(folder, number: int, question: str) -> None:
    """Change one question of ``folder``'s corpus in place (same length: the keys stay)."""
    corpus = folder / "questions.jsonl"
    before = corpus.read_bytes()
    lines = corpus.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[number] = json.dumps({"prompt": question}, ensure_ascii=False) + "\n"
    corpus.write_text("".join(lines), encoding="utf-8")
    assert len(corpus.read_bytes()) == len(before)


@pytest.mark.slow  # five dumps of up to eight answers
def test_a_conversation_edited_in_place_is_answered_again(tmp_path, teacher, family, answered, capsys):
    """A question edited in place (same length) after a run stopped is answered again with its batch
    and those after it, the batches before it kept byte for byte; the same holds for a finished
    answers file, which the store is then dumped from."""
    whole = answers_path(answered / "three").read_bytes().splitlines(keepends=True)
    stopped_partial(answered, tmp_path, "store", 2)
    edited = "Question 4: what comes after 9?"
    edit_question(tmp_path, 4, edited)
    assert main(answer_args(teacher, tmp_path, "store", "--respond-batch", "3")) == 0
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "questions.jsonl").write_bytes((tmp_path / "questions.jsonl").read_bytes())
    assert main(answer_args(teacher, fresh, "store", "--respond-batch", "3")) == 0
    resumed = answers_path(tmp_path / "store").read_bytes()
    assert resumed == answers_path(fresh / "store").read_bytes()
    assert resumed.splitlines(keepends=True)[:3] == whole[:3]
    assert json.loads(resumed.splitlines()[4])["messages"][0]["content"] == edited
    # the finished file, with the store removed: the edited question is answered and distilled
    shutil.rmtree(tmp_path / "store")
    edit_question(tmp_path, 7, "Dis bonsoir — 你好")
    edit_question(fresh, 7, "Dis bonsoir — 你好")
    assert main(answer_args(teacher, tmp_path, "store", "--respond-batch", "3")) == 0
    shutil.rmtree(fresh / "store")
    answers_path(fresh / "store").unlink()
    assert main(answer_args(teacher, fresh, "store", "--respond-batch", "3")) == 0
    answers = answers_path(tmp_path / "store").read_bytes()
    assert answers == answers_path(fresh / "store").read_bytes()
    assert answers.splitlines(keepends=True)[:6] == resumed.splitlines(keepends=True)[:6]
    last = json.loads(answers.splitlines()[7])["messages"]
    distilled = LogitStore(tmp_path / "store").document(7).token_ids.tolist()
    assert last[0]["content"] == "Dis bonsoir — 你好"
    assert distilled == family.chat.encode(conversation_document(last)).token_ids.tolist()


def test_a_forged_answer_is_refused(tmp_path, teacher, answered, capsys):
    """An answer changed inside a whole batch of the partial file, or of the finished file, is
    refused in one line, the file left as it is."""
    forged = stopped_partial(answered, tmp_path, "store", 2).replace(b'"Question 1: ', b'"Question 1! ')
    partial_path(tmp_path / "store").write_bytes(forged)
    capsys.readouterr()
    assert main(answer_args(teacher, tmp_path, "store", "--respond-batch", "3")) == 2
    assert "not those the teacher wrote" in refusal(capsys)
    assert partial_path(tmp_path / "store").read_bytes() == forged
    finished = tmp_path / "finished"
    shutil.copytree(answered, finished)
    lines = answers_path(finished / "three").read_bytes().splitlines(keepends=True)
    answer = json.loads(lines[5])
    answer["messages"][-1]["content"] = "forged"
    lines[5] = json.dumps(answer, ensure_ascii=False).encode("utf-8") + b"\n"
    answers_path(finished / "three").write_bytes(b"".join(lines))
    assert main(answer_args(teacher, finished, "three", "--respond-batch", "3")) == 2
    assert "not those the teacher wrote" in refusal(capsys)


def test_answers_files_of_an_earlier_version_are_refused(tmp_path, teacher, answered, capsys):
    """A partial file with the settings line alone, or a finished answers file without its checks
    (what an earlier version wrote), is refused in one line."""
    lines = answers_path(answered / "three").read_bytes().splitlines(keepends=True)
    settings = {"max_tokens": 6, "temperature": 0.0, "seed": 0, "batch": 3}
    old = json.dumps({"respond": settings}).encode() + b"\n" + b"".join(lines[:3])
    stopped_partial(answered, tmp_path, "store", 0)
    partial_path(tmp_path / "store").write_bytes(old)
    capsys.readouterr()
    assert main(answer_args(teacher, tmp_path, "store", "--respond-batch", "3")) == 2
    assert "earlier version" in refusal(capsys)
    assert partial_path(tmp_path / "store").read_bytes() == old
    partial_path(tmp_path / "store").unlink()
    answers_path(tmp_path / "store").write_bytes(b"".join(lines))
    assert main(answer_args(teacher, tmp_path, "store", "--respond-batch", "3")) == 2
    assert "earlier version" in refusal(capsys)
    assert not (tmp_path / "store").exists()


def test_conversations_from_parquet_and_datasets(tmp_path):
    """The same conversation read from a parquet file's prompt/answer columns, a parquet file's
    messages column and a saved datasets dataset's messages."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    from distill.corpus.conversations import ConversationFields
    from distill.corpus.spec import CorpusSpec, raw_documents

    pair = [{"role": "user", "content": "Où ?"}, {"role": "assistant", "content": "Là."}]
    pq.write_table(pa.table({"prompt": ["Où ?"], "response": ["Là."]}), tmp_path / "pairs.parquet")
    pq.write_table(pa.table({"messages": [pair], "other": [1]}), tmp_path / "chats.parquet")
    datasets.Dataset.from_list([{"messages": pair}]).save_to_disk(str(tmp_path / "saved"))
    sources = [
        ("pairs.parquet", ConversationFields(prompt="prompt")),
        ("chats.parquet", ConversationFields()),
        ("saved", ConversationFields()),
    ]
    for name, fields in sources:
        documents = [data for _, data in raw_documents(CorpusSpec(str(tmp_path / name), text_field=fields))]
        assert documents == [conversation_document(pair)], name
