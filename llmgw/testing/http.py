"""The HTTP plumbing the test and demo servers share: a threaded listener, one request as an
`Exchange`, and bodies answered by byte ranges as a CDN answers them."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Final, Literal, Self
from urllib.parse import parse_qs, unquote, urlsplit

from llmgw.testing.content import Content, content_size, read_content

_CHUNK_BYTES = 64 * 1024
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")

UNSATISFIABLE: Final = "unsatisfiable"


def parse_range(header: str, size: int) -> tuple[int, int] | Literal["unsatisfiable"] | None:
    """Read a `Range: bytes=a-b` header against a file of `size` bytes.

    Returns:
        [start, end) clamped to the file; UNSATISFIABLE when the range starts at or past the
        end (or is an empty suffix); None when the header is not one valid byte range (another
        unit, several ranges, last < first), which RFC 9110 §14.2 lets a server ignore.
    """
    match = _RANGE.match(header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # a suffix: the last N bytes
        n = int(last)
        if n == 0 or size == 0:
            return UNSATISFIABLE
        return size - min(n, size), size
    start = int(first)
    if start >= size:
        return UNSATISFIABLE
    end = min(int(last) + 1, size) if last else size
    if end <= start:
        return None
    return start, end


@dataclass(frozen=True)
class LocalFile:
    """A file on disk, read by the range asked and never whole (a folder may hold models)."""

    path: Path
    size: int


Body = Content | LocalFile


@dataclass(frozen=True)
class ServedRequest:
    """One request as a listener answered it (recorded just before the answer's head is sent)."""

    listener: str
    """The listener's name ("hub" and "cdn" for the Hub stand-in)."""
    method: str
    path: str
    """The URL's path, percent-decoded."""
    range_header: str
    authorized: bool
    """Whether the request carried an Authorization header."""
    status: int


class Serving(ABC):
    """Something that serves between `start()` and `stop()`, or inside a `with` block."""

    @abstractmethod
    def start(self) -> Self:
        """Begin serving; returns self."""

    @abstractmethod
    def stop(self) -> None:
        """Stop serving and release the socket(s)."""

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class Exchange:
    """One request and its answer, as a route sees them."""

    def __init__(self, handler: _Handler) -> None:
        self._handler = handler
        self._listener = handler.listener
        url = urlsplit(handler.path)
        self.method = handler.command
        self.path = unquote(url.path)
        self.parts = [unquote(p) for p in url.path.split("/") if p]
        """The path's segments, each percent-decoded, empty ones dropped."""
        self.query = parse_qs(url.query)
        self.range_header = handler.headers.get("Range", "")
        self.authorization = handler.headers.get("Authorization", "")
        self.status = 0
        """The status answered; 0 until the head is sent."""

    @property
    def wants_body(self) -> bool:
        """False for HEAD: the answer is its head alone."""
        return self.method != "HEAD"

    def reply(self, status: int, headers: Mapping[str, str], data: bytes = b"") -> None:
        """Answer with `headers` and `data` (the body only to a GET)."""
        self._head(status, headers, len(data))
        if data and self.wants_body:
            self._write(data)

    def error(
        self, status: int, code: str, message: str, *, extra: Mapping[str, str] | None = None
    ) -> None:
        """Answer an error as the Hub does: a JSON body `{"error": message}`, with the
        `X-Error-Code` and `X-Error-Message` headers huggingface_hub's `hf_raise_for_status`
        reads when `code` is given."""
        headers = {"Content-Type": "application/json", **(extra or {})}
        if code:
            headers |= {"X-Error-Code": code, "X-Error-Message": message}
        self.reply(status, headers, json.dumps({"error": message}).encode())

    def send_body(
        self,
        body: Body,
        headers: Mapping[str, str],
        *,
        honour_range: bool = True,
        refuse_malformed_range: bool = False,
        pace_bytes_per_s: float = 0.0,
    ) -> None:
        """Answer with a file: 206 and Content-Range for a satisfiable range, 416 for one past
        its end, else 200 and the whole file.

        Args:
            honour_range: False answers every request whole (a server that ignores Range),
                saying `Accept-Ranges: none`.
            refuse_malformed_range: answer 416, not the whole file, to a Range header that is
                not one valid byte range (what the Hub stand-in has always done).
            pace_bytes_per_s: send the body no faster than this (a slow link, for tests of
                download progress); 0: as fast as the client reads.
        """
        size = body.size if isinstance(body, LocalFile) else content_size(body)
        wanted = self.range_header if honour_range else ""
        span = parse_range(wanted, size) if wanted else None
        if span == UNSATISFIABLE or (span is None and wanted and refuse_malformed_range):
            self._head(
                HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, {"Content-Range": f"bytes */{size}"}, 0
            )
            return
        out = {
            **headers,
            "Accept-Ranges": "bytes" if honour_range else "none",
            "Content-Type": "application/octet-stream",
        }
        if isinstance(span, tuple):
            (start, end), status = span, HTTPStatus.PARTIAL_CONTENT
            out["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        else:
            start, end, status = 0, size, HTTPStatus.OK
        self._head(status, out, end - start)
        if not self.wants_body:
            return
        began, sent = time.monotonic(), 0
        for chunk in _chunks(body, start, end):
            if self._listener.stopping.is_set() or not self._write(chunk):
                return
            sent += len(chunk)
            if pace_bytes_per_s > 0:
                ahead_s = sent / pace_bytes_per_s - (time.monotonic() - began)
                if ahead_s > 0 and self._listener.stopping.wait(ahead_s):
                    return

    def _head(self, status: int, headers: Mapping[str, str], length: int) -> None:
        handler = self._handler
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(length))
        self.status = int(status)
        # Recorded before the head leaves: a client that has its answer (a bodiless 404, say)
        # must find the request already counted.
        self._listener.served(
            ServedRequest(
                listener=self._listener.name,
                method=self.method,
                path=self.path,
                range_header=self.range_header,
                authorized=bool(self.authorization),
                status=self.status,
            )
        )
        handler.end_headers()

    def _write(self, data: bytes) -> bool:
        """Write body bytes; False when the client has hung up."""
        try:
            self._handler.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            # The client took what it needed and hung up.
            self._handler.close_connection = True
            return False
        self._listener.body_written(self.path, len(data))
        return True


class _Handler(BaseHTTPRequestHandler):
    listener: Listener
    protocol_version = "HTTP/1.1"  # keep-alive, as a client's connection pool expects
    # Headers and body go out in separate writes; with Nagle on, a kept-alive connection
    # waits out the client's delayed ACK (~40 ms) on every response.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: a listener reports its requests through `on_served`."""

    def handle(self) -> None:
        """Answer requests until the connection closes; a client that hangs up, mid-answer
        or between kept-alive requests, ends it quietly."""
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            super().handle()

    def do_HEAD(self) -> None:
        self.listener.handle(self)

    def do_GET(self) -> None:
        self.listener.handle(self)


class Listener(Serving):
    """A threaded HTTP server on its own thread, handing each request to `route`.

    Args:
        route: answers one request (or returns without answering: a stalled server).
        name: the listener's name in `ServedRequest` and its thread's name.
        host, port: where to listen (port 0: a free one).
        on_served: told of each request just before its answer's head is sent.
        on_body: told of the body bytes written, (path, count), as they are written.
    """

    def __init__(
        self,
        route: Callable[[Exchange], None],
        *,
        name: str,
        host: str = "127.0.0.1",
        port: int = 0,
        on_served: Callable[[ServedRequest], None] | None = None,
        on_body: Callable[[str, int], None] | None = None,
    ) -> None:
        self.name = name
        self.stopping = threading.Event()
        """Set by `stop`: stalled routes and bodies being written end early."""
        self._route = route
        self._address = (host, port)
        self._on_served = on_served
        self._on_body = on_body
        self._lock = threading.Lock()
        self._inflight = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port it listens on, once started."""
        if self._httpd is None:
            raise RuntimeError("the server is not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """http://HOST:PORT, once started."""
        return f"http://{self._address[0]}:{self.port}"

    def start(self) -> Self:
        """Bind and serve in a background thread.

        Raises:
            OSError: the address cannot be bound (the port is taken).
        """
        listener = self

        class Handler(_Handler):
            pass

        Handler.listener = listener
        self._httpd = ThreadingHTTPServer(self._address, Handler)
        self._httpd.daemon_threads = True
        # A short poll so that stop() (shutdown waits for the next poll) is quick.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.02},
            name=self.name,
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, release stalled handlers and close the socket."""
        self.stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def wait_idle(self, timeout_s: float = 5.0) -> None:
        """Wait until no request is being answered.

        A client can have every byte and move on before the handler thread, back from its last
        write, has counted it.

        Raises:
            TimeoutError: a request is still being answered after `timeout_s`.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if self._inflight == 0:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {self.name} listener is still answering")
            time.sleep(0.005)

    def handle(self, handler: _Handler) -> None:
        """Answer one request (called on the handler's thread)."""
        with self._lock:
            self._inflight += 1
        try:
            self._route(Exchange(handler))
        finally:
            with self._lock:
                self._inflight -= 1

    def served(self, request: ServedRequest) -> None:
        """Report a request whose head was sent."""
        if self._on_served is not None:
            self._on_served(request)

    def body_written(self, path: str, count: int) -> None:
        """Report body bytes written for `path`."""
        if self._on_body is not None:
            self._on_body(path, count)


def _chunks(body: Body, start: int, end: int) -> Iterator[bytes]:
    if isinstance(body, LocalFile):
        with body.path.open("rb") as handle:
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
        yield read_content(body, offset, min(end, offset + _CHUNK_BYTES))
