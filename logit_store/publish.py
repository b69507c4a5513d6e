"""Publishing a finished store as a Hub dataset repo (``bytedistill push-store``).

**What leaves the machine.** The store's own files (manifest, vocabulary, shards, completion, skip
and source records: :func:`logit_store.hub_files.is_published`), each opened once from the store's
folder with no symlink followed and checked as opened (a regular file with one link), and hashed
from that open file; then the file list ``hub_files.json`` made from those hashes and a dataset card
(``README.md``, :mod:`logit_store.store_card`). Anything else in the folder (a partial shard, a
lock, a stray file) stays local and is named in a warning. The store is opened and every chunk's
checksum read first; a partial store (a writer unfinished or missing) is refused unless
``allow_partial``.

**In parts, resumable.** The files go in commits of at most ``commit_bytes`` each (one file at least),
shards first, and last one commit of the manifest, the file list and the card: a reader finds
the store only once all of it is there. Before each commit the revision's files are listed, and
a file already there with the same size and hash is not sent again, so a push that stopped
continues where it stopped.

The token and the network follow :mod:`common.hub`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Self, TypeVar

from common.errors import UserError
from common.files import open_inside
from common.hub import (
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
from logit_store.file_names import MANIFEST
from logit_store.hub_files import BLOCK, HUB_FILES, FileEntry, FileList, describe, is_published

COMMIT_MESSAGE = "Upload logit store"  # the Hub commits' message (--commit-message)
COMMIT_BYTES = 1 << 30  # bytes of files in one commit (--commit-bytes)
CARD = "README.md"
REPO_TYPE = "dataset"

T = TypeVar("T")


@dataclass
class StorePlan:
    """What push-store sends; holds the store's files open (those open files are what is sent)
    until closed: use it as a context manager."""

    directory: Path
    repo_id: str
    target: Target
    entries: list[FileEntry]  # the store's files, sorted by name
    blob_ids: dict[str, str]  # name -> its git blob id (what the Hub lists for a file it stores in git)
    left_out: list[str]
    card: bytes
    opened: dict[str, BinaryIO] = field(default_factory=dict, repr=False)
    resources: ExitStack = field(default_factory=ExitStack, repr=False)

    @property
    def file_list(self) -> bytes:
        return FileList({e.name: e for e in self.entries}).to_bytes()

    def close(self) -> None:
        self.resources.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def git_blob_id(handle: BinaryIO, size: int) -> str:
    """The git blob id of an open file's bytes (what the Hub lists for a file kept in git)."""
    digest = hashlib.sha1(f"blob {size}\0".encode(), usedforsecurity=False)
    handle.seek(0)
    while block := handle.read(BLOCK):
        digest.update(block)
    handle.seek(0)
    return digest.hexdigest()


def plan_store_push(
    directory: Path, repo_id: str, endpoint: str | None = None, *, need_token: bool = True, allow_partial: bool = False
) -> StorePlan:
    """Every check push-store makes before the network: the folder, the repo id, the store (opened,
    every chunk read), its writers, the token rule; the plan holds the files open until closed."""
    from logit_store.reader import LogitStore  # Numba: loaded when a store is opened, not for --help
    from logit_store.store_card import store_card

    directory = Path(directory)
    if not directory.is_dir():
        raise UserError(f"cannot push-store {directory}: no such folder")
    check_repo_id(repo_id, "your-name/kjv-logits")
    store = LogitStore(directory)
    if store.writer_states and not allow_partial:
        raise UserError(
            f"cannot push-store {directory}: the store is partial: {store.writer_states.describe()}; "
            "finish its dump (rerun it), or give --allow-partial to publish the documents it holds"
        )
    store.check_chunks()
    target = resolve_target(endpoint, need_token=need_token)
    resources = ExitStack()
    try:
        folder_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        resources.callback(os.close, folder_fd)
        names = sorted(name for name in os.listdir(directory) if is_published(name))
        opened = {
            name: resources.enter_context(open_inside(directory, folder_fd, name, "push-store", "dump", "dump again"))
            for name in names
        }
        entries = [describe(name, opened[name]) for name in names]
        blob_ids = {e.name: git_blob_id(opened[e.name], e.size) for e in entries}
        left_out = sorted(set(os.listdir(directory)) - set(names))
        card = store_card(store, repo_id).encode()
        return StorePlan(directory, repo_id, target, entries, blob_ids, left_out, card, opened, resources)
    except BaseException:
        resources.close()
        raise


