"""A Hugging Face-shaped Hub over repos held in memory, enough for huggingface_hub.

With `HF_ENDPOINT` pointed at it, `hf_hub_download`, `get_safetensors_metadata` and `model_info`
work against repos held in a dict `{repo: {filename: content}}`. What it answers was read from
huggingface_hub 2.4's own client code (file_download.py `get_hf_file_metadata` and
`_get_metadata_or_catch_error`, hf_api.py `parse_safetensors_file_metadata`, `file_exists`,
`model_info`, utils/_http.py `hf_raise_for_status`):

- `HEAD|GET /{repo}/resolve/{revision}/{path}`: a small file answers 200 with `X-Repo-Commit`,
  `ETag` (its git blob id) and `Content-Length`, and its bytes by `Range`; a large ("LFS") file
  says `X-Linked-Etag` and `X-Linked-Size` and either answers 302 to a CDN (another origin, so
  the client stops there and reads those headers and `Location`), which serves it by ranges,
  or, with no CDN, serves its bytes in place.
- `GET /api/models/{repo}[/revision/{revision}]`: the repo's info and, with `?blobs=true`, its
  files' sizes (`siblings`).
- Missing repos answer 404 `X-Error-Code: RepoNotFound`; missing files 404 `EntryNotFound`;
  unknown revisions 404 `RevisionNotFound`; gated repos 401 `GatedRepo` unless the request
  carries the repo's token.

`Hub` holds the answers; `HFServer` serves them on a hub and a CDN listener for tests, and the
demo's file server (llmgw/demo/files.py) serves them beside its files.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from http import HTTPStatus
from typing import Self

from llmgw.testing.content import Content, content_id, content_size, git_blob_id
from llmgw.testing.http import Exchange, Listener, ServedRequest, Serving

_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def is_lfs(path: str, content: Content) -> bool:
    """Whether the Hub would keep the file in LFS: a large (sparse) one or a weights file."""
    return not isinstance(content, bytes) or path.endswith(_LFS_SUFFIXES)


def commit_id(repo: str, files: Mapping[str, Content]) -> str:
    """A repo's commit id, derived from its name and its files' contents."""
    text = repo.encode() + b"".join(
        path.encode() + content_id(content).encode() for path, content in sorted(files.items())
    )
    return hashlib.sha1(text).hexdigest()


class Hub:
    """The Hub's answers for `repos` ({`ORG/NAME`: {path: content}}).

    Args:
        repos: the repos and their files.
        gated: repo -> the token that may read it (401 `GatedRepo` without it).
        tags: the tags every repo's info lists.
    """

    def __init__(
        self,
        repos: Mapping[str, Mapping[str, Content]],
        *,
        gated: Mapping[str, str] | None = None,
        tags: Sequence[str] = (),
    ) -> None:
        self.repos = {name: dict(files) for name, files in repos.items()}
        self.commits = {name: commit_id(name, files) for name, files in self.repos.items()}
        self.gated = dict(gated or {})
        self.tags = list(tags)
        self._blobs = {
            content_id(content): content
            for files in self.repos.values()
            for path, content in files.items()
            if is_lfs(path, content)
        }

    def answer(self, ex: Exchange, *, lfs_location: Callable[[str], str] | None = None) -> bool:
        """Answer `ex` when it is one of the Hub's routes; False (nothing sent) when not.

        Args:
            lfs_location: the URL an LFS file of that id redirects to (a CDN); None serves it
                in place.
        """
        parts = ex.parts
        if len(parts) >= 5 and parts[2] == "resolve":
            self._resolve(ex, parts, lfs_location)
            return True
        if len(parts) >= 4 and parts[:2] == ["api", "models"]:
            self._model_info(ex, parts[2:])
            return True
        return False

    def answer_blob(self, ex: Exchange) -> None:
        """Answer as the CDN: `/blobs/{id}` serves the LFS file of that id by ranges."""
        parts = ex.parts
        content = self._blobs.get(parts[1]) if len(parts) == 2 and parts[0] == "blobs" else None
        if content is None:
            ex.error(HTTPStatus.NOT_FOUND, "", "no such blob")
            return
        ex.send_body(content, {"ETag": f'"{parts[1]}"'}, refuse_malformed_range=True)

    def _readable(self, ex: Exchange, name: str, revision: str | None) -> bool:
        """Whether the repo exists, the request may read it and the revision is known; when
        not, the error is answered."""
        if name not in self.repos:
            ex.error(HTTPStatus.NOT_FOUND, "RepoNotFound", "Repository not found")
            return False
        token = self.gated.get(name)
        if token is not None and ex.authorization != f"Bearer {token}":
            ex.error(
                HTTPStatus.UNAUTHORIZED,
                "GatedRepo",
                f"Access to model {name} is restricted. You must have access to it and be "
                "authenticated to access it.",
            )
            return False
        if revision not in (None, "main", self.commits[name]):
            ex.error(HTTPStatus.NOT_FOUND, "RevisionNotFound", "Invalid rev id")
            return False
        return True

    def _resolve(
        self, ex: Exchange, parts: list[str], lfs_location: Callable[[str], str] | None
    ) -> None:
        name, revision, path = f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:])
        if not self._readable(ex, name, revision):
            return
        commit = self.commits[name]
        content = self.repos[name].get(path)
        if content is None:
            ex.error(
                HTTPStatus.NOT_FOUND,
                "EntryNotFound",
                f"{path} does not exist on {revision}",
                extra={"X-Repo-Commit": commit},
            )
            return
        headers = {"X-Repo-Commit": commit}
        if not is_lfs(path, content):
            assert isinstance(content, bytes)
            ex.send_body(
                content,
                headers | {"ETag": f'"{git_blob_id(content)}"'},
                refuse_malformed_range=True,
            )
            return
        lfs_id = content_id(content)
        headers |= {
            "X-Linked-Etag": f'"{lfs_id}"',
            "X-Linked-Size": str(content_size(content)),
            # The pointer file's id stands in: huggingface_hub prefers X-Linked-Etag.
            "ETag": f'"{git_blob_id(lfs_id.encode())}"',
        }
        if lfs_location is None:
            ex.send_body(content, headers, refuse_malformed_range=True)
        else:
            ex.reply(HTTPStatus.FOUND, headers | {"Location": lfs_location(lfs_id)})

    def _model_info(self, ex: Exchange, parts: list[str]) -> None:
        if len(parts) == 2:
            revision = None
        elif len(parts) == 4 and parts[2] == "revision":
            revision = parts[3]
        else:
            ex.error(HTTPStatus.NOT_FOUND, "", "no such route")
            return
        name = f"{parts[0]}/{parts[1]}"
        if not self._readable(ex, name, revision):
            return
        blobs = ex.query.get("blobs", [""])[0].lower() == "true"
        siblings = [
            _sibling(path, content, blobs) for path, content in sorted(self.repos[name].items())
        ]
        commit = self.commits[name]
        info = {
            "_id": commit[:24],
            "id": name,
            "modelId": name,
            "sha": commit,
            "private": False,
            "gated": "manual" if name in self.gated else False,
            "disabled": False,
            "tags": self.tags,
            "siblings": siblings,
        }
        ex.reply(HTTPStatus.OK, {"Content-Type": "application/json"}, json.dumps(info).encode())


def _sibling(path: str, content: Content, blobs: bool) -> dict[str, object]:
    """A file as the repo's info lists it; its id and size only when `blobs` was asked."""
    sibling: dict[str, object] = {"rfilename": path}
    if not blobs:
        return sibling
    size = content_size(content)
    sibling["size"] = size
    if is_lfs(path, content):
        lfs_id = content_id(content)
        sibling["blobId"] = git_blob_id(lfs_id.encode())
        sibling["lfs"] = {"size": size, "sha256": lfs_id, "pointerSize": 134}
    else:
        assert isinstance(content, bytes)
        sibling["blobId"] = git_blob_id(content)
    return sibling


