"""The rules every talk with the Hugging Face Hub keeps, an upload (``push``, ``push-store``) or a
download (a store named ``hf://datasets/…``).

**Where the token goes.** The Hugging Face token (``HF_TOKEN`` or the saved login) is sent only to
the Hub: ``https://huggingface.co``, or the endpoint ``HF_ENDPOINT`` names (huggingface_hub's own
setting for a mirror or a private Hub). An ``--endpoint`` that is neither, as a shared command line
or config file could give, gets no Hugging Face token: it gets the token in
``BYTEDISTILL_ENDPOINT_TOKEN`` if the user set one, else the upload is refused before any request.
No token is sent over plain ``http`` except to this machine (127.0.0.1, ::1, localhost).

**Network.** Every request has a timeout (``timeout`` seconds to connect, and for each read or
write), and each Hub call is tried at most ``1 + retries`` times (on a network error, a timeout, a
429 or a 5xx answer), waiting 0.5 s, 1 s, 2 s… between tries. Any failure is one line naming the
endpoint and the call.
"""

from __future__ import annotations

import ipaddress
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

from common.errors import UserError, first_line

HUB = "https://huggingface.co"
ENDPOINT_TOKEN = "BYTEDISTILL_ENDPOINT_TOKEN"
LOCAL_HOSTS = {"localhost"}
DEFAULT_PORTS = {"http": 80, "https": 443}
TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}
TIMEOUT_S = 60.0  # seconds to connect, and for each read or write (--timeout)
RETRIES = 3  # tries after the first of each Hub call (--retries)

T = TypeVar("T")


@dataclass(frozen=True)
class Target:
    endpoint: str
    token: str | None  # None only for a dry run: an upload refuses to start without one
    token_note: str  # "with the token from …", or (no token) why an upload refuses


def origin(url: str, what: str) -> str:
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


def is_this_machine(host: str) -> bool:
    if host in LOCAL_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def hub_endpoint() -> str:
    """The Hub huggingface_hub talks to: ``HF_ENDPOINT``, else https://huggingface.co."""
    return origin(os.environ.get("HF_ENDPOINT") or HUB, "HF_ENDPOINT")


def resolve_target(endpoint: str | None = None, *, need_token: bool = True) -> Target:
    """The endpoint to upload to and the token for it (see the module docstring for the rule); without
    ``need_token`` (a dry run) a missing token is noted instead of refused."""
    from huggingface_hub import get_token

    hubs = {origin(HUB, "the Hub")}
    if os.environ.get("HF_ENDPOINT"):
        hubs.add(origin(os.environ["HF_ENDPOINT"], "HF_ENDPOINT"))
    url = origin(endpoint, "--endpoint") if endpoint else hub_endpoint()
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
    if url.startswith("http://") and not is_this_machine(urlsplit(url).hostname or ""):
        raise UserError(f"refusing to send a token to {url} over plain http: use https")
    return Target(url, token, f"with the token from {source}")


def transient(exc: BaseException) -> bool:
    """A failure worth another try: no answer in time, a dropped connection, a 429 or a 5xx."""
    import httpx2

    if isinstance(exc, (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError)):
        return True
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None) in TRANSIENT_STATUS


def with_retries(call: Callable[[], T], what: str, action: str, retries: int) -> T:
    """``call()``, tried again on a transient failure (at most ``retries`` times more); any failure
    left is a UserError ``{action} failed[ after n tries] ({what}): …``."""
    for attempt in range(retries + 1):
        try:
            return call()
        except UserError:
            raise
        except Exception as exc:  # a server can answer anything: every failure becomes the one line below
            if attempt < retries and transient(exc):
                time.sleep(0.5 * 2**attempt)
                continue
            tries = f" after {attempt + 1} tries" if attempt else ""
            raise UserError(f"{action} failed{tries} ({what}): {first_line(exc)}") from exc
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


def offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` asks huggingface_hub to make no request."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def check_repo_id(repo_id: str, example: str) -> None:
    """Refuse a string that is not a Hub repo id, in one line."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise UserError(f"{repo_id!r} is not a Hub repo id (like {example}): {first_line(exc)}") from exc


def open_repo(api, repo_id: str, *, repo_type: str | None, private: bool, revision: str | None, hub) -> None:
    """Create the repo (of ``repo_type``) and, for a non-main revision, its branch, if missing;
    ``hub(what, call)`` makes each call (with its retries)."""
    hub("create_repo", lambda: api.create_repo(repo_id, repo_type=repo_type, private=private, exist_ok=True))
    if revision and revision != "main":
        hub(
            "create_branch",
            lambda: api.create_branch(repo_id, repo_type=repo_type, branch=revision, exist_ok=True),
        )
