"""``bytedistill export | generate | score | push``: thin layers over students.export, .generate, .score, .push."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from distill.config import add_config_arguments, config_from_args


@dataclass
class ExportConfig:
    checkpoint: str = field(metadata={"help": "training checkpoint, or a training output dir (its newest checkpoint)", "positional": True})
    output: str = field(metadata={"help": "folder to write the Hugging Face model to", "positional": True})
    teacher_tokenizer: str | None = field(default=None, metadata={"help": "the teacher's tokenizer (tokenizer.json, model folder or .gguf) shipped for <eot> placement (default: the teacher the training store names)"})
    repo_id: str | None = field(default=None, metadata={"help": "Hub repo id to name in the model card's usage snippet"})
    license: str = field(default="apache-2.0", metadata={"help": "license for the model card metadata"})
    teacher: str | None = field(default=None, metadata={"help": "teacher name for the card (default: from the logit store)"})
    data: str | None = field(default=None, metadata={"help": "training data description for the card (default: from the store)"})


@dataclass
class GenerateConfig:
    model: str = field(metadata={"help": "exported model folder", "positional": True})
    prompt: str = field(default="", metadata={"help": "text to continue"})
    max_new_bytes: int = field(default=200, metadata={"help": "bytes to generate (<eot> marks not counted)"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    top_k: int = field(default=0, metadata={"help": "sample from the k most likely symbols (0: all)"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling mass"})
    greedy: bool = field(default=False, metadata={"help": "take the most likely symbol instead of sampling"})
    seed: int = field(default=0, metadata={"help": "random seed for sampling"})


@dataclass
class ScoreConfig:
    model: str = field(metadata={"help": "exported model folder", "positional": True})
    sources: list[str] = field(metadata={"help": "text files (.txt/.md: one document each), .jsonl files or logit store folders", "positional": True})
    mode: str = field(default="stream", metadata={"help": "stream: the training stream with the teacher's <eot> marks; plain: bytes only; plain-renormalised: bytes only, P over bytes + <eos>", "choices": ["stream", "plain", "plain-renormalised"]})
    context: int | None = field(default=None, metadata={"help": "window length in symbols (default and maximum: the trained context)"})
    stride: int | None = field(default=None, metadata={"help": "window step (default: the context, as train evaluates; smaller: more context per position)"})
    packed: bool = field(default=True, metadata={"help": "documents back to back as train evaluates (false: each document on its own, as lm-eval)"})
    batch_size: int = field(default=8, metadata={"help": "windows per forward pass"})
    text_field: str = field(default="text", metadata={"help": "field of each .jsonl record holding the text"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})


@dataclass
class PushConfig:
    folder: str = field(metadata={"help": "exported model folder", "positional": True})
    repo_id: str = field(metadata={"help": "Hub repo id, e.g. your-name/byte-student", "positional": True})
    private: bool = field(default=False, metadata={"help": "create the repo as private"})
    revision: str | None = field(default=None, metadata={"help": "branch to push to (created if missing; default main)"})
    commit_message: str = field(default="Upload byte student", metadata={"help": "commit message"})
    endpoint: str | None = field(default=None, metadata={"help": "Hub endpoint URL (default: HF_ENDPOINT or huggingface.co)"})
    dry_run: bool = field(default=False, metadata={"help": "check the folder and list the files and sizes that would be uploaded"})


def run_export(args: argparse.Namespace) -> int:
    from students.export import export_student

    config = config_from_args(ExportConfig, args)
    out = export_student(
        Path(config.checkpoint), Path(config.output),
        teacher_tokenizer=config.teacher_tokenizer, repo_id=config.repo_id, license=config.license, teacher=config.teacher, data=config.data,
    )
    print(f"exported to {out}")
    return 0


def run_generate(args: argparse.Namespace) -> int:
    from students.generate import GenerateOptions, generate_bytes, load_folder

    config = config_from_args(GenerateConfig, args)
    options = GenerateOptions(
        max_new_bytes=config.max_new_bytes, temperature=config.temperature, top_k=config.top_k,
        top_p=config.top_p, greedy=config.greedy, seed=config.seed,
    )
    model, tokenizer = load_folder(Path(config.model))
    print(f"trained context: {model.config.max_position_embeddings} symbols; the window slides past it", file=sys.stderr)
    continuation = generate_bytes(model, tokenizer, config.prompt, options).decode("utf-8", errors="replace")
    print(config.prompt + continuation)
    return 0


def run_score(args: argparse.Namespace) -> int:
    from students.score import ScoreOptions, score

    config = config_from_args(ScoreConfig, args)
    options = ScoreOptions(
        mode=config.mode, context=config.context, stride=config.stride, packed=config.packed, batch_size=config.batch_size,
        text_field=config.text_field, progress=config.progress,
    )
    results = score(Path(config.model), [Path(s) for s in config.sources], options)
    print(f"{'source':<32} {'documents':>9} {'bytes':>12} {'student BPB':>11} {'teacher BPB':>11}")
    for r in results:
        teacher = f"{r.teacher_bpb:.4f}" if r.teacher_bpb is not None else "-"
        print(f"{r.name:<32} {r.documents:>9,} {r.bytes:>12,} {r.student_bpb:>11.4f} {teacher:>11}")
    return 0


def run_push(args: argparse.Namespace) -> int:
    from students.push import check_loadable, left_out, push_folder, upload_plan

    config = config_from_args(PushConfig, args)
    folder = Path(config.folder)
    skipped = left_out(folder)
    if skipped:
        print(f"warning: not uploading {len(skipped)} file(s) export did not write: {', '.join(skipped)}", file=sys.stderr)
    if config.dry_run:
        check_loadable(folder)
        files = upload_plan(folder)
        for f in files:
            print(f"{f.size:>14,}  {f.path}")
        print(f"{sum(f.size for f in files):>14,}  total, {len(files)} files -> {config.repo_id}@{config.revision or 'main'}")
        return 0
    url = push_folder(
        folder, config.repo_id, private=config.private, revision=config.revision,
        commit_message=config.commit_message, endpoint=config.endpoint,
    )
    print(f"pushed {folder} to {url}")
    return 0


def register(subparsers) -> None:
    commands = (
        ("export", ExportConfig, run_export, "write a trained student as a Hugging Face model folder"),
        ("generate", GenerateConfig, run_generate, "continue a prompt with an exported student"),
        ("score", ScoreConfig, run_score, "bits per byte of an exported student on text, .jsonl or logit stores"),
        ("push", PushConfig, run_push, "upload an exported student folder to the Hugging Face Hub"),
    )
    for name, config_cls, handler, help_text in commands:
        parser = subparsers.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
        add_config_arguments(parser, config_cls)
        parser.set_defaults(handler=handler)
