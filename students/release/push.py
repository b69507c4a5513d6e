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

**Where the token goes.** The Hugging Face token (``HF_TOKEN`` or the saved login) is sent only to
the Hub: ``https://huggingface.co``, or the endpoint ``HF_ENDPOINT`` names (huggingface_hub's own
setting for a mirror or a private Hub). An ``--endpoint`` that is neither, as a shared command line
or config file could give, gets no Hugging Face token: it gets the token in
``BYTEDISTILL_ENDPOINT_TOKEN`` if the user set one, else the push is refused before any request.
No token is sent over plain ``http`` except to this machine (127.0.0.1, ::1, localhost).

**Network.** Every request has a timeout (``timeout`` seconds to connect, and for each read or
write), and each Hub call is tried at most ``1 + retries`` times (on a network error, a timeout, a
429 or a 5xx answer), waiting 0.5 s, 1 s, 2 s… between tries; huggingface_hub also retries its own
upload requests (at most 5 times). Any failure is one line naming the endpoint and the call.

Tested against small local HTTP servers on 127.0.0.1 (tests/test_export_push.py,
tests/test_edges_export.py); no real Hub is contacted in the tests.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Self, TypeVar
from urllib.parse import urlsplit

from bytestream.stream_kind import StreamKind
from common.errors import UserError, first_line
from students.release.export_record import recorded_files
from students.release.export_staging import export_lock

HUB = "https://huggingface.co"
ENDPOINT_TOKEN = "BYTEDISTILL_ENDPOINT_TOKEN"
LOCAL_HOSTS = {"localhost"}
DEFAULT_PORTS = {"http": 80, "https": 443}
TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}
COMMIT_MESSAGE = "Upload byte student"  # the Hub commit's message (--commit-message)
TIMEOUT_S = 60.0  # seconds to connect, and for each read or write (--timeout)
RETRIES = 3  # tries after the first of each Hub call (--retries)

T = TypeVar("T")


@dataclass(frozen=True)
class UploadFile:
    path: str  # relative, with forward slashes
    size: int


@dataclass(frozen=True)
class Target:
    endpoint: str
    token: str | None  # None only for a dry run: push refuses to start without one
    token_note: str  # "with the token from …", or (no token) why push refuses


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


NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_inside(folder: Path, folder_fd: int, name: str) -> BinaryIO:
    """The recorded file ``name``, opened part by part from the folder's descriptor with no symlink
    followed, and checked as opened: a regular file with one link."""
    parts, fd, held = name.split("/"), folder_fd, []
    try:
        for part in parts[:-1]:
            fd = os.open(part, NOFOLLOW | os.O_DIRECTORY, dir_fd=fd)
            held.append(fd)
        opened = os.open(parts[-1], NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)  # a FIFO put there never blocks
    except FileNotFoundError:
        raise UserError(f"{folder} lacks {name}, which export wrote: export again") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise UserError(
                f"cannot push {folder}: {name} is reached through a symbolic link: push sends only files inside "
                "the folder (nothing was uploaded)"
            ) from None
        raise UserError(f"cannot push {folder}: cannot open {name}: {exc.strerror}") from None
    finally:
        for fd in held:
            os.close(fd)
    info = os.fstat(opened)
    problem = (
        "is not a regular file"
        if not stat.S_ISREG(info.st_mode)
        else f"has {info.st_nlink} links (a hard link: its data may be a file outside the folder)"
        if info.st_nlink != 1
        else None
    )
    if problem:
        os.close(opened)
        raise UserError(f"cannot push {folder}: {name} {problem}; export again (nothing was uploaded)")
    return os.fdopen(opened, "rb")


def open_plan(folder: Path, resources: ExitStack) -> tuple[list[UploadFile], dict[str, BinaryIO]]:
    """The files export wrote (checked: regular files inside the folder), sorted by path, each opened
    once (:func:`open_inside`) and closed with ``resources``."""
    folder = Path(folder)
    planned = sorted(recorded_files(folder))
    folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    resources.callback(os.close, folder_fd)
    opened: dict[str, BinaryIO] = {}
    for name in planned:
        opened[name] = resources.enter_context(open_inside(folder, folder_fd, name))
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


# ---------------------------------------------------------------------------- where it goes