class HFServer(Serving):
    """The Hub stand-in for tests: a hub listener and a CDN listener on 127.0.0.1, free ports.

    `repos` maps `ORG/NAME` to `{path: bytes or SparseFile}`; `gated` maps a repo to the token
    that may read it. Every request is logged in `requests`, for tests that count what a client
    asked for.
    """

    def __init__(
        self,
        repos: Mapping[str, Mapping[str, Content]],
        *,
        gated: Mapping[str, str] | None = None,
    ) -> None:
        self.hub = Hub(repos, gated=gated)
        self.requests: list[ServedRequest] = []
        self._lock = threading.Lock()
        self._hub = Listener(self._answer_hub, name="hub", on_served=self._log)
        self._cdn = Listener(self.hub.answer_blob, name="cdn", on_served=self._log)

    @property
    def url(self) -> str:
        """The hub's base URL (what HF_ENDPOINT is set to)."""
        return self._hub.url

    @property
    def cdn_url(self) -> str:
        """The CDN listener's base URL."""
        return self._cdn.url

    def commit(self, repo: str) -> str:
        """The repo's commit id."""
        return self.hub.commits[repo]

    def count(
        self, *, listener: str | None = None, method: str | None = None, path: str = ""
    ) -> int:
        """How many requests matched: by listener, method and a substring of the path."""
        return sum(1 for r in self._matching(listener, method) if path in r.path)

    def reset_counts(self) -> None:
        """Forget the request log."""
        with self._lock:
            self.requests.clear()

    def start(self) -> Self:
        """Start both listeners."""
        self._hub.start()
        self._cdn.start()
        return self

    def stop(self) -> None:
        """Stop both listeners and wait for their threads."""
        self._hub.stop()
        self._cdn.stop()

    def _answer_hub(self, ex: Exchange) -> None:
        if not self.hub.answer(ex, lfs_location=lambda lfs_id: f"{self.cdn_url}/blobs/{lfs_id}"):
            ex.error(HTTPStatus.NOT_FOUND, "", "no such route")

    def _matching(self, listener: str | None, method: str | None) -> Iterable[ServedRequest]:
        with self._lock:
            return [
                r
                for r in self.requests
                if (listener is None or r.listener == listener)
                and (method is None or r.method == method)
            ]

    def _log(self, request: ServedRequest) -> None:
        with self._lock:
            self.requests.append(request)
