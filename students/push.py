"""Upload an exported student folder to the Hugging Face Hub (``bytedistill push``).

Only what ``export`` wrote is uploaded: the files its record (``bytedistill_export.json``) lists,
never a dotfile, so a ``.env`` or a key someone left in the folder stays local; anything else in
the folder is named in a warning. The folder must load with ``AutoModelForCausalLM`` and
``AutoTokenizer`` first. The upload is ``huggingface_hub``'s ``upload_folder`` with exactly those
files as ``allow_patterns`` (``--dry-run`` prints the same list), after ``create_repo`` and, for a
non-main revision, ``create_branch``. The token comes from ``HF_TOKEN`` or the saved login.

Tested against a small local HTTP server implementing just those endpoints
(tests/test_export_push.py); no real Hub is contacted in the tests.
"""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path

from distill.errors import UserError
from students.export import exported_files


@dataclass
class UploadFile:
    path: str  # relative, with forward slashes
    size: int


def upload_plan(folder: Path) -> list[UploadFile]:
    """The files export wrote (no dotfiles), sorted by path."""
    folder = Path(folder)
    planned = sorted(
        name for name in exported_files(folder) if not any(part.startswith(".") for part in name.split("/"))
    )
    missing = [name for name in planned if not (folder / name).is_file()]
    if missing:
        raise UserError(f"{folder} lacks {missing[0]}, which export wrote: export again")
    return [UploadFile(name, (folder / name).stat().st_size) for name in planned]


def left_out(folder: Path) -> list[str]:
    """Files in ``folder`` that push does not upload (export did not write them, or dotfiles)."""
    folder = Path(folder)
    planned = {f.path for f in upload_plan(folder)}
    present = (p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    return sorted(name for name in present if name not in planned)


def check_loadable(folder: Path) -> None:
    """Raise a UserError naming why the folder does not load with the Auto classes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"cannot push {folder}: no such folder")
    for name, loader in (("AutoModelForCausalLM", AutoModelForCausalLM), ("AutoTokenizer", AutoTokenizer)):
        try:
            loader.from_pretrained(folder)
        except Exception as exc:  # any failure means the folder is not publishable
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UserError(f"cannot push {folder}: it does not load with {name}: {reason}") from exc


def push_folder(
    folder: Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str = "Upload byte student",
    endpoint: str | None = None,
    token: str | None = None,
) -> str:
    """Create the repo (and branch) if needed and upload the planned files in one commit; returns the commit URL."""
    from huggingface_hub import HfApi

    folder = Path(folder)
    check_loadable(folder)
    files = upload_plan(folder)
    api = HfApi(endpoint=endpoint, token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    if revision and revision != "main":
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    info = api.upload_folder(
        repo_id=repo_id,
        folder_path=folder,
        commit_message=commit_message,
        revision=revision,
        allow_patterns=[glob.escape(f.path) for f in files],
    )
    return str(info.commit_url)
