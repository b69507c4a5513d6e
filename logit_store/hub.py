"""A store on the Hugging Face Hub, named ``hf://datasets/OWNER/NAME[@REVISION]``, read through the
Hub cache (``HF_HOME``; huggingface_hub's downloads, its locks and ``HF_HUB_OFFLINE``).

:func:`local_store` turns such a name into a store directory on this machine: the cache's snapshot
folder of the revision's commit (``…/datasets--OWNER--NAME/snapshots/<commit>``), holding the file
list (:mod:`logit_store.hub_files`) and every file but the shards, each checked against the list
as fetched; the manifest is then read and checked as any store's. A shard is fetched when a
reader first reads one of its chunks (:class:`HubShard`), so a process (a rank, a data-loader
worker) fetches only the shards its documents are in, and a file already in the cache is not
fetched again. A fetched file whose size or SHA-256 is not the list's is removed from the cache
(its snapshot link and its blob) before the error: a rerun fetches it again.

Downloads go to huggingface_hub's endpoint (``HF_ENDPOINT``, else the Hub) with the token it
finds there (the token rule of :mod:`common.hub`), with huggingface_hub's own timeouts
(``HF_HUB_ETAG_TIMEOUT``, ``HF_HUB_DOWNLOAD_TIMEOUT``) and retries: a download cut midway resumes
from its ``.incomplete`` file, in the same run or the next.
"""

from __future__ import annotations

import errno
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import UserError, first_line
from common.hub import check_repo_id, hub_endpoint, with_retries
from logit_store.hub_files import (
    HUB_FILES,
    MAX_LIST_BYTES,
    FileEntry,
    FileList,
    parse,
    read_file_list,
    sha256_of,
    shard_ends,
)

PREFIX = "hf://datasets/"
COMMIT = re.compile(r"^[0-9a-f]{40}$")
REPO_TYPE = "dataset"


@dataclass(frozen=True)
class HubName:
    repo_id: str
    revision: str  # a branch, a tag or a commit

    @property
    def shown(self) -> str:
        return f"{PREFIX}{self.repo_id}@{self.revision}"


def is_hub_name(name: str | os.PathLike) -> bool:
    return str(name).startswith("hf://")


def parse_name(name: str) -> HubName:
    """``hf://datasets/OWNER/NAME[@REVISION]`` (revision main when not given); a UserError otherwise."""
    if not name.startswith(PREFIX):
        raise UserError(f"{name!r}: a store on the Hub is named {PREFIX}OWNER/NAME[@REVISION]")
    repo_id, _, revision = name[len(PREFIX) :].partition("@")
    if repo_id.count("/") != 1:
        raise UserError(f"{name!r}: a store on the Hub is named {PREFIX}OWNER/NAME[@REVISION]")
    check_repo_id(repo_id, "your-name/kjv-logits")
    if "@" in name[len(PREFIX) :] and not revision:
        raise UserError(f"{name!r}: no revision after '@'")
    return HubName(repo_id, revision or "main")


def repo_of_snapshot(directory: Path) -> HubName | None:
    """The repo and commit whose cache snapshot folder ``directory`` is, or None for another folder."""
    directory = Path(directory)
    repo_folder = directory.parent.parent.name
    if (
        directory.parent.name != "snapshots"
        or not repo_folder.startswith("datasets--")
        or not COMMIT.match(directory.name)
    ):
        return None
    owner_and_name = repo_folder[len("datasets--") :].split("--")
    return HubName("/".join(owner_and_name), directory.name)


def pinned_name(directory: Path) -> str | None:
    """``hf://datasets/OWNER/NAME@<commit>`` of a Hub copy's snapshot folder (what a resume reads), or None."""
    repo = repo_of_snapshot(directory)
    return repo.shown if repo is not None and read_file_list(directory) is not None else None


# --------------------------------------------------------------------------------- fetching


def _fetch(repo: HubName, filename: str) -> Path:
    """One file of ``repo`` through the Hub cache (no request when the revision is a commit and the
    file is there); every failure is a UserError of one line."""
    from huggingface_hub import hf_hub_download

    endpoint = hub_endpoint()
    where = f"{repo.shown} at {endpoint}"

    def download() -> str:
        return hf_hub_download(repo.repo_id, filename, repo_type=REPO_TYPE, revision=repo.revision, endpoint=endpoint)

    try:  # huggingface_hub retries and resumes a download itself: no tries of ours on top
        with quiet_hub_logs():
            path = with_retries(download, filename, f"fetching {filename} of {where}", retries=0)
    except UserError as exc:
        raise UserError(_hub_failure(exc.__cause__, repo, filename, where) or str(exc)) from None
    return Path(path)


@contextmanager
def quiet_hub_logs() -> Iterator[None]:
    """huggingface_hub's warnings (each retry of a download) kept off stderr: a failure is one line."""
    hub_logger = logging.getLogger("huggingface_hub")
    level = hub_logger.level
    hub_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hub_logger.setLevel(level)


