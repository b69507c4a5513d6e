"""Upload an exported student folder to the Hugging Face Hub (``bytedistill push``).

**What leaves the machine.** Exactly the files ``export`` recorded (``bytedistill_export.json``),
each a regular file inside the folder reached through no symlink (:mod:`students.release.export_record`);
a record naming anything else refuses the push before any request. Each file is opened once,
part by part from the folder with no symlink followed, and checked as opened (a regular file with
one link: a hard link could be a file from outside the folder); those open files are what is
sent, so a file swapped for a link after the checks changes nothing. A file with more than one
link is refused, by ``--dry-run`` too. Push holds the folder's export lock (shared) from its
checks to the end of the upload: an export into the folder meanwhile is refused, and so is a push
during an export. Anything else in the folder (a ``.env``, a key) stays local and is named in a
warning. The folder must load first, with no code of its own run (``trust_remote_code=False``, a
foreign ``auto_map`` refused): the model on the meta device (config, the weights' header: names,
shapes and length; no tensor is read), the plain tokenizer and the stream tokenizer. The upload is one ``create_commit`` of those files, after
``create_repo`` and, for a non-main revision, ``create_branch``.

**Where the token goes, and the network.** As :mod:`common.hub` rules for every talk with the Hub:
the Hugging Face token only to the Hub (another endpoint gets ``BYTEDISTILL_ENDPOINT_TOKEN`` or
nothing), a timeout on every request, each Hub call tried at most ``1 + retries`` times;
huggingface_hub also retries its own upload requests (at most 5 times). Any failure is one line
naming the endpoint and the call.

Tested against small local HTTP servers on 127.0.0.1 (tests/test_export_push.py,
tests/test_edges_export.py); no real Hub is contacted in the tests.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Self, TypeVar

from bytestream.stream_kind import StreamKind
from common.errors import UserError, first_line
from common.files import open_inside
from common.hub import (  # noqa: F401 - ENDPOINT_TOKEN and resolve_target: push's API, as before
    ENDPOINT_TOKEN,
    RETRIES,
    TIMEOUT_S,
    Target,
    check_network_options,
    check_repo_id,
    hub_timeout,
    offline,
    open_repo,
    resolve_target,
    with_retries,
)
from students.release.export_record import recorded_files
from students.release.export_staging import export_lock

COMMIT_MESSAGE = "Upload byte student"  # the Hub commit's message (--commit-message)

T = TypeVar("T")


@dataclass(frozen=True)
class UploadFile:
    path: str  # relative, with forward slashes
    size: int


@dataclass
class PushPlan:
    """What push will send; holds the folder's shared export lock and every file open (those open
    files are what :func:`upload` sends) until closed: use it as a context manager."""

    folder: Path
    repo_id: str
    target: Target
    files: list[UploadFile]
    left_out: list[str]  # files in the folder that are not uploaded
    opened: dict[str, BinaryIO] = field(default_factory=dict, repr=False)
    resources: ExitStack = field(default_factory=ExitStack, repr=False)

    def close(self) -> None:
        self.resources.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------------------ what is uploaded


def open_plan(folder: Path, resources: ExitStack) -> tuple[list[UploadFile], dict[str, BinaryIO]]:
    """The files export wrote (checked: regular files inside the folder), sorted by path, each opened
    once (:func:`open_inside`) and closed with ``resources``."""
    folder = Path(folder)
    planned = sorted(recorded_files(folder))
    folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    resources.callback(os.close, folder_fd)
    opened: dict[str, BinaryIO] = {}
    for name in planned:
        opened[name] = resources.enter_context(open_inside(folder, folder_fd, name, "push", "export", "export again"))
    return [UploadFile(name, os.fstat(opened[name].fileno()).st_size) for name in planned], opened


def upload_plan(folder: Path) -> list[UploadFile]:
    """The files export wrote (checked as :func:`open_plan` checks them), sorted by path."""
    with ExitStack() as resources:
        return open_plan(folder, resources)[0]


def left_out(folder: Path, files: list[UploadFile] | None = None) -> list[str]:
    """Files in ``folder`` that push does not upload (export did not write them, or dotfiles)."""
    folder = Path(folder)
    planned = {f.path for f in (upload_plan(folder) if files is None else files)}
    present = [
        (Path(root) / name).relative_to(folder).as_posix()
        for root, dirs, names in os.walk(folder)  # symlinked folders are listed, not entered
        for name in names + [d for d in dirs if (Path(root) / d).is_symlink()]
    ]
    return sorted(name for name in present if name not in planned)


def check_loadable(folder: Path) -> None:
    """Raise a UserError naming why the folder would not load; reads no tensor."""
    from transformers import PreTrainedTokenizerFast

    from students.release.exported_folder import load_model, load_stream_tokenizer

    folder = Path(folder)
    try:
        load_model(folder, weights=False)
        byte_stream = load_stream_tokenizer(folder).byte_stream
    except UserError as exc:
        raise UserError(f"cannot push {folder}: {exc}") from exc
    if StreamKind(byte_stream) is not StreamKind.EOT:
        return  # as export writes it: only an <eot> folder ships the plain byte tokenizer
    try:
        PreTrainedTokenizerFast.from_pretrained(folder)  # the plain byte tokenizer (AutoTokenizer needs remote code)
    except Exception as exc:  # any failure means the folder is not publishable
        raise UserError(f"cannot push {folder}: its byte tokenizer does not load: {first_line(exc)}") from exc


# ---------------------------------------------------------------------------- the checks


def plan_push(folder: Path, repo_id: str, endpoint: str | None = None, *, need_token: bool = True) -> PushPlan:
    """Every check push makes before the network: folder, repo id, record, token rule, loading; the
    plan holds the folder's lock and its files open until closed."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"cannot push {folder}: no such folder")
    check_repo_id(repo_id, "your-name/byte-student")
    resources = ExitStack()
    try:
        resources.enter_context(export_lock(folder, shared=True, create=False))
        files, opened = open_plan(folder, resources)
        target = resolve_target(endpoint, need_token=need_token)
        check_loadable(folder)  # reads by name, but what is sent is what was opened above
        return PushPlan(folder, repo_id, target, files, left_out(folder, files), opened, resources)
    except BaseException:
        resources.close()
        raise


