"""What the benchmarks' ``--smoke`` runs measure with instead of the real teacher and the
quickstart's model: a tiny random teacher over the real SmolLM2 tokenizer, its stores of a few
KJV chapters, and a student trained on them for a few steps and exported. Each is built through
the same ``bytedistill`` commands the real runs use, so a smoke run takes each benchmark's own
code path end to end, in seconds, with no network.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import smollm2_gguf

CACHE = Path(__file__).resolve().parent / ".cache"
TEACHER_NAME = "tiny random Llama (hidden 16, 2 layers) over the SmolLM2 tokenizer"
WINDOWS = {"max_length": 256, "stride": 64}  # of the smoke dumps (the tiny teacher has 512 positions)
TRAIN, HELDOUT = (["Genesis"], 1), (["Ruth"], 1)  # books, chapters
STUDENT = {
    "preset": "tiny",
    "hidden_size": 32,
    "num_layers": 2,
    "num_heads": 2,
    "intermediate_size": 64,
    "seq_len": 64,
    "batch_size": 2,
}


def tiny_teacher() -> Path:
    """A 2-layer random Llama (tests/teachers.py) over SmolLM2-135M's tokenizer, saved as a
    ``transformers`` folder. Built once and cached under ``benchmarks/.cache/``: reading the
    tokenizer out of the GGUF takes about 10 s, loading the saved one half a second."""
    folder = CACHE / "smoke-teacher-smollm2"
    if (folder / "config.json").is_file():
        return folder
    from bytestream.vocab import load_teacher_tokenizer
    from tests.teachers import save_tiny_teacher

    tokenizer = load_teacher_tokenizer(smollm2_gguf())
    CACHE.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=CACHE, prefix="smoke-teacher-"))
    save_tiny_teacher(staging, tokenizer, tokenizer.vocab_size)
    try:
        os.replace(staging, folder)  # a concurrent smoke run may have won: its folder is the same
    except OSError:
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
    return folder


def dump(teacher: Path | str, corpus: Path, store: Path, **options: object) -> Path:
    """``bytedistill dump`` of ``corpus`` into ``store`` with toy windows (``options`` override them)."""
    from bytedistill.cli import main as bytedistill
    from examples.quickstart import flags

    settings = WINDOWS | {"batch_tokens": 1024, "progress": "false"} | options
    if bytedistill(["dump", *flags(teacher=teacher, corpus=corpus, output=store, **settings)]) != 0:
        raise SystemExit(f"the smoke dump of {corpus} failed")
    return store


@dataclass(frozen=True)
class ExportedStudent:
    folder: Path  # what ``bytedistill export`` wrote
    heldout_store: Path


def tiny_exported_student(work: Path, steps: int = 4) -> ExportedStudent:
    """The quickstart at toy sizes in ``work``: stores of a few chapters of Genesis (train) and
    Ruth (held out) from the tiny teacher, ``steps`` training steps, then ``export``."""
    from bytedistill.cli import main as bytedistill
    from examples.quickstart import flags, write_kjv_corpus

    teacher = tiny_teacher()
    for name, (books, chapters) in (("train", TRAIN), ("heldout", HELDOUT)):
        write_kjv_corpus(work / "corpus" / name, books, chapters)
        dump(teacher, work / "corpus" / name / "kjv.jsonl", work / "store" / name)
    training = flags(
        train_stores=work / "store/train",
        eval_store=work / "store/heldout",
        output_dir=work / "student",
        stream="fused",  # the fused folder (teacher tokenizer, healing) the smoke runs exercise
        max_steps=steps,
        warmup_steps=1,
        eval_every=0,
        eval_bytes=0,
        checkpoint_every=0,
        progress="false",
        **STUDENT,
    )
    if bytedistill(["train", *training]) != 0:
        raise SystemExit("the smoke training failed")
    folder = work / "model"
    if bytedistill(["export", str(work / "student"), str(folder), "--teacher", "tiny-smollm2"]) != 0:
        raise SystemExit("the smoke export failed")
    return ExportedStudent(folder, work / "store/heldout")
