"""The demo's file server: model files by byte ranges, and a Hugging Face-shaped endpoint.

One threaded HTTP server on 127.0.0.1 answers

- `GET|HEAD /files/{path}`: a file of a folder (the demo's GGUF), as a CDN serves it: a
  `Range: bytes=a-b` request gets 206 with Content-Range, a range past the end 416;
- `GET|HEAD /{org}/{name}/resolve/{revision}/{path}`: a repo's file as the Hub answers it
  (`X-Repo-Commit`, `ETag`, byte ranges), enough for `hf_hub_download` and
  `get_safetensors_metadata` with `HF_ENDPOINT` pointed here;
- `GET /api/models/{org}/{name}[/revision/{revision}]`: the repo's info and its files' sizes.

Missing repos, revisions and files answer 404 with the Hub's `X-Error-Code`, so
`huggingface_hub` raises the errors it raises against the real Hub.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from urllib.parse import unquote, urlsplit

import structlog

from llmgw.demo.hf_repo import Content, SparseFile, content_size, read_content

log = structlog.get_logger(__name__)

_CHUNK_BYTES = 64 * 1024
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def _git_blob_id(data: bytes) -> str:
    """A file's git blob id: what the Hub sends as a small file's ETag."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _lfs_id(content: Content) -> str:
    """An LFS file's id. For a sparse file, a hash of its head and size stands in for the
    sha256 of gigabytes of zeros."""
    if isinstance(content, SparseFile):
        return hashlib.sha256(content.head + content.size.to_bytes(8, "little")).hexdigest()
    return hashlib.sha256(content).hexdigest()


def _is_lfs(path: str, content: Content) -> bool:
    return isinstance(content, SparseFile) or path.endswith((".safetensors", ".bin", ".gguf"))


@dataclass(frozen=True)
class LocalFile:
    """A file of the served folder, read by ranges when asked."""

    path: Path
    size: int


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """[start, end) of a `bytes=a-b` Range header, clamped to the file; None when it cannot be
    satisfied (or is not a single byte range)."""
    match = _RANGE.match(header.strip())
    if match is None:
        return None
    first, last = match.group(1), match.group(2)
    if not first and not last:
        return None
    if not first:
        start, end = max(0, size - int(last)), size
    else:
        start = int(first)
        end = min(size, int(last) + 1) if last else size
    if start >= size or start >= end:
        return None
    return start, end