# ------------------------------------------------------------------------------- the upload


def upload(
    plan: PushPlan,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str = COMMIT_MESSAGE,
    timeout: float = TIMEOUT_S,
    retries: int = RETRIES,
) -> str:
    """Create the repo (and branch) if needed and commit the planned files; returns the commit URL."""
    from huggingface_hub import CommitOperationAdd, HfApi

    check_network_options(timeout, retries)
    if plan.target.token is None:
        raise UserError(plan.target.token_note)
    if offline():
        raise UserError("HF_HUB_OFFLINE is set: push needs the network (unset it, or use --dry-run)")
    api = HfApi(endpoint=plan.target.endpoint, token=plan.target.token)
    operations = [CommitOperationAdd(f.path, plan.opened[f.path]) for f in plan.files]  # the files as opened

    def hub(what: str, call: Callable[[], T]) -> T:
        return with_retries(call, what, f"push to {plan.target.endpoint}", retries)

    with hub_timeout(timeout):
        open_repo(api, plan.repo_id, repo_type=None, private=private, revision=revision, hub=hub)
        info = hub(
            "commit",
            lambda: api.create_commit(
                plan.repo_id, operations, commit_message=commit_message, revision=revision or "main"
            ),
        )
    return str(info.commit_url)


def push_folder(
    folder: Path,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str = COMMIT_MESSAGE,
    endpoint: str | None = None,
    timeout: float = TIMEOUT_S,
    retries: int = RETRIES,
) -> str:
    """Check the folder (:func:`plan_push`) and upload it (:func:`upload`); returns the commit URL."""
    with plan_push(folder, repo_id, endpoint) as plan:
        return upload(
            plan, private=private, revision=revision, commit_message=commit_message, timeout=timeout, retries=retries
        )
