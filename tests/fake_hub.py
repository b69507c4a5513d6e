"""Stand-ins for the Hub on 127.0.0.1: a small http.server implementing just the endpoints that
huggingface_hub's create_repo, create_branch, create_commit and list_repo_tree call (repos/create,
branch, validate-yaml, preupload, commit, tree) and those hf_hub_download calls (HEAD and GET of
``resolve/REVISION/FILE``, with ranges: a cut download resumes), keeping every repo's commits in
memory; one that answers every request with an error, one that never answers, and a closed port.
Each server records every request it gets (path, body, Authorization header) and every file it
serves. Faults to serve, by file name: ``corrupt`` (other bytes than committed), ``cut`` (the
connection closed after that many bytes, the given number of times), ``stall`` (no more bytes after
that many); ``commits_left`` makes the commits after the first few fail."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar
from urllib.parse import unquote

REPO_PATH = re.compile(
    r"^/api/(?P<kind>models|datasets)/(?P<repo>[^/]+/[^/]+)/(?P<op>branch|preupload|commit|tree)/(?P<rest>.*)$"
)
RESOLVE = re.compile(r"^/(?:(?P<kind>datasets)/)?(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<file>.+)$")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    """A repo's commits (commit id -> {path: bytes}) and its branches (name -> commit id)."""

    def __init__(self):
        root = hashlib.sha1(b"root", usedforsecurity=False).hexdigest()
        self.commits = {root: {}}
        self.branches = {"main": root}

    def commit_of(self, revision: str) -> str | None:
        return self.branches.get(revision) or (revision if revision in self.commits else None)

    def add(self, branch: str, files: dict[str, bytes]) -> str:
        parent = self.branches[branch]
        tree = {**self.commits[parent], **files}
        oid = hashlib.sha1(
            parent.encode() + json.dumps(sorted((p, git_blob_id(d)) for p, d in tree.items())).encode()
        ).hexdigest()
        self.commits[oid] = tree
        self.branches[branch] = oid
        return oid


