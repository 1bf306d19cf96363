"""A real HTTP server on 127.0.0.1 shaped like the Hugging Face Hub, enough for huggingface_hub.

With `HF_ENDPOINT` pointed at it, `hf_hub_download`, `get_safetensors_metadata` and `model_info`
work against repos held in a dict `{repo: {filename: content}}`. What it answers was read from
huggingface_hub 2.4's own client code (file_download.py `get_hf_file_metadata` and
`_get_metadata_or_catch_error`, hf_api.py `parse_safetensors_file_metadata`, `file_exists`,
`model_info`, utils/_http.py `hf_raise_for_status`):

- `HEAD|GET /{repo}/resolve/{revision}/{path}`: a small file answers 200 with `X-Repo-Commit`,
  `ETag` (its git blob id) and `Content-Length`, and its bytes by `Range`; a large ("LFS") file
  answers 302 to a second listener standing in for the CDN (another origin, so the client stops
  there and reads `X-Linked-Etag`, `X-Linked-Size` and `Location`), which serves it by ranges.
- `GET /api/models/{repo}[/revision/{revision}]`: the repo's info and, with `?blobs=true`, its
  files' sizes (`siblings`).
- Missing repos answer 404 `X-Error-Code: RepoNotFound`; missing files 404 `EntryNotFound`;
  unknown revisions 404 `RevisionNotFound`; gated repos 401 `GatedRepo` unless the request
  carries the repo's token.

Large files are sparse (`SparseFile`: real head bytes, then zeros generated on demand), so a
repo can hold a real safetensors header over gigabytes of tensors that never exist in memory.
The server logs every request, for tests that count what a client asked for.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import parse_qs, unquote, urlsplit

_CHUNK_BYTES = 64 * 1024
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
# safetensors dtype names and their element sizes (the format's own table).
_DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}


@dataclass(frozen=True)
class SparseFile:
    """A file made of `head` followed by zeros up to `size` bytes, generated when read."""

    head: bytes
    size: int

    def read(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the file."""
        end = min(end, self.size)
        if start >= end:
            return b""
        head = self.head[start:end]
        return head + bytes(end - start - len(head))

    def digest(self) -> str:
        """A stand-in for the file's sha256 (hashing gigabytes of zeros would prove nothing)."""
        return hashlib.sha256(self.head + self.size.to_bytes(8, "little")).hexdigest()


Content = bytes | SparseFile


def tensor_bytes(dtype: str, shape: Sequence[int]) -> int:
    """The bytes a tensor of `dtype` and `shape` takes in a safetensors file."""
    count = 1
    for dim in shape:
        count *= dim
    return count * _DTYPE_BYTES[dtype]