def commit_groups(entries: list[FileEntry], commit_bytes: int) -> list[list[FileEntry]]:
    """The store's files but the manifest in commits of at most ``commit_bytes`` (one file at least
    each), in name order; the manifest goes in the last commit, with the file list and the card."""
    groups: list[list[FileEntry]] = []
    size = 0
    for entry in (e for e in entries if e.name != MANIFEST):
        if not groups or (size + entry.size > commit_bytes and groups[-1]):
            groups.append([])
            size = 0
        groups[-1].append(entry)
        size += entry.size
    return groups


def _present(api, plan: StorePlan, revision: str, hub) -> set[str]:
    """The names of the plan's files the revision already holds with the same bytes."""
    from huggingface_hub.errors import RevisionNotFoundError

    def listing():
        try:
            return list(api.list_repo_tree(plan.repo_id, repo_type=REPO_TYPE, revision=revision, recursive=True))
        except RevisionNotFoundError:
            return []

    have = {f.path: f for f in hub("list files", listing) if hasattr(f, "size")}
    same = set()
    for entry in plan.entries:
        remote = have.get(entry.name)
        if remote is None or remote.size != entry.size:
            continue
        lfs_sha = getattr(remote.lfs, "sha256", None) if remote.lfs else None
        if lfs_sha == entry.sha256 or remote.blob_id == plan.blob_ids[entry.name]:
            same.add(entry.name)
    return same


def upload_store(
    plan: StorePlan,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str = COMMIT_MESSAGE,
    commit_bytes: int = COMMIT_BYTES,
    timeout: float = TIMEOUT_S,
    retries: int = RETRIES,
) -> tuple[str, int]:
    """Create the dataset repo (and branch) if needed and commit the plan's files in parts; returns
    the last commit's URL and the number of files sent (those already there are not)."""
    from huggingface_hub import CommitOperationAdd, HfApi

    check_network_options(timeout, retries)
    if commit_bytes < 1:
        raise UserError(f"--commit-bytes must be >= 1, got {commit_bytes}")
    if plan.target.token is None:
        raise UserError(plan.target.token_note)
    if offline():
        raise UserError("HF_HUB_OFFLINE is set: push-store needs the network (unset it, or use --dry-run)")
    api = HfApi(endpoint=plan.target.endpoint, token=plan.target.token)
    revision = revision or "main"

    def hub(what: str, call: Callable[[], T]) -> T:
        return with_retries(call, what, f"push-store to {plan.target.endpoint}", retries)

    def commit(files: list[FileEntry], extra: dict[str, bytes], message: str):
        operations = [CommitOperationAdd(e.name, plan.opened[e.name]) for e in files]
        operations += [CommitOperationAdd(name, data) for name, data in extra.items()]

        def call():
            for e in files:  # a retried commit sends each file from its start again
                plan.opened[e.name].seek(0)
            return api.create_commit(
                plan.repo_id, operations, repo_type=REPO_TYPE, commit_message=message, revision=revision
            )

        return hub("commit", call)

    sent = 0
    with hub_timeout(timeout):
        open_repo(api, plan.repo_id, repo_type=REPO_TYPE, private=private, revision=revision, hub=hub)
        present = _present(api, plan, revision, hub)
        groups = [[e for e in group if e.name not in present] for group in commit_groups(plan.entries, commit_bytes)]
        groups = [group for group in groups if group]
        for number, group in enumerate(groups, 1):
            commit(group, {}, f"{commit_message} (part {number} of {len(groups) + 1})")
            sent += len(group)
        manifest = [e for e in plan.entries if e.name == MANIFEST]
        info = commit(manifest, {HUB_FILES: plan.file_list, CARD: plan.card}, commit_message)
        sent += len(manifest) + 2  # with the file list and the card
    return str(info.commit_url), sent
