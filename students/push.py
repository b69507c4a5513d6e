"""Upload an exported student folder to the Hugging Face Hub (``bytedistill push``).

The folder must load with ``AutoModelForCausalLM`` and ``AutoTokenizer`` first. The upload is
one commit of exactly the files :func:`upload_plan` lists (``--dry-run`` prints that list):
``create_repo`` (exist_ok), ``create_branch`` for a non-main revision, then ``create_commit``
(the Hub's preupload + commit endpoints, as ``upload_folder`` uses). The token comes from
``HF_TOKEN`` or the saved ``huggingface-cli login``; ``endpoint`` points at another Hub.

Tested against a small local HTTP server that implements just those endpoints
(tests/test_export_push.py); no real Hub is contacted in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from distill.errors import UserError

SKIPPED_DIRS = {".git", ".cache", "__pycache__"}


@dataclass
class UploadFile:
    path: str  # relative, with forward slashes
    size: int


def upload_plan(folder: Path) -> list[UploadFile]:
    """Every file under ``folder`` except VCS/cache directories, sorted by path."""
    folder = Path(folder)
    files = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if path.is_file() and not SKIPPED_DIRS & set(relative.parts[:-1]):
            files.append(UploadFile(relative.as_posix(), path.stat().st_size))
    return files


def check_loadable(folder: Path) -> None:
    """Raise a UserError naming why the folder does not load with the Auto classes."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"cannot push {folder}: no such folder")
    for name, loader in (("AutoModelForCausalLM", AutoModelForCausalLM), ("AutoTokenizer", AutoTokenizer)):
        try:
            loader.from_pretrained(folder)
        except Exception as exc:  # noqa: BLE001 - any failure means the folder is not publishable
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
    """Create the repo (and branch) if needed and upload the folder in one commit; returns the commit URL."""
    from huggingface_hub import CommitOperationAdd, HfApi

    folder = Path(folder)
    check_loadable(folder)
    files = upload_plan(folder)
    api = HfApi(endpoint=endpoint, token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    if revision and revision != "main":
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    operations = [CommitOperationAdd(path_in_repo=f.path, path_or_fileobj=str(folder / f.path)) for f in files]
    info = api.create_commit(repo_id, operations=operations, commit_message=commit_message, revision=revision)
    return str(info.commit_url)
