"""The demo's file server: model files by byte ranges, and a Hugging Face-shaped endpoint.

One threaded HTTP server answers

- `GET|HEAD /files/{path}`: a file of a folder (the demo's GGUF), as a CDN serves it: a
  `Range: bytes=a-b` request gets 206 with Content-Range, a range past the end 416;
- `GET|HEAD /{org}/{name}/resolve/{revision}/{path}`: a repo's file as the Hub answers it
  (`X-Repo-Commit`, `ETag`, byte ranges), enough for `hf_hub_download` and
  `get_safetensors_metadata` with `HF_ENDPOINT` pointed here;
- `GET /api/models/{org}/{name}[/revision/{revision}]`: the repo's info and its files' sizes.

Missing repos, revisions and files answer 404 with the Hub's `X-Error-Code`, so
`huggingface_hub` raises the errors it raises against the real Hub. The serving itself is the
one the tests use (llmgw.testing): the folder as `range_server.answer_file` serves it, the repos
as `hub.Hub` answers them, with large files served in place rather than through a CDN.
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus
from pathlib import Path
from typing import Self

import structlog

from llmgw.testing.content import Content
from llmgw.testing.http import Exchange, Listener, ServedRequest, Serving
from llmgw.testing.hub import Hub
from llmgw.testing.range_server import answer_file

log = structlog.get_logger(__name__)


class DemoFileServer(Serving):
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
        self.hub = Hub(repos, tags=["llmgw-demo"])
        self._listener = Listener(
            self._route, name="demo-files", host=host, port=port, on_served=_log_request
        )

    @property
    def port(self) -> int:
        """The port it listens on."""
        return self._listener.port

    @property
    def url(self) -> str:
        """http://HOST:PORT, what HF_ENDPOINT is set to."""
        return self._listener.url

    def file_url(self, name: str) -> str:
        """The URL of a file of the folder."""
        return f"{self.url}/files/{name}"

    def start(self) -> Self:
        """Bind and serve in a background thread.

        Raises:
            OSError: the address cannot be bound (the port is taken).
        """
        self._listener.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._listener.stop()

    def _route(self, ex: Exchange) -> None:
        if ex.parts[:1] == ["files"] and len(ex.parts) >= 2:
            answer_file(ex, self.folder, "/".join(ex.parts[1:]))
        elif not self.hub.answer(ex):
            ex.error(HTTPStatus.NOT_FOUND, "", "no such route")


def _log_request(request: ServedRequest) -> None:
    log.info(
        "file_request_served",
        method=request.method,
        path=request.path,
        range=request.range_header,
        status=request.status,
    )