class FakeHub(BaseHTTPRequestHandler):
    requests: ClassVar[list] = []  # (path, body)
    commits: ClassVar[list] = []
    tokens: ClassVar[list] = []  # the Authorization header of each request
    repos: ClassVar[dict] = {}  # (kind, repo id) -> Repo
    served: ClassVar[list] = []  # (file, first byte) of every download
    corrupt: ClassVar[dict] = {}  # file -> the bytes served instead of the committed ones
    cut: ClassVar[dict] = {}  # file -> [bytes sent before the connection is closed, times left]
    stall: ClassVar[dict] = {}  # file -> bytes sent before the server stops answering (for 30 s)
    commits_left: ClassVar[list] = []  # [n]: n more commits are taken, then each is answered 500

    def log_message(self, *args):  # keep the test output quiet
        pass

    def _reply(self, payload, status=200):
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _record(self) -> bytes:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.requests.append((self.path, body))
        self.tokens.append(self.headers.get("Authorization"))
        return body

    def _not_found(self, code: str, message: str):
        body = json.dumps({"error": message}).encode()
        self.send_response(404)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _repo(self, kind: str, repo_id: str) -> Repo | None:
        return self.repos.get((kind or "models", repo_id))

    def do_GET(self):  # http.server's naming
        self._record()
        path = self.path.split("?")[0]
        if (match := RESOLVE.match(path)) is not None:
            return self._resolve(match)
        if (match := REPO_PATH.match(path)) is not None and match["op"] == "tree":
            return self._tree(match)
        return self._reply({"error": f"not faked: {self.path}"}, status=404)

    do_HEAD = do_GET

    def _tree(self, match):
        repo = self._repo(match["kind"], match["repo"])
        if repo is None:
            return self._not_found("RepoNotFound", "Repository not found")
        commit = repo.commit_of(unquote(match["rest"].split("/")[0]))
        if commit is None:
            return self._not_found("RevisionNotFound", "Invalid rev id")
        files = repo.commits[commit]
        return self._reply(
            [{"type": "file", "path": p, "size": len(d), "oid": git_blob_id(d)} for p, d in sorted(files.items())]
        )

    def _resolve(self, match):
        repo = self._repo(match["kind"], match["repo"])
        if repo is None:
            return self._not_found("RepoNotFound", "Repository not found")
        commit = repo.commit_of(unquote(match["revision"]))
        if commit is None:
            return self._not_found("RevisionNotFound", "Invalid rev id")
        name = unquote(match["file"])
        data = repo.commits[commit].get(name)
        if data is None:
            return self._not_found("EntryNotFound", f"{name} does not exist")
        served = self.corrupt.get(name, data)
        start = int(m[1]) if (m := re.match(r"bytes=(\d+)-", self.headers.get("Range", ""))) else 0
        self.send_response(206 if start else 200)
        self.send_header("X-Repo-Commit", commit)
        self.send_header("ETag", f'"{git_blob_id(data)}"')
        self.send_header("Content-Length", str(len(served) - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(served) - 1}/{len(served)}")
        self.end_headers()
        if self.command == "HEAD":
            return
        self.served.append((name, start))
        body = served[start:]
        if name in self.stall:
            self.wfile.write(body[: self.stall[name]])
            self.wfile.flush()
            self.stall[name] = 0  # a resumed download gets nothing more
            time.sleep(30)
            return
        cut = self.cut.get(name)
        if cut is not None and cut[1] > 0:
            cut[1] -= 1
            self.wfile.write(body[: cut[0]])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)

    def do_POST(self):
        body = self._record()
        path = self.path.split("?")[0]
        if path == "/api/repos/create":
            data = json.loads(body)
            kind = {"dataset": "datasets", "space": "spaces"}.get(data.get("type"), "models")
            self.repos.setdefault((kind, f"{data['organization']}/{data['name']}"), Repo())
            return self._reply({"url": f"http://{self.headers['Host']}/{data['organization']}/{data['name']}"})
        if path == "/api/validate-yaml":
            return self._reply({"errors": [], "warnings": []})
        match = REPO_PATH.match(path)
        repo = self._repo(match["kind"], match["repo"]) if match else None
        if "/branch/" in path:
            if repo is not None:
                repo.branches.setdefault(unquote(match["rest"]), repo.branches["main"])
            return self._reply({})
        if "/preupload/" in path:
            files = json.loads(body)["files"]
            return self._reply(
                {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}
            )
        if "/commit/" in path and self.commits_left:
            if self.commits_left[0] <= 0:
                return self._reply({"error": "Internal Server Error"}, status=500)
            self.commits_left[0] -= 1
        if "/commit/" in path:
            lines = [json.loads(line) for line in body.decode().splitlines() if line]
            header = next(item["value"] for item in lines if item["key"] == "header")
            files = {
                item["value"]["path"]: base64.b64decode(item["value"]["content"])
                for item in lines
                if item["key"] == "file"
            }
            self.commits.append({"path": path, "summary": header["summary"], "files": files})
            oid = "a" * 40
            if repo is not None:
                oid = repo.add(unquote(match["rest"]), files)
            return self._reply({"commitUrl": f"http://{self.headers['Host']}/me/student/commit/abc", "commitOid": oid})
        return self._reply({"error": f"not faked: {path}"}, status=404)

    @classmethod
    def clear(cls) -> None:
        cls.requests, cls.commits, cls.tokens, cls.served = [], [], [], []
        cls.repos, cls.corrupt, cls.cut, cls.stall, cls.commits_left = {}, {}, {}, {}, []


class ServerError(FakeHub):
    """Answers every request with 500 (and records it)."""

    requests: ClassVar[list] = []
    commits: ClassVar[list] = []
    tokens: ClassVar[list] = []

    def do_POST(self):
        self._record()
        return self._reply({"error": "Internal Server Error"}, status=500)


class RefusesUploads(FakeHub):
    """Creates repos, answers 403 to the upload (preupload) request."""

    requests: ClassVar[list] = []
    commits: ClassVar[list] = []
    tokens: ClassVar[list] = []

    def do_POST(self):
        if "/preupload/" in self.path:
            self._record()
            return self._reply({"error": "You don't have the rights to write here"}, status=403)
        return super().do_POST()


class Redirects(FakeHub):
    """Answers every request with a 307 to the same path on ``target`` (another origin)."""

    requests: ClassVar[list] = []
    commits: ClassVar[list] = []
    tokens: ClassVar[list] = []
    target: ClassVar[str] = ""

    def do_POST(self):
        self._record()
        self.send_response(307)
        self.send_header("Location", f"{self.target}{self.path}")
        self.send_header("Content-Length", "0")
        self.end_headers()


@contextmanager
def serve(handler: type[FakeHub]) -> Iterator[str]:
    """Run ``handler`` on 127.0.0.1 (a free port) in a thread; yields its URL."""
    handler.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def silent_server() -> Iterator[str]:
    """A port on 127.0.0.1 that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def closed_port() -> str:
    """The URL of a port on 127.0.0.1 nothing listens on (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