def _origin(url: str, what: str) -> str:
    """``scheme://host[:port][/path]`` of an http(s) URL (host lower-cased, no default port, no trailing
    slash), so that one server has one spelling; a UserError otherwise."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UserError(f"{what} {url!r} is not an http(s) URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.query or parts.fragment:
        raise UserError(f"{what} {url!r} is not an http(s) URL of a server (like {HUB})")
    host = parts.hostname.lower()
    netloc = f"[{host}]" if ":" in host else host
    if port and port != DEFAULT_PORTS[parts.scheme]:
        netloc += f":{port}"
    return f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}"


def _is_this_machine(host: str) -> bool:
    if host in LOCAL_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve_target(endpoint: str | None = None, *, need_token: bool = True) -> Target:
    """The endpoint to push to and the token for it (see the module docstring for the rule); without
    ``need_token`` (a dry run) a missing token is noted instead of refused."""
    from huggingface_hub import get_token

    hubs = {_origin(HUB, "the Hub")}
    if os.environ.get("HF_ENDPOINT"):
        hubs.add(_origin(os.environ["HF_ENDPOINT"], "HF_ENDPOINT"))
    url = _origin(endpoint, "--endpoint") if endpoint else _origin(os.environ.get("HF_ENDPOINT") or HUB, "HF_ENDPOINT")
    if url in hubs:
        token, source = get_token(), "HF_TOKEN or the saved login"
        missing = f"no Hugging Face token for {url}: set HF_TOKEN or log in with `hf auth login`"
    else:
        token, source = os.environ.get(ENDPOINT_TOKEN), ENDPOINT_TOKEN
        missing = (
            f"{url} is not the Hub ({HUB} or HF_ENDPOINT): your Hugging Face token is never sent there; "
            f"set {ENDPOINT_TOKEN} to the token for that server"
        )
    if not token:
        if need_token:
            raise UserError(missing)
        return Target(url, None, missing)
    if url.startswith("http://") and not _is_this_machine(urlsplit(url).hostname or ""):
        raise UserError(f"refusing to send a token to {url} over plain http: use https")
    return Target(url, token, f"with the token from {source}")


def plan_push(folder: Path, repo_id: str, endpoint: str | None = None, *, need_token: bool = True) -> PushPlan:
    """Every check push makes before the network: folder, repo id, record, token rule, loading; the
    plan holds the folder's lock and its files open until closed."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"cannot push {folder}: no such folder")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise UserError(f"{repo_id!r} is not a Hub repo id (like your-name/byte-student): {first_line(exc)}") from exc
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


def _transient(exc: Exception) -> bool:
    """A failure worth another try: no answer in time, a dropped connection, a 429 or a 5xx."""
    import httpx2

    if isinstance(exc, (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError)):
        return True
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None) in TRANSIENT_STATUS


def _with_retries(call: Callable[[], T], what: str, endpoint: str, retries: int) -> T:
    for attempt in range(retries + 1):
        try:
            return call()
        except Exception as exc:  # a server can answer anything: every failure becomes the one line below
            if attempt < retries and _transient(exc):
                time.sleep(0.5 * 2**attempt)
                continue
            tries = f" after {attempt + 1} tries" if attempt else ""
            raise UserError(f"push to {endpoint} failed{tries} ({what}): {first_line(exc)}") from exc
    raise AssertionError("unreachable")


@contextmanager
def hub_timeout(seconds: float) -> Iterator[None]:
    """huggingface_hub's requests in this block time out after ``seconds`` (its default waits forever)."""
    from huggingface_hub.utils import set_client_factory
    from huggingface_hub.utils._http import default_client_factory  # the client it builds, with its hooks

    def client_with_timeout():
        client = default_client_factory()
        client.timeout = seconds
        return client

    set_client_factory(client_with_timeout)
    try:
        yield
    finally:
        set_client_factory(default_client_factory)


def check_network_options(timeout: float, retries: int) -> None:
    if not timeout > 0:
        raise UserError(f"--timeout must be > 0 seconds, got {timeout}")
    if retries < 0:
        raise UserError(f"--retries must be >= 0, got {retries}")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


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
    if _offline():
        raise UserError("HF_HUB_OFFLINE is set: push needs the network (unset it, or use --dry-run)")
    api = HfApi(endpoint=plan.target.endpoint, token=plan.target.token)
    operations = [CommitOperationAdd(f.path, plan.opened[f.path]) for f in plan.files]  # the files as opened

    def hub(what: str, call: Callable[[], T]) -> T:
        return _with_retries(call, what, plan.target.endpoint, retries)

    with hub_timeout(timeout):
        hub("create_repo", lambda: api.create_repo(plan.repo_id, private=private, exist_ok=True))
        if revision and revision != "main":
            hub("create_branch", lambda: api.create_branch(plan.repo_id, branch=revision, exist_ok=True))
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
