"""A real HTTP file server on 127.0.0.1 with byte ranges, that counts what it sends.

It serves one folder as a CDN would serve GGUF files: `Range: bytes=a-b` answered with 206 and
Content-Range, a range past the end with 416, anything else with 200 and the whole file. For
failure tests it can ignore Range (answer 200 with the whole body), answer every request with
an error status, or stall before answering. It counts the body bytes it actually wrote per path,
so a test can assert how much of a file a client took.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from urllib.parse import quote, unquote, urlparse

_CHUNK_BYTES = 64 * 1024
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


@dataclass(frozen=True)
class ServedRequest:
    """One request as the server saw it."""

    method: str
    path: str
    range_header: str
    status: int


class RangeServer:
    """A threaded HTTP server for the files under `root`, on 127.0.0.1 and a free port.

    Switches (change them at any time; they apply to the next request):
    `ignore_range` answers 200 with the whole file; `fail_status` (e.g. 404, 500) answers every
    request with that status; `stall_s` waits that long before answering (cut short by `stop`);
    `redirects` maps a name to another name it answers 302 for (as Hugging Face's /resolve/
    links redirect to a CDN).
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()
        self.ignore_range = False
        self.fail_status: int | None = None
        self.stall_s = 0.0
        self.redirects: dict[str, str] = {}
        self.requests: list[ServedRequest] = []
        self._served: defaultdict[str, int] = defaultdict(int)
        self._lock = threading.Lock()
        self._inflight = 0
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT, once started."""
        if self._httpd is None:
            raise RuntimeError("the server is not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def url(self, name: str) -> str:
        """The URL of the file `name` (relative to `root`)."""
        return f"{self.base_url}/{quote(name)}"

    def served_bytes(self, name: str) -> int:
        """Body bytes written so far for the file `name` (see `wait_idle`)."""
        with self._lock:
            return self._served["/" + name]

    def wait_idle(self, timeout_s: float = 5.0) -> None:
        """Wait until no response is being written, so that counts are final.

        A client can have every byte and move on before the handler thread, back from its
        last write, has counted it.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if self._inflight == 0:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError("the range server is still answering")
            time.sleep(0.005)

    def reset_counts(self) -> None:
        """Forget the byte counts and the request log."""
        with self._lock:
            self._served.clear()
            self.requests.clear()

    def start(self) -> RangeServer:
        """Listen on 127.0.0.1:0 and serve in a background thread."""
        server = self

        class Handler(_Handler):
            owner = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        # A short poll so that stop() (shutdown waits for the next poll) is quick.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, release stalled handlers and close the socket."""
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> RangeServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _record(self, request: ServedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def _count(self, path: str, n: int) -> None:
        with self._lock:
            self._served[path] += n


class _Handler(BaseHTTPRequestHandler):
    owner: RangeServer
    protocol_version = "HTTP/1.1"  # keep-alive, as a client's connection pool expects
    # Headers and body go out in separate writes; with Nagle on, a kept-alive connection
    # waits out the client's delayed ACK (~40 ms) on every response.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: tests read `requests` instead of stderr."""

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, *, body: bool) -> None:
        with self.owner._lock:
            self.owner._inflight += 1
        try:
            self._answer_one(body=body)
        finally:
            with self.owner._lock:
                self.owner._inflight -= 1

    def _answer_one(self, *, body: bool) -> None:
        owner = self.owner
        path = unquote(urlparse(self.path).path)
        range_header = self.headers.get("Range", "")
        if owner.stall_s and owner._stopping.wait(owner.stall_s):
            return
        if owner.fail_status is not None:
            self._empty(owner.fail_status, path, range_header)
            return
        target = owner.redirects.get(path.lstrip("/"))
        if target is not None:
            self.send_response(HTTPStatus.FOUND)
            self.send_header("Location", owner.url(target))
            self.send_header("Content-Length", "0")
            self.end_headers()
            owner._record(ServedRequest(self.command, path, range_header, 302))
            return
        file = (owner.root / path.lstrip("/")).resolve()
        if not file.is_relative_to(owner.root) or not file.is_file():
            self._empty(HTTPStatus.NOT_FOUND, path, range_header)
            return
        size = file.stat().st_size
        span = None if owner.ignore_range else _parse_range(range_header, size)
        if isinstance(span, str):
            self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            owner._record(ServedRequest(self.command, path, range_header, 416))
            return
        if span is None:
            start, end, status = 0, size, HTTPStatus.OK
        else:
            start, end = span
            status = HTTPStatus.PARTIAL_CONTENT
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "none" if owner.ignore_range else "bytes")
        self.send_header("Content-Length", str(end - start))
        if status == HTTPStatus.PARTIAL_CONTENT:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        owner._record(ServedRequest(self.command, path, range_header, int(status)))
        if body:
            self._send_file(file, path, start, end)

    def _send_file(self, file: Path, path: str, start: int, end: int) -> None:
        with open(file, "rb") as f:
            f.seek(start)
            pos = start
            while pos < end and not self.owner._stopping.is_set():
                chunk = f.read(min(_CHUNK_BYTES, end - pos))
                if not chunk:
                    break
                try:
                    self.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    # The client took what it needed and hung up.
                    self.close_connection = True
                    return
                self.owner._count(path, len(chunk))
                pos += len(chunk)

    def _empty(self, status: int, path: str, range_header: str) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()
        self.owner._record(ServedRequest(self.command, path, range_header, int(status)))


def _parse_range(header: str, size: int) -> tuple[int, int] | str | None:
    """[start, end) of a single-range header; "unsatisfiable"; None to send the whole file."""
    match = _RANGE.match(header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # suffix: the last N bytes
        n = int(last)
        return (max(0, size - n), size) if n else "unsatisfiable"
    start = int(first)
    if start >= size:
        return "unsatisfiable"
    end = min(int(last) + 1, size) if last else size
    if end <= start:
        return None
    return start, end