def safetensors_file(
    tensors: Mapping[str, tuple[str, Sequence[int]]], *, metadata: Mapping[str, str] | None = None
) -> SparseFile:
    """A safetensors file with a real header for `tensors` ({name: (dtype, shape)}) and zeroed
    data: 8-byte little-endian header length, the JSON header (padded with spaces to 8 bytes,
    as the format's writer does), then each tensor's bytes at its `data_offsets`."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = tensor_bytes(dtype, shape)
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    head = struct.pack("<Q", len(text)) + text
    return SparseFile(head=head, size=len(head) + offset)


@dataclass(frozen=True)
class ServedRequest:
    """One request as a listener saw it."""

    listener: str
    """"hub" or "cdn"."""
    method: str
    path: str
    range_header: str
    authorized: bool
    status: int


@dataclass
class _Repo:
    files: dict[str, Content]
    version: int = 0
    commit: str = field(init=False, default="")


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _size(content: Content) -> int:
    return content.size if isinstance(content, SparseFile) else len(content)


def _read(content: Content, start: int, end: int) -> bytes:
    if isinstance(content, SparseFile):
        return content.read(start, end)
    return content[start:end]


def _is_lfs(path: str, content: Content) -> bool:
    return isinstance(content, SparseFile) or path.endswith(_LFS_SUFFIXES)


def _lfs_id(content: Content) -> str:
    if isinstance(content, SparseFile):
        return content.digest()
    return hashlib.sha256(content).hexdigest()


class HFServer:
    """The Hub stand-in: a hub listener and a CDN listener on 127.0.0.1, free ports.

    `repos` maps `ORG/NAME` to `{path: bytes or SparseFile}`; `gated` maps a repo to the token
    that may read it. Change files with `put`; each change is a new commit.
    """

    def __init__(
        self,
        repos: Mapping[str, Mapping[str, Content]],
        *,
        gated: Mapping[str, str] | None = None,
    ) -> None:
        self._repos: dict[str, _Repo] = {}
        for name, files in repos.items():
            self._repos[name] = self._new_repo(name, dict(files))
        self.gated = dict(gated or {})
        self.requests: list[ServedRequest] = []
        self._lock = threading.Lock()
        self._hub: ThreadingHTTPServer | None = None
        self._cdn: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []

    @staticmethod
    def _new_repo(name: str, files: dict[str, Content], version: int = 0) -> _Repo:
        repo = _Repo(files=files, version=version)
        repo.commit = hashlib.sha1(f"{name}@{version}".encode()).hexdigest()
        return repo

    # -- control ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The hub's base URL (what HF_ENDPOINT is set to)."""
        return self._base(self._hub)

    @property
    def cdn_url(self) -> str:
        """The CDN listener's base URL."""
        return self._base(self._cdn)

    @staticmethod
    def _base(server: ThreadingHTTPServer | None) -> str:
        if server is None:
            raise RuntimeError("the server is not started")
        host, port = server.server_address[:2]
        return f"http://{host!s}:{port}"

    def commit(self, repo: str) -> str:
        """The repo's current commit id."""
        with self._lock:
            return self._repos[repo].commit

    def put(self, repo: str, path: str, content: Content) -> None:
        """Add or replace a file, as a new commit (creating the repo when it is new)."""
        with self._lock:
            old = self._repos.get(repo)
            files = dict(old.files) if old else {}
            files[path] = content
            self._repos[repo] = self._new_repo(repo, files, (old.version + 1) if old else 0)

    def count(
        self, *, listener: str | None = None, method: str | None = None, path: str = ""
    ) -> int:
        """How many requests matched: by listener, method and a substring of the path."""
        with self._lock:
            return sum(
                1
                for r in self.requests
                if (listener is None or r.listener == listener)
                and (method is None or r.method == method)
                and path in r.path
            )

    def reset_counts(self) -> None:
        """Forget the request log."""
        with self._lock:
            self.requests.clear()

    def start(self) -> HFServer:
        """Start both listeners."""
        self._hub = self._listen("hub")
        self._cdn = self._listen("cdn")
        return self

    def stop(self) -> None:
        """Stop both listeners and wait for their threads."""
        for server in (self._hub, self._cdn):
            if server is not None:
                server.shutdown()
                server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads.clear()

    def __enter__(self) -> HFServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _listen(self, listener: str) -> ThreadingHTTPServer:
        owner = self

        class Handler(_Handler):
            server_owner = owner
            role = listener

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        thread = threading.Thread(
            target=server.serve_forever, args=(0.02,), name=f"hf-{listener}", daemon=True
        )
        thread.start()
        self._threads.append(thread)
        return server

    # -- what the listeners answer --------------------------------------------------------------

    def _log(self, request: ServedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def _snapshot(self, repo: str) -> _Repo | None:
        with self._lock:
            return self._repos.get(repo)

    def _blob(self, lfs_id: str) -> Content | None:
        with self._lock:
            for repo in self._repos.values():
                for path, content in repo.files.items():
                    if _is_lfs(path, content) and _lfs_id(content) == lfs_id:
                        return content
        return None


class _Handler(BaseHTTPRequestHandler):
    """One request to the hub or the CDN listener."""

    protocol_version = "HTTP/1.1"
    server_owner: HFServer
    role: str

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the owner's request log is the record."""

    def do_HEAD(self) -> None:
        self._dispatch(body=False)

    def do_GET(self) -> None:
        self._dispatch(body=True)

    # -- routing ---------------------------------------------------------------------------

    def _dispatch(self, *, body: bool) -> None:
        url = urlsplit(self.path)
        parts = [unquote(part) for part in url.path.split("/") if part]
        status = HTTPStatus.NOT_FOUND
        try:
            if self.role == "cdn":
                status = self._cdn(parts, body=body)
            elif len(parts) >= 5 and parts[2] == "resolve":
                status = self._resolve(parts, body=body)
            elif len(parts) >= 4 and parts[:2] == ["api", "models"]:
                status = self._model_info(parts[2:], parse_qs(url.query), body=body)
            else:
                status = self._error(HTTPStatus.NOT_FOUND, "", "no such route", body=body)
        finally:
            self.server_owner._log(
                ServedRequest(
                    listener=self.role,
                    method=self.command,
                    path=url.path,
                    range_header=self.headers.get("Range", ""),
                    authorized="Authorization" in self.headers,
                    status=int(status),
                )
            )

    def _repo_or_error(self, name: str, revision: str | None, *, body: bool) -> _Repo | HTTPStatus:
        owner = self.server_owner
        repo = owner._snapshot(name)
        if repo is None:
            return self._error(
                HTTPStatus.NOT_FOUND, "RepoNotFound", "Repository not found", body=body
            )
        token = owner.gated.get(name)
        if token is not None and self.headers.get("Authorization") != f"Bearer {token}":
            return self._error(
                HTTPStatus.UNAUTHORIZED,
                "GatedRepo",
                f"Access to model {name} is restricted. You must have access to it and be "
                "authenticated to access it.",
                body=body,
            )
        if revision not in (None, "main", repo.commit):
            return self._error(
                HTTPStatus.NOT_FOUND, "RevisionNotFound", "Invalid rev id", body=body
            )
        return repo

    def _resolve(self, parts: list[str], *, body: bool) -> HTTPStatus:
        name, revision, path = f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:])
        repo = self._repo_or_error(name, revision, body=body)
        if isinstance(repo, HTTPStatus):
            return repo
        content = repo.files.get(path)
        if content is None:
            return self._error(
                HTTPStatus.NOT_FOUND,
                "EntryNotFound",
                f"{path} does not exist on {revision}",
                body=body,
                commit=repo.commit,
            )
        if _is_lfs(path, content):
            lfs_id = _lfs_id(content)
            headers = {
                "X-Repo-Commit": repo.commit,
                "X-Linked-Etag": f'"{lfs_id}"',
                "X-Linked-Size": str(_size(content)),
                "ETag": f'"{_git_blob_id(lfs_id.encode())}"',
                "Location": f"{self.server_owner.cdn_url}/blobs/{lfs_id}",
                "Content-Length": "0",
            }
            self._send(HTTPStatus.FOUND, headers)
            return HTTPStatus.FOUND
        assert isinstance(content, bytes)
        return self._serve(
            content,
            {"X-Repo-Commit": repo.commit, "ETag": f'"{_git_blob_id(content)}"'},
            body=body,
        )

    def _cdn(self, parts: list[str], *, body: bool) -> HTTPStatus:
        content = (
            self.server_owner._blob(parts[1]) if len(parts) == 2 and parts[0] == "blobs" else None
        )
        if content is None:
            return self._error(HTTPStatus.NOT_FOUND, "", "no such blob", body=body)
        return self._serve(content, {"ETag": f'"{parts[1]}"'}, body=body)

    def _model_info(
        self, parts: list[str], query: dict[str, list[str]], *, body: bool
    ) -> HTTPStatus:
        if len(parts) == 2:
            revision = None
        elif len(parts) == 4 and parts[2] == "revision":
            revision = parts[3]
        else:
            return self._error(HTTPStatus.NOT_FOUND, "", "no such route", body=body)
        name = f"{parts[0]}/{parts[1]}"
        repo = self._repo_or_error(name, revision, body=body)
        if isinstance(repo, HTTPStatus):
            return repo
        blobs = query.get("blobs", [""])[0].lower() == "true"
        siblings: list[dict[str, object]] = []
        for path, content in sorted(repo.files.items()):
            sibling: dict[str, object] = {"rfilename": path}
            if blobs:
                size = _size(content)
                if _is_lfs(path, content):
                    lfs_id = _lfs_id(content)
                    sibling["blobId"] = _git_blob_id(lfs_id.encode())
                    sibling["size"] = size
                    sibling["lfs"] = {"size": size, "sha256": lfs_id, "pointerSize": 134}
                else:
                    assert isinstance(content, bytes)
                    sibling["blobId"] = _git_blob_id(content)
                    sibling["size"] = size
            siblings.append(sibling)
        info = {
            "_id": repo.commit[:24],
            "id": name,
            "modelId": name,
            "sha": repo.commit,
            "private": False,
            "gated": "manual" if name in self.server_owner.gated else False,
            "disabled": False,
            "siblings": siblings,
        }
        data = json.dumps(info).encode()
        self._send(
            HTTPStatus.OK,
            {"Content-Type": "application/json", "Content-Length": str(len(data))},
        )
        if body:
            self.wfile.write(data)
        return HTTPStatus.OK

    # -- answers ---------------------------------------------------------------------------

    def _serve(self, content: Content, headers: dict[str, str], *, body: bool) -> HTTPStatus:
        size = _size(content)
        start, end = 0, size
        status = HTTPStatus.OK
        wanted = self.headers.get("Range")
        if wanted:
            match = _RANGE.match(wanted.strip())
            parsed = _parse_range(match, size) if match else None
            if parsed is None:
                self._send(
                    HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE,
                    {"Content-Range": f"bytes */{size}", "Content-Length": "0"},
                )
                return HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE
            start, end = parsed
            status = HTTPStatus.PARTIAL_CONTENT
            headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{size}"}
        self._send(
            status,
            {
                **headers,
                "Accept-Ranges": "bytes",
                "Content-Type": "application/octet-stream",
                "Content-Length": str(end - start),
            },
        )
        if body:
            for chunk in _chunks(content, start, end):
                self.wfile.write(chunk)
        return status

    def _error(
        self, status: HTTPStatus, code: str, message: str, *, body: bool, commit: str = ""
    ) -> HTTPStatus:
        data = json.dumps({"error": message}).encode()
        headers = {"Content-Type": "application/json", "Content-Length": str(len(data))}
        if code:
            headers["X-Error-Code"] = code
            headers["X-Error-Message"] = message
        if commit:
            headers["X-Repo-Commit"] = commit
        self._send(status, headers)
        if body:
            self.wfile.write(data)
        return status

    def _send(self, status: HTTPStatus, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()


def _parse_range(match: re.Match[str], size: int) -> tuple[int, int] | None:
    """[start, end) for a `bytes=a-b` match, clamped to the file; None when unsatisfiable."""
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


def _chunks(content: Content, start: int, end: int) -> Iterator[bytes]:
    for offset in range(start, end, _CHUNK_BYTES):
        yield _read(content, offset, min(end, offset + _CHUNK_BYTES))
