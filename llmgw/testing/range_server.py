"""A real HTTP file server on 127.0.0.1 with byte ranges, that counts what it sends.

It serves one folder as a CDN would serve GGUF files: `Range: bytes=a-b` answered with 206 and
Content-Range, a range past the end with 416, anything else with 200 and the whole file. For
failure tests it can ignore Range (answer 200 with the whole body), answer every request with
an error status, or stall before answering. It counts the body bytes it actually wrote per path,
so a test can assert how much of a file a client took.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import defaultdict
from http import HTTPStatus
from pathlib import Path
from typing import Self
from urllib.parse import quote

from llmgw.testing.http import Exchange, Listener, LocalFile, ServedRequest, Serving


def answer_file(ex: Exchange, root: Path, relative: str, *, honour_range: bool = True) -> None:
    """Answer with the file at `relative` under `root` (resolved), by the range asked; 404 when
    it is absent or outside `root`. Its ETag changes when its size or mtime does."""
    path = (root / relative).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        ex.error(HTTPStatus.NOT_FOUND, "", f"no file {relative}")
        return
    stat = path.stat()
    etag = hashlib.sha1(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
    ex.send_body(LocalFile(path, stat.st_size), {"ETag": f'"{etag}"'}, honour_range=honour_range)


class RangeServer(Serving):
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
        self._listener = Listener(
            self._route, name="range-server", on_served=self._record, on_body=self._count
        )

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT, once started."""
        return self._listener.url

    def url(self, name: str) -> str:
        """The URL of the file `name` (relative to `root`)."""
        return f"{self.base_url}/{quote(name)}"

    def served_bytes(self, name: str) -> int:
        """Body bytes written so far for the file `name` (see `wait_idle`)."""
        with self._lock:
            return self._served["/" + name]

    def wait_idle(self, timeout_s: float = 5.0) -> None:
        """Wait until no response is being written, so that counts are final."""
        self._listener.wait_idle(timeout_s)

    def reset_counts(self) -> None:
        """Forget the byte counts and the request log."""
        with self._lock:
            self._served.clear()
            self.requests.clear()

    def start(self) -> Self:
        """Listen on 127.0.0.1:0 and serve in a background thread."""
        self._listener.start()
        return self

    def stop(self) -> None:
        """Stop serving, release stalled handlers and close the socket."""
        self._listener.stop()

    def _route(self, ex: Exchange) -> None:
        if self.stall_s and self._listener.stopping.wait(self.stall_s):
            return
        if self.fail_status is not None:
            ex.reply(self.fail_status, {})
            return
        name = ex.path.lstrip("/")
        target = self.redirects.get(name)
        if target is not None:
            ex.reply(HTTPStatus.FOUND, {"Location": self.url(target)})
            return
        answer_file(ex, self.root, name, honour_range=not self.ignore_range)

    def _record(self, request: ServedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def _count(self, path: str, n: int) -> None:
        with self._lock:
            self._served[path] += n
