"""One end-of-turn rule (docs/DESIGN.md, "Conversations"): the dump finds the specials that end an
assistant turn from the chat template (the one that opens the assistant's footer, and the end of text
where the template writes it) and records their texts in the store; the export's generation config and
the shipped tokenizer stop where the store says, for a template whose turn ends with a special no
list of usual names holds (here ``<file_sep>``, a real SmolLM2 special), of a fused and a bytes student."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bytedistill.cli import main as bytedistill
from bytestream.stream_kind import StreamKind
from logit_store.manifest import read_manifest
from tests.gguf_teachers import write_tiny_gguf
from tests.teachers import dump_args

TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<file_sep>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CONVERSATION = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}]
TRAIN = ["--preset", "micro", "--seq-len", "64", "--batch-size", "2", "--max-steps", "2", "--warmup-steps", "1"]
TRAIN += ["--eval-bytes", "0", "--progress", "false"]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("end-of-turn")
    teacher = write_tiny_gguf(root / "tiny.gguf")
    (root / "turns.jinja").write_text(TEMPLATE, encoding="utf-8")
    (root / "chats.jsonl").write_text(json.dumps({"messages": CONVERSATION}) + "\n")
    args = dump_args(
        teacher, root / "chats.jsonl", root / "store", "--chat", "--chat-template", str(root / "turns.jinja")
    )
    assert bytedistill(args) == 0
    return root / "store"


def test_the_store_records_the_special_that_ends_the_templates_turn(store):
    manifest = read_manifest(store)
    assert [entry["text"] for entry in manifest["reserved_symbols"]] == ["<|im_start|>", "<file_sep>"]
    assert manifest["settings"]["end_of_turn"] == ["<file_sep>"]


@pytest.mark.parametrize("stream", ["fused", "bytes"])
def test_the_exported_student_stops_where_the_store_says_a_turn_ends(store, stream, tmp_path):
    from transformers import AutoTokenizer, GenerationConfig

    run, folder = tmp_path / "run", tmp_path / "model"
    assert (
        bytedistill(["train", "--train-stores", str(store), "--stream", stream, "--output-dir", str(run), *TRAIN]) == 0
    )
    assert bytedistill(["export", str(run), str(folder)]) == 0
    end_of_turn = StreamKind(stream).alphabet_size + 1  # <file_sep>, the second reserved symbol
    stops = GenerationConfig.from_pretrained(folder).eos_token_id
    assert stops == [StreamKind(stream).eos, end_of_turn]
    if stream == "fused":
        assert AutoTokenizer.from_pretrained(folder, trust_remote_code=True).end_of_turn_ids == [end_of_turn]