def _hub_failure(exc: BaseException | None, repo: HubName, filename: str, where: str) -> str | None:
    """The one line for a failure huggingface_hub names (no repo, no revision, no file, offline)."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(exc, RepositoryNotFoundError):
        return f"no dataset repo {repo.repo_id} at {hub_endpoint()} (or it is private and no token reaches it)"
    if isinstance(exc, RevisionNotFoundError):
        return f"the dataset repo {repo.repo_id} has no revision {repo.revision!r}"
    if isinstance(exc, LocalEntryNotFoundError):
        return f"{filename} of {where} is not in the Hub cache and cannot be fetched: {first_line(exc)}"
    if isinstance(exc, EntryNotFoundError):
        if filename == HUB_FILES:
            return f"{where} holds no {HUB_FILES}: not a store published with `bytedistill push-store`"
        return f"{where} lacks {filename}, which its {HUB_FILES} lists"
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return f"cannot fetch {filename} of {where} into the Hub cache: {exc.strerror}"
    return None


def forget(path: Path) -> None:
    """Remove a fetched file from the cache: its snapshot link and the blob it points at."""
    blob = Path(os.path.realpath(path))
    Path(path).unlink(missing_ok=True)
    if blob != Path(path):
        blob.unlink(missing_ok=True)


def checked(path: Path, entry: FileEntry, where: str) -> Path:
    """``path`` if its size and SHA-256 are the file list's (and a shard's ends its entry's); else the
    file is removed from the cache and a UserError names it."""
    problem = None
    size = path.stat().st_size
    if size != entry.size:
        problem = f"{size:,} bytes, the file list says {entry.size:,}"
    elif sha256_of(path) != entry.sha256:
        problem = "its SHA-256 is not the file list's"
    elif entry.ends is not None:
        with open(path, "rb") as handle:
            if shard_ends(handle, size) != entry.ends:
                problem = "its index is not the one the file list gives"
    if problem:
        forget(path)
        raise UserError(
            f"{entry.name} fetched from {where} is not the published file ({problem}): removed from the cache"
        )
    return path


@dataclass
class HubShard:
    """A shard of a Hub copy, fetched and checked (:func:`checked`) on first :meth:`local_path`."""

    directory: Path
    entry: FileEntry
    _ready: Path | None = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return self.entry.size

    @property
    def ends(self) -> bytes:
        return self.entry.ends or b""

    def local_path(self) -> Path:
        if self._ready is None:
            self._ready = fetch_listed(self.directory, self.entry)
        return self._ready

    def __getstate__(self):  # a data-loader worker checks the file again before it reads it
        return {"directory": self.directory, "entry": self.entry, "_ready": None}


def fetch_listed(directory: Path, entry: FileEntry) -> Path:
    """The listed file ``entry`` of the Hub copy at ``directory``, fetched if not there yet, checked."""
    repo = repo_of_snapshot(directory)
    path = Path(directory) / entry.name
    if not path.exists():
        if repo is None:
            raise UserError(f"{directory} lacks {entry.name}, which its {HUB_FILES} lists")
        path = _fetch(repo, entry.name)
    return checked(path, entry, (repo.shown if repo else str(directory)))


def hub_shards(directory: Path, listing: FileList) -> dict[str, HubShard]:
    """The shards a Hub copy lists, by name, none fetched."""
    return {name: HubShard(Path(directory), listing.entries[name]) for name in listing.shard_names}


# ------------------------------------------------------------------------------- resolving


def resolve(name: str) -> Path:
    """The store directory of the Hub copy ``name`` in the Hub cache (module docstring): the file
    list, then every listed file but the shards, each checked."""
    repo = parse_name(name)
    listed_path = _fetch(repo, HUB_FILES)
    directory = listed_path.parent
    pinned = repo_of_snapshot(directory)
    if pinned is None:
        raise UserError(f"{repo.shown}: the Hub cache put {HUB_FILES} outside a snapshot folder ({directory})")
    if listed_path.stat().st_size > MAX_LIST_BYTES:
        raise UserError(f"{HUB_FILES} of {pinned.shown} is larger than a file list can be")
    listing = parse(listed_path.read_bytes(), f"{HUB_FILES} of {pinned.shown}")
    for entry in listing.entries.values():
        if entry.ends is None:
            _fetch_checked(pinned, directory, entry)
    return directory


def _fetch_checked(repo: HubName, directory: Path, entry: FileEntry) -> Path:
    path = directory / entry.name
    return checked(path if path.exists() else _fetch(repo, entry.name), entry, repo.shown)


def local_store(name: str | os.PathLike) -> Path:
    """A store directory for ``name``: a Hub copy's (:func:`resolve`) or the path itself."""
    return resolve(str(name)) if is_hub_name(name) else Path(name)
