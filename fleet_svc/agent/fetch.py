"""The agent's model cache: GGUF files a replica's URL source names, fetched by the agent
itself into its state folder and handed to the engine as a local path.

llama-server can fetch a URL itself (`-mu`), but only when it was built with TLS; a build
without (the project's own, scripts/build_llama_server.sh) starts in router mode with no model
and answers /health all the same. The agent fetches instead: once per URL and node, bounded in
size, checked (the length the server announced, the GGUF magic, the SHA-256 a Hugging Face
resolve URL names in `X-Linked-Etag`, the commit of a resolve URL pinned to one), written
under a temporary name and renamed only when whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx

GGUF_MAGIC = b"GGUF"
DEFAULT_FETCH_MAX_BYTES = 64 << 30
"""The largest file the agent fetches unless its config says otherwise (`fetch_max_bytes`):
above the Hub's 50 GB limit on one file, so larger GGUFs there come split."""
FREE_MARGIN_BYTES = 1 << 30
"""Space left free on the cache's disk beside a fetched file."""
CHUNK_BYTES = 1 << 20

# A Hub resolve URL: /ORG/NAME/resolve/REVISION/PATH (the revision one path component).
_RESOLVE = re.compile(r"^/[^/]+/[^/]+/resolve/([^/]+)/.+$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# llama.cpp's split files (gguf-split): the first names the others, which sit beside it.
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$")
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


class FetchError(Exception):
    """A source that could not be fetched or failed a check; the message says which."""


@dataclass(frozen=True)
class Fetched:
    """A file in the cache: where, how big, what it hashes to, and the repo commit it is of
    ("" when the server named none)."""

    path: Path
    size_bytes: int
    sha256: str
    commit: str = ""


Progress = Callable[[int, int], None]
"""Called with (bytes so far, bytes in all) while a file is fetched."""


def file_name(url: str) -> str:
    """The cached file's name: the URL's last path component, reduced to safe characters."""
    name = _SAFE_NAME.sub("_", unquote(urlsplit(url).path.rsplit("/", 1)[-1]))[-120:]
    name = name.lstrip(".")
    return name if name.endswith(".gguf") else (name or "model") + ".gguf"


def pinned_commit(url: str) -> str:
    """The commit a Hub resolve URL is pinned to ("" for a branch, a tag or another URL)."""
    m = _RESOLVE.match(urlsplit(url).path)
    return m.group(1) if m and _COMMIT.match(m.group(1)) else ""


class ModelCache:
    """GGUF files fetched by URL into `root` (one folder per URL), each fetched once even
    when several replicas ask at the same time.

    Args:
        root: the cache's folder (the agent's state folder's `models/`).
        max_bytes: the largest file it fetches.
        http: the client to fetch with (one is made, honouring the proxy settings of the
            environment, when None).
    """

    def __init__(
        self,
        root: Path,
        max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self._http = http
        self._locks: dict[str, asyncio.Lock] = {}

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            timeout = httpx.Timeout(connect=15.0, read=60.0, write=15.0, pool=15.0)
            self._http = httpx.AsyncClient(timeout=timeout, follow_redirects=True)
        return self._http

    async def aclose(self) -> None:
        """Close the client it made."""
        if self._http is not None:
            await self._http.aclose()

    async def fetch(self, url: str, progress: Progress | None = None) -> Fetched:
        """The cached file of `url`, fetched first when it is not there whole.

        Raises:
            FetchError: the server refused or broke off, the file is larger than `max_bytes`
                or the free space, is split, is no GGUF, or is not what the server said.
        """
        if _SPLIT.search(urlsplit(url).path):
            raise FetchError(
                "a split GGUF (NAME-00001-of-0000N.gguf) needs every part beside it; this agent "
                "fetches one file: merge it (llama-gguf-split --merge) or give a single file"
            )
        key = hashlib.sha256(url.encode()).hexdigest()[:32]
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            folder = self.root / key
            found = _cached(folder, url)
            if found is not None:
                return found
            return await self._download(url, folder, progress)

    async def _download(self, url: str, folder: Path, progress: Progress | None) -> Fetched:
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / file_name(url)
        part = folder / f".{final.name}.part"
        try:
            async with self._client().stream("GET", url) as response:
                if response.status_code != 200:
                    raise FetchError(f"the server answered HTTP {response.status_code}")
                size, want_sha, commit = _announced(response, url)
                self._check_room(size, folder)
                digest = hashlib.sha256()
                got = 0
                with part.open("wb") as out:
                    async for chunk in response.aiter_bytes(CHUNK_BYTES):
                        if got == 0 and not chunk.startswith(GGUF_MAGIC[: len(chunk)]):
                            raise FetchError("the file is no GGUF (it does not start with GGUF)")
                        got += len(chunk)
                        if got > size:
                            raise FetchError(f"the server sent more than the {size} bytes it said")
                        digest.update(chunk)
                        out.write(chunk)
                        if progress is not None:
                            progress(got, size)
        except httpx.HTTPError as exc:
            part.unlink(missing_ok=True)
            raise FetchError(f"fetching broke off: {type(exc).__name__}: {exc}"[:300]) from None
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        sha = digest.hexdigest()
        problem = ""
        if got != size:
            problem = f"the server sent {got} of the {size} bytes it said"
        elif _head(part) != GGUF_MAGIC:
            problem = "the file is no GGUF (it does not start with GGUF)"
        elif want_sha and sha != want_sha:
            problem = f"its SHA-256 is {sha}, not the {want_sha} the server named"
        if problem:
            part.unlink(missing_ok=True)
            raise FetchError(problem)
        os.replace(part, final)
        fetched = Fetched(final, size, sha, commit)
        meta = {"url": url, "file": final.name, "bytes": size, "sha256": sha, "commit": commit}
        (folder / "fetched.json").write_text(json.dumps(meta))
        return fetched

    def _check_room(self, size: int, folder: Path) -> None:
        if size > self.max_bytes:
            raise FetchError(
                f"the file is {size} bytes, more than the {self.max_bytes} this agent fetches "
                "(fetch_max_bytes in its config)"
            )
        free = shutil.disk_usage(folder).free
        if size + FREE_MARGIN_BYTES > free:
            raise FetchError(
                f"the file is {size} bytes and the cache's disk has {free} free "
                f"(keeping {FREE_MARGIN_BYTES} spare)"
            )


def _announced(response: httpx.Response, url: str) -> tuple[int, str, str]:
    """(length, expected SHA-256 or "", commit or "") from the answer and the redirects before
    it (the Hub names the LFS file's hash and the commit on its resolve answer, the CDN the
    length)."""
    length = response.headers.get("content-length", "")
    if not length.isdigit():
        raise FetchError("the server did not say the file's length (Content-Length)")
    sha = commit = ""
    for r in (*response.history, response):
        etag = r.headers.get("x-linked-etag", "").strip().strip('"').lower()
        if _SHA256.match(etag):
            sha = etag
        commit = r.headers.get("x-repo-commit", "") or commit
    pinned = pinned_commit(url)
    if pinned and commit and commit != pinned:
        raise FetchError(f"the server answered commit {commit}, not the {pinned} the URL pins")
    return int(length), sha, commit or pinned


def _head(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read(len(GGUF_MAGIC))


def _cached(folder: Path, url: str) -> Fetched | None:
    """The file a complete earlier fetch of `url` left in `folder`; None when there is none
    (or what is there is not whole)."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        meta = json.loads((folder / "fetched.json").read_text())
        path = folder / str(meta["file"])
        whole = path.name == meta["file"] and path.stat().st_size == int(meta["bytes"])
        if meta["url"] == url and whole:
            return Fetched(path, int(meta["bytes"]), str(meta["sha256"]), str(meta["commit"]))
    return None


async def fetch_source(
    cache: ModelCache | None,
    url: str,
    say: Callable[[str], None],
    progress: Progress | None = None,
) -> tuple[str, str]:
    """Fetch `url` for a replica: (the local file, a line for its log), or ("", why not).
    `say` is told that it starts; `progress` is called with every chunk (the caller
    throttles what it reports: fleet_svc.agent.progress)."""
    name = file_name(url)
    if cache is None:
        return "", f"no model cache to fetch {name} into"
    say(f"fetching {name}")
    try:
        fetched = await cache.fetch(url, progress)
    except FetchError as exc:
        return "", f"could not fetch {name}: {exc}"
    commit = f", commit {fetched.commit}" if fetched.commit else ""
    note = (
        f"fetched {url} to {fetched.path} ({fetched.size_bytes} bytes, sha256 "
        f"{fetched.sha256}{commit})"
    )
    return str(fetched.path), note
