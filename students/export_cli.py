"""``bytedistill export | generate | push``: thin layers over students.export, .generate, .push."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ExportConfig:
    checkpoint: str = field(metadata={"help": "training checkpoint, or a training output dir (its newest checkpoint)", "positional": True})
    output: str = field(metadata={"help": "folder to write the Hugging Face model to", "positional": True})
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
class PushConfig:
    folder: str = field(metadata={"help": "exported model folder", "positional": True})
    repo_id: str = field(metadata={"help": "Hub repo id, e.g. your-name/byte-student", "positional": True})
    private: bool = field(default=False, metadata={"help": "create the repo as private"})
    revision: str | None = field(default=None, metadata={"help": "branch to push to (created if missing; default main)"})
    commit_message: str = field(default="Upload byte student", metadata={"help": "commit message"})
    endpoint: str | None = field(default=None, metadata={"help": "Hub endpoint URL (default: HF_ENDPOINT or huggingface.co)"})
    dry_run: bool = field(default=False, metadata={"help": "check the folder and list the files and sizes that would be uploaded"})


def export(config: ExportConfig) -> int:
    """Write a trained student as a Hugging Face model folder."""
    from students.export import export_student

    out = export_student(
        Path(config.checkpoint), Path(config.output),
        repo_id=config.repo_id, license=config.license, teacher=config.teacher, data=config.data,
    )
    print(f"exported to {out}")
    return 0


def generate(config: GenerateConfig) -> int:
    """Continue a prompt with an exported student."""
    from students.generate import GenerateOptions, generate_text

    options = GenerateOptions(
        max_new_bytes=config.max_new_bytes, temperature=config.temperature, top_k=config.top_k,
        top_p=config.top_p, greedy=config.greedy, seed=config.seed,
    )
    print(config.prompt + generate_text(Path(config.model), config.prompt, options))
    return 0


def push(config: PushConfig) -> int:
    """Upload an exported student folder to the Hugging Face Hub."""
    from students.push import check_loadable, push_folder, upload_plan

    folder = Path(config.folder)
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

