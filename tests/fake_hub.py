"""Stand-ins for the Hub on 127.0.0.1: a small http.server implementing just the endpoints that
create_repo, create_branch and create_commit call (repos/create, branch, validate-yaml, preupload,
commit), one that answers every request with an error, one that never answers, and a closed port.
Each server records every request it gets (path, body, Authorization header)."""

from __future__ import annotations

import base64
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar


class FakeHub(BaseHTTPRequestHandler):
    requests: ClassVar[list] = []  # (path, body)
    commits: ClassVar[list] = []
    tokens: ClassVar[list] = []  # the Authorization header of each request

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

    def do_GET(self):  # http.server's naming
        self._record()
        return self._reply({"error": f"not faked: {self.path}"}, status=404)

    def do_POST(self):
        body = self._record()
        path = self.path.split("?")[0]
        if path == "/api/repos/create":
            data = json.loads(body)
            return self._reply({"url": f"http://{self.headers['Host']}/{data['organization']}/{data['name']}"})
        if path == "/api/validate-yaml":
            return self._reply({"errors": [], "warnings": []})
        if "/branch/" in path:
            return self._reply({})
        if "/preupload/" in path:
            files = json.loads(body)["files"]
            return self._reply(
                {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}
            )
        if "/commit/" in path:
            lines = [json.loads(line) for line in body.decode().splitlines() if line]
            header = next(item["value"] for item in lines if item["key"] == "header")
            files = {
                item["value"]["path"]: base64.b64decode(item["value"]["content"])
                for item in lines
                if item["key"] == "file"
            }
            self.commits.append({"path": path, "summary": header["summary"], "files": files})
            return self._reply(
                {"commitUrl": f"http://{self.headers['Host']}/me/student/commit/abc", "commitOid": "a" * 40}
            )
        return self._reply({"error": f"not faked: {path}"}, status=404)

    @classmethod
    def clear(cls) -> None:
        cls.requests, cls.commits, cls.tokens = [], [], []


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
