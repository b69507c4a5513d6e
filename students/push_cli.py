"""``bytedistill push``: the command line over :func:`students.push.push_folder`."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class PushConfig:
    folder: str = field(metadata={"help": "exported model folder", "positional": True})
    repo_id: str = field(metadata={"help": "Hub repo id, e.g. your-name/byte-student", "positional": True})
    private: bool = field(default=False, metadata={"help": "create the repo as private"})
    revision: str | None = field(
        default=None, metadata={"help": "branch to push to (created if missing; default main)"}
    )
    commit_message: str = field(default="Upload byte student", metadata={"help": "commit message"})
    endpoint: str | None = field(
        default=None, metadata={"help": "Hub endpoint URL (default: HF_ENDPOINT or huggingface.co)"}
    )
    dry_run: bool = field(
        default=False, metadata={"help": "check the folder and list the files and sizes that would be uploaded"}
    )


def push(config: PushConfig) -> int:
    """Upload an exported student folder to the Hugging Face Hub (only the files export wrote)."""
    from students.push import check_loadable, left_out, push_folder, upload_plan

    folder = Path(config.folder)
    skipped = left_out(folder)
    if skipped:
        print(
            f"warning: not uploading {len(skipped)} file(s) export did not write: {', '.join(skipped)}", file=sys.stderr
        )
    if config.dry_run:
        check_loadable(folder)
        files = upload_plan(folder)
        for f in files:
            print(f"{f.size:>14,}  {f.path}")
        print(
            f"{sum(f.size for f in files):>14,}  total, {len(files)} files "
            f"-> {config.repo_id}@{config.revision or 'main'}"
        )
        return 0
    url = push_folder(
        folder,
        config.repo_id,
        private=config.private,
        revision=config.revision,
        commit_message=config.commit_message,
        endpoint=config.endpoint,
    )
    print(f"pushed {folder} to {url}")
    return 0
