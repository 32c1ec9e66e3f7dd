"""A hub on loopback for tests: the few endpoints ``huggingface_hub`` calls, over real HTTP.

Point ``HF_ENDPOINT`` at :attr:`LoopbackHub.url` and ``huggingface_hub``'s own client does the work:

- ``GET /api/models/{repo}[/revision/{rev}]``: model info (``sha``, ``siblings``);
- ``GET /api/models/{repo}/tree/{rev}[/{path}]``: the file listing, with ``lfs.oid`` (sha256) and sizes;
- ``HEAD``/``GET /{repo}/resolve/{rev}/{path}``: ``ETag``, ``X-Repo-Commit``, ``X-Linked-Etag`` and
  ``X-Linked-Size`` (LFS files), ``Content-Length``, ``Range`` → 206 with ``Content-Range``.

Errors carry ``X-Error-Code`` as the hub sends it (``RepoNotFound``, ``EntryNotFound``,
``RevisionNotFound``, ``GatedRepo`` with 401). Bytes served are counted per file (``served``), and a
file can be served slowly (``rate``: bytes per second, for a download to kill mid-file), cut off
after some bytes once (``drop_after``), or with a published sha256 that does not match (``lie``).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


@dataclass
class HubFile:
    path: str
    source: bytes | Path  # the bytes, or a file to serve them from (read by range)
    lfs: bool = True
    lie: bool = False  # publish a sha256 that is not this file's
    rate: float | None = None  # bytes per second (None: as fast as the socket goes)
    drop_after: int | None = None  # cut the next GET's body off after this many bytes (once)
    _sha256: str | None = None

    @property
    def size(self) -> int:
        return len(self.source) if isinstance(self.source, bytes) else self.source.stat().st_size

    def read(self, start: int, end: int) -> bytes:
        if isinstance(self.source, bytes):
            return self.source[start:end]
        with self.source.open("rb") as f:
            f.seek(start)
            return f.read(end - start)

    @property
    def sha256(self) -> str:
        if self._sha256 is None:
            h = hashlib.sha256()
            for off in range(0, self.size, 1 << 22):
                h.update(self.read(off, min(self.size, off + (1 << 22))))
            self._sha256 = h.hexdigest()
        return hashlib.sha256(self._sha256.encode()).hexdigest() if self.lie else self._sha256

    @property
    def git_oid(self) -> str:
        return hashlib.sha1(f"blob {self.path}".encode()).hexdigest()


@dataclass
class Repo:
    name: str
    files: dict[str, HubFile] = field(default_factory=dict)
    token: str | None = None  # gated: only this bearer token may read it
    commit: str = ""

    def __post_init__(self):
        self.commit = self.commit or hashlib.sha1(self.name.encode()).hexdigest()


class LoopbackHub:
    """``with LoopbackHub() as hub: hub.add(repo, path, data); os.environ["HF_ENDPOINT"] = hub.url``."""

    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.served: dict[tuple[str, str], int] = {}  # (repo, path) -> body bytes sent
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self._server: ThreadingHTTPServer | None = None
        self._conns: set = set()

    def add(self, repo: str, path: str, source: bytes | Path, sha256: str | None = None, **kw) -> HubFile:
        """Serve ``source`` as ``repo``'s ``path``; ``sha256``: publish this one instead of hashing the file
        (a sparse shaped file of 17 GB that is only ever range-read)."""
        r = self.repos.setdefault(repo, Repo(repo))
        f = r.files[path] = HubFile(path, source, _sha256=sha256, **kw)
        return f

    def gate(self, repo: str, token: str) -> None:
        self.repos.setdefault(repo, Repo(repo)).token = token

    def bytes_served(self, repo: str | None = None) -> int:
        return sum(n for (r, _), n in self.served.items() if repo is None or r == repo)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "LoopbackHub":
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening and cut every open connection (a client's pooled keep-alive ones too): the network is gone."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for c in list(self._conns):
            try:
                c.shutdown(2)
                c.close()
            except OSError:
                pass
        self._conns.clear()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
_TREE = re.compile(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$")
_INFO = re.compile(r"^/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: LoopbackHub

    def log_message(self, *args):  # quiet
        pass

    def setup(self):
        super().setup()
        self.hub._conns.add(self.connection)

    def finish(self):
        self.hub._conns.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(len(body)) if not (headers and "Content-Length" in headers) else headers["Content-Length"])
        self.end_headers()
        if not head and body:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, head: bool = False) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(status, body, {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message}, head)

    def _repo(self, name: str, head: bool = False) -> Repo | None:
        r = self.hub.repos.get(name)
        if r is None:
            self._error(404, "RepoNotFound", "Repository not found", head)
            return None
        if r.token and self.headers.get("Authorization") != f"Bearer {r.token}":
            self._error(401, "GatedRepo", f"Access to model {name} is restricted. You must have access to it and be authenticated to access it. Please log in.", head)
            return None
        return r

    def _revision_ok(self, r: Repo, rev: str, head: bool = False) -> bool:
        if unquote(rev) not in ("main", r.commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
            return False
        return True

    def do_HEAD(self):
        self._route(head=True)

    def do_GET(self):
        self._route(head=False)

    def _route(self, head: bool) -> None:
        url = urlparse(self.path)
        self.hub.requests.append((self.command, url.path, self.headers.get("Range")))
        if m := _RESOLVE.match(url.path):
            return self._resolve(m[1], m[2], unquote(m[3]), head)
        if m := _TREE.match(url.path):
            return self._tree(m[1], m[2], unquote(m[3] or ""))
        if m := _INFO.match(url.path):
            return self._info(m[1], m[2] or "main")
        self._error(404, "NotFound", f"no route {url.path}", head)

    def _info(self, name: str, rev: str) -> None:
        r = self._repo(name)
        if r is None or not self._revision_ok(r, rev):
            return
        doc = {"id": name, "modelId": name, "sha": r.commit, "private": False, "gated": "manual" if r.token else False,
               "siblings": [{"rfilename": p, "size": f.size} for p, f in r.files.items()], "tags": ["gguf"]}
        self._send(200, json.dumps(doc).encode(), {"Content-Type": "application/json"})

    def _tree(self, name: str, rev: str, under: str) -> None:
        r = self._repo(name)
        if r is None or not self._revision_ok(r, rev):
            return
        out = []
        for p, f in sorted(r.files.items()):
            if under and not p.startswith(under.rstrip("/") + "/"):
                continue
            entry = {"type": "file", "oid": f.git_oid, "size": f.size, "path": p}
            if f.lfs:
                entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
            out.append(entry)
        self._send(200, json.dumps(out).encode(), {"Content-Type": "application/json"})

    def _resolve(self, name: str, rev: str, path: str, head: bool) -> None:
        r = self._repo(name, head)
        if r is None or not self._revision_ok(r, rev, head):
            return
        f = r.files.get(path)
        if f is None:
            return self._error(404, "EntryNotFound", f"{path} does not exist on \"{rev}\"", head)
        size = f.size
        hdrs = {"X-Repo-Commit": r.commit, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream",
                "ETag": f'"{f.sha256 if f.lfs else f.git_oid}"'}
        if f.lfs:
            hdrs |= {"X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": size}
        start, end, status = 0, size, 200
        rng = self.headers.get("Range")
        if rng and (m := re.match(r"bytes=(\d*)-(\d*)$", rng.strip())):
            start = int(m[1]) if m[1] else max(0, size - int(m[2]))
            end = min(size, int(m[2]) + 1) if (m[2] and m[1]) else size
            if start >= size:
                return self._send(416, b"", hdrs | {"Content-Range": f"bytes */{size}"}, head)
            status = 206
            hdrs["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        hdrs["Content-Length"] = end - start
        self.send_response(status)
        for k, v in hdrs.items():
            self.send_header(k, str(v))
        self.end_headers()
        if head:
            return
        self._body(name, f, start, end)

    def _body(self, name: str, f: HubFile, start: int, end: int) -> None:
        key = (name, f.path)
        sent, limit = 0, f.drop_after
        f.drop_after = None
        step = 64 * 1024
        t0 = time.monotonic()
        off = start
        while off < end:
            n = min(step, end - off)
            if limit is not None and sent + n > limit:
                n = max(0, limit - sent)
                chunk = f.read(off, off + n)
                self.wfile.write(chunk)
                self.hub.served[key] = self.hub.served.get(key, 0) + len(chunk)
                self.close_connection = True
                self.wfile.flush()
                self.connection.shutdown(2)  # the connection drops mid-body
                return
            chunk = f.read(off, off + n)
            try:
                self.wfile.write(chunk)
            except (BrokenPipeError, ConnectionResetError):
                return
            self.hub.served[key] = self.hub.served.get(key, 0) + len(chunk)
            sent += n
            off += n
            if f.rate:
                wait = sent / f.rate - (time.monotonic() - t0)
                if wait > 0:
                    time.sleep(wait)