class DemoFileServer:
    """Serves `folder` under /files/ and `repos` ({`ORG/NAME`: {path: content}}) as the Hub.

    Start with `start()` (or as a context manager); `url` is the base URL once started.
    """

    def __init__(
        self,
        folder: str | Path,
        repos: Mapping[str, Mapping[str, Content]],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.folder = Path(folder).resolve()
        self.repos = {name: dict(files) for name, files in repos.items()}
        self.commits = {
            name: hashlib.sha1(
                name.encode()
                + b"".join(p.encode() + _lfs_id(c).encode() for p, c in sorted(files.items()))
            ).hexdigest()
            for name, files in self.repos.items()
        }
        self._address = (host, port)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port it listens on."""
        if self._httpd is None:
            raise RuntimeError("the file server is not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """http://HOST:PORT, what HF_ENDPOINT is set to."""
        return f"http://{self._address[0]}:{self.port}"

    def file_url(self, name: str) -> str:
        """The URL of a file of the folder."""
        return f"{self.url}/files/{name}"

    def start(self) -> DemoFileServer:
        """Bind and serve in a background thread.

        Raises:
            OSError: the address cannot be bound (the port is taken).
        """
        owner = self

        class Handler(_Handler):
            server_owner = owner

        self._httpd = ThreadingHTTPServer(self._address, Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="demo-files", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> DemoFileServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def local_file(self, relative: str) -> Path | None:
        """A file of the folder by its relative path; None when absent or outside it."""
        path = (self.folder / relative).resolve()
        if not path.is_relative_to(self.folder) or not path.is_file():
            return None
        return path


class _Handler(BaseHTTPRequestHandler):
    """One request."""

    protocol_version = "HTTP/1.1"
    server_owner: DemoFileServer

    def log_message(self, format: str, *args: object) -> None:
        """Requests are logged as structured events instead."""

    def do_HEAD(self) -> None:
        self._dispatch(body=False)

    def do_GET(self) -> None:
        self._dispatch(body=True)

    def _dispatch(self, *, body: bool) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.split("/") if p]
        if parts[:1] == ["files"] and len(parts) >= 2:
            status = self._file("/".join(parts[1:]), body=body)
        elif len(parts) >= 5 and parts[2] == "resolve":
            status = self._resolve(parts, body=body)
        elif len(parts) >= 4 and parts[:2] == ["api", "models"]:
            status = self._model_info(parts[2:], body=body)
        else:
            status = self._error(HTTPStatus.NOT_FOUND, "", "no such route", body=body)
        log.info(
            "file_request_served",
            method=self.command,
            path=url.path,
            range=self.headers.get("Range", ""),
            status=int(status),
        )

    def _file(self, relative: str, *, body: bool) -> HTTPStatus:
        path = self.server_owner.local_file(relative)
        if path is None:
            return self._error(HTTPStatus.NOT_FOUND, "", f"no file {relative}", body=body)
        stat = path.stat()
        # A file is read by the range asked, never whole: a folder may hold large models.
        etag = hashlib.sha1(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
        return self._serve(LocalFile(path, stat.st_size), {"ETag": f'"{etag}"'}, body=body)

    def _repo(self, name: str, revision: str | None, *, body: bool) -> str | HTTPStatus:
        owner = self.server_owner
        if name not in owner.repos:
            return self._error(
                HTTPStatus.NOT_FOUND, "RepoNotFound", "Repository not found", body=body
            )
        if revision not in (None, "main", owner.commits[name]):
            return self._error(
                HTTPStatus.NOT_FOUND, "RevisionNotFound", "Invalid rev id", body=body
            )
        return name

    def _resolve(self, parts: list[str], *, body: bool) -> HTTPStatus:
        name, revision, path = f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:])
        repo = self._repo(name, revision, body=body)
        if isinstance(repo, HTTPStatus):
            return repo
        commit = self.server_owner.commits[repo]
        content = self.server_owner.repos[repo].get(path)
        if content is None:
            return self._error(
                HTTPStatus.NOT_FOUND,
                "EntryNotFound",
                f"{path} does not exist on {revision}",
                body=body,
                extra={"X-Repo-Commit": commit},
            )
        headers = {"X-Repo-Commit": commit}
        if _is_lfs(path, content):
            lfs_id = _lfs_id(content)
            headers |= {"ETag": f'"{lfs_id}"', "X-Linked-Etag": f'"{lfs_id}"'}
            headers["X-Linked-Size"] = str(content_size(content))
        else:
            assert isinstance(content, bytes)
            headers["ETag"] = f'"{_git_blob_id(content)}"'
        return self._serve(content, headers, body=body)

    def _model_info(self, parts: list[str], *, body: bool) -> HTTPStatus:
        if len(parts) == 2:
            revision = None
        elif len(parts) == 4 and parts[2] == "revision":
            revision = parts[3]
        else:
            return self._error(HTTPStatus.NOT_FOUND, "", "no such route", body=body)
        repo = self._repo(f"{parts[0]}/{parts[1]}", revision, body=body)
        if isinstance(repo, HTTPStatus):
            return repo
        siblings: list[dict[str, object]] = []
        for path, content in sorted(self.server_owner.repos[repo].items()):
            size = content_size(content)
            sibling: dict[str, object] = {"rfilename": path, "size": size}
            if _is_lfs(path, content):
                sibling["lfs"] = {"size": size, "sha256": _lfs_id(content), "pointerSize": 134}
            siblings.append(sibling)
        commit = self.server_owner.commits[repo]
        info = {
            "_id": commit[:24],
            "id": repo,
            "modelId": repo,
            "sha": commit,
            "private": False,
            "gated": False,
            "disabled": False,
            "tags": ["llmgw-demo"],
            "siblings": siblings,
        }
        data = json.dumps(info).encode()
        self._send(HTTPStatus.OK, {"Content-Type": "application/json"}, len(data))
        if body:
            self.wfile.write(data)
        return HTTPStatus.OK

    def _serve(
        self, content: Content | LocalFile, headers: dict[str, str], *, body: bool
    ) -> HTTPStatus:
        size = content.size if isinstance(content, LocalFile) else content_size(content)
        start, end, status = 0, size, HTTPStatus.OK
        wanted = self.headers.get("Range")
        if wanted:
            parsed = parse_range(wanted, size)
            if parsed is None:
                self._send(
                    HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE,
                    {"Content-Range": f"bytes */{size}"},
                    0,
                )
                return HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE
            start, end = parsed
            status = HTTPStatus.PARTIAL_CONTENT
            headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{size}"}
        headers = {**headers, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        self._send(status, headers, end - start)
        if body:
            for chunk in _chunks(content, start, end):
                self.wfile.write(chunk)
        return status

    def _error(
        self,
        status: HTTPStatus,
        code: str,
        message: str,
        *,
        body: bool,
        extra: Mapping[str, str] | None = None,
    ) -> HTTPStatus:
        data = json.dumps({"error": message}).encode()
        headers = {"Content-Type": "application/json", **(extra or {})}
        if code:
            headers |= {"X-Error-Code": code, "X-Error-Message": message}
        self._send(status, headers, len(data))
        if body:
            self.wfile.write(data)
        return status

    def _send(self, status: HTTPStatus, headers: Mapping[str, str], length: int) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()


def _chunks(content: Content | LocalFile, start: int, end: int) -> Iterator[bytes]:
    if isinstance(content, LocalFile):
        with content.path.open("rb") as handle:
            handle.seek(start)
            left = end - start
            while left > 0:
                chunk = handle.read(min(left, _CHUNK_BYTES))
                if not chunk:
                    return
                left -= len(chunk)
                yield chunk
        return
    for offset in range(start, end, _CHUNK_BYTES):
        yield read_content(content, offset, min(end, offset + _CHUNK_BYTES))
