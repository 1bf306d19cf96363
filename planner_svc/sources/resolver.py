"""Model shapes resolved from their sources, cached with expiry, fetched once per source.

A source is a GGUF file (`https://…/x.gguf`, `http://…`, or a local path ending in `.gguf`) or a
Hugging Face repo (`hf://ORG/NAME` or `hf://ORG/NAME@REVISION`). Shapes are kept in a bounded
least-recently-used cache whose entries expire after `ttl_s` (by an injected clock), and
concurrent requests for one source share one fetch. Failures are not cached: the next request
tries again.

With a `SourcePolicy` (the planner server always gives one) a source is checked before it is
fetched: URLs only from allowed origins, every redirect hop checked, local paths only under
allowed roots (symlinks resolved first). Every transport failure reads as one error
(`policy.network_failure`), whatever the port did.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol
from urllib.parse import urlsplit

import httpx

from llmgw.shape import ModelShape
from llmgw.sources import SourceRefused, parse_url, revision_problem
from planner_svc.domain.errors import InvalidShape, SourceUnreachable
from planner_svc.domain.gguf_shape import shape_from_gguf
from planner_svc.domain.hf_shape import shape_from_hf_config
from planner_svc.sources.budget import (
    DEFAULT_FETCH_LIMITS,
    FetchBudget,
    FetchLimits,
    ResolutionGate,
    budget_in_force,
)
from planner_svc.sources.gguf_http import DEFAULT_TIMEOUT_S, read_gguf_header
from planner_svc.sources.hf_hub import fetch_hf_model, weight_bytes_from_files
from planner_svc.sources.policy import SourceNotAllowed, SourcePolicy, network_failure

ACCEPTED_FORMS = "a GGUF URL (https://…/model.gguf), a local .gguf path or hf://ORG/NAME[@REVISION]"

# Hugging Face repo ids: letters, digits, '-', '_', '.', at most 96 characters per part (the
# Hub's own rule, as huggingface_hub's validate_repo_id checks it).
_REPO_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


class GGUFHeaderLike(Protocol):
    """What the resolver reads of a GGUF header (`sources.gguf_http.GGUFHeader`)."""

    @property
    def metadata(self) -> Mapping[str, object]: ...

    @property
    def file_bytes(self) -> int: ...

    @property
    def tensor_bytes(self) -> int: ...


GGUFReader = Callable[[str], Awaitable[GGUFHeaderLike]]
HFFetcher = Callable[..., Awaitable[tuple[dict[str, object], int]]]


@dataclass
class ResolverStats:
    """Counters for tests and benchmarks."""

    hits: int = 0
    """Requests answered from the cache."""
    misses: int = 0
    """Requests the cache could not answer (they started a fetch or joined one under way)."""
    fetches: int = 0
    """Fetches started (one per miss that found no fetch under way for its key)."""
    errors: int = 0
    """Fetches that failed (their error went to every request waiting on them)."""


@dataclass(frozen=True)
class _Entry:
    shape: ModelShape
    expires_at: float


@dataclass(frozen=True)
class HFSource:
    """A parsed `hf://ORG/NAME[@REVISION]`."""

    repo: str
    revision: str | None


def parse_hf_source(source: str) -> HFSource:
    """Split `hf://ORG/NAME[@REVISION]`; InvalidShape when it is not of that form."""
    rest = source.removeprefix("hf://")
    name, at, revision = rest.partition("@")
    parts = name.split("/")
    if (
        len(parts) != 2
        or not all(_REPO_PART.fullmatch(part) for part in parts)
        or any(".." in part or "--" in part for part in parts)
    ):
        raise InvalidShape(
            f"source {source[:200]!r} is not a Hugging Face repo: write hf://ORG/NAME or "
            "hf://ORG/NAME@REVISION.",
            source=source[:200],
        )
    # The revision is joined into cache paths (refs/REVISION) and URLs: one that climbs
    # (main/../../x) would write outside the cache (llmgw.sources.revision_problem).
    why = revision_problem(revision) if at else ""
    if why:
        raise InvalidShape(
            f"source {source[:200]!r} is refused: {why}; write hf://ORG/NAME or "
            "hf://ORG/NAME@REVISION (a branch, tag or commit).",
            source=source[:200],
        )
    return HFSource(repo=name, revision=revision or None)


def _files_key(files: Sequence[tuple[str, int]], source: str) -> tuple[tuple[str, int], ...]:
    """The catalog file list as part of a cache key; InvalidShape when it is not (path, bytes)."""
    checked: list[tuple[str, int]] = []
    for entry in files:
        if (
            not isinstance(entry, tuple | list)
            or len(entry) != 2
            or not isinstance(entry[0], str)
            or isinstance(entry[1], bool)
            or not isinstance(entry[1], int)
        ):
            raise InvalidShape(f"file list entry {entry!r} is not (path, bytes).", source=source)
        checked.append((entry[0], entry[1]))
    return tuple(sorted(checked))


def _retrieve(task: asyncio.Task[ModelShape]) -> None:
    if not task.cancelled():
        task.exception()


def _is_gguf(source: str) -> bool:
    """Whether `source` names a GGUF file: an http(s) URL or a local path ending in .gguf."""
    split = urlsplit(source)
    if split.scheme in ("http", "https"):
        return bool(split.netloc) and split.path.lower().endswith(".gguf")
    # A Windows drive letter parses as a one-letter scheme; anything else with :// is not local.
    if "://" in source or not source.strip() or "\x00" in source:
        return False
    return source.lower().endswith(".gguf")


class ShapeResolver:
    """Resolves sources to shapes, with a bounded, expiring cache and one fetch per source."""

    def __init__(
        self,
        *,
        ttl_s: float = 600,
        max_entries: int = 256,
        clock: Callable[[], float] = time.monotonic,
        gguf_reader: GGUFReader | None = None,
        hf_fetcher: HFFetcher = fetch_hf_model,
        policy: SourcePolicy | None = None,
        fetch_limits: FetchLimits = DEFAULT_FETCH_LIMITS,
    ) -> None:
        """Args:
        ttl_s: how long a resolved shape is served from the cache.
        max_entries: how many shapes the cache keeps (least recently used go first).
        clock: seconds, monotonic (injected for tests).
        gguf_reader: reads a GGUF header from a URL or path (default: `read_gguf_header`,
            its every request and redirect checked against `policy`).
        hf_fetcher: fetches a Hugging Face repo's config and weights' bytes.
        policy: what may be fetched; None checks nothing (library use and tests with fake
            readers: the planner server always passes one).
        fetch_limits: each fetch's budget (bytes, files, header items, time) and how many
            fetches run at once, per caller and in all (`sources.budget`).
        """
        if ttl_s < 0 or max_entries < 1:
            raise ValueError("ttl_s must be >= 0 and max_entries >= 1")
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._clock = clock
        # Roots as real paths: a source's path is compared after its symlinks are resolved.
        self._policy = (
            replace(policy, roots=tuple(os.path.realpath(root) for root in policy.roots))
            if policy is not None
            else None
        )
        self._gguf_reader = gguf_reader or _guarded_reader(self._policy)
        self._hf_fetcher = hf_fetcher
        self._cache: OrderedDict[tuple[str, tuple[tuple[str, int], ...]], _Entry] = OrderedDict()
        self._in_flight: dict[
            tuple[str, tuple[tuple[str, int], ...]], asyncio.Task[ModelShape]
        ] = {}
        self.stats = ResolverStats()
        self._fetch_limits = fetch_limits
        self._gate = ResolutionGate(fetch_limits)

    def __len__(self) -> int:
        """How many shapes the cache holds (expired ones included until they are asked for)."""
        return len(self._cache)

    def invalidate(self, source: str | None = None) -> None:
        """Forget the cached shape of `source` (of every source when None)."""
        if source is None:
            self._cache.clear()
            return
        for key in [key for key in self._cache if key[0] == source]:
            del self._cache[key]

    async def resolve(
        self,
        source: str,
        files: Sequence[tuple[str, int]] = (),
        *,
        caller: str | Callable[[], str] = "",
    ) -> ModelShape:
        """The shape of the model at `source`.

        Args:
            source: a GGUF URL or local `.gguf` path, or `hf://ORG/NAME[@REVISION]`.
            files: the catalog's file list `(path, bytes)`, for the weights' size when the
                source does not give it.
            caller: who asks (an identity, else an address), or how to tell (called only
                when a fetch starts): a fetch it starts holds one of its places
                (`max_resolutions_per_identity`) until it ends.

        Returns:
            The model's shape (from the cache when it is there and not expired).

        Raises:
            InvalidShape: the source is of no accepted form, or what it holds is not a shape.
            SourceUnreachable: the source could not be fetched.
            FetchLimitExceeded: the fetch went past its budget.
            ResolutionsBusy: the caller, or the planner, has as many fetches running as
                allowed.
        """
        fetch = self._fetcher_for(source)
        source = source.strip()
        key = (source, _files_key(files, source))
        now = self._clock()
        entry = self._cache.get(key)
        if entry is not None:
            if now < entry.expires_at:
                self._cache.move_to_end(key)
                self.stats.hits += 1
                return entry.shape
            del self._cache[key]
        self.stats.misses += 1
        task = self._in_flight.get(key)
        if task is None:
            self._check_policy(source)
            release = self._gate.acquire(caller() if callable(caller) else caller)
            self.stats.fetches += 1
            task = asyncio.create_task(self._fetch_and_store(key, fetch, files, release))
            # A fetch whose every caller gave up still has its error retrieved (no warning).
            task.add_done_callback(_retrieve)
            self._in_flight[key] = task
        # shield: a caller that gives up (deadline, cancel) does not cancel the others' fetch.
        return await asyncio.shield(task)

    def _fetcher_for(
        self, source: object
    ) -> Callable[[str, Sequence[tuple[str, int]]], Awaitable[ModelShape]]:
        """How to fetch `source`; InvalidShape when it is of no accepted form."""
        if not isinstance(source, str):
            raise InvalidShape(f"a source must be text: {ACCEPTED_FORMS}.")
        text = source.strip()
        if text.startswith("-"):
            # llmgw.sources' rule: a source never starts with '-' (it reads as a flag).
            raise InvalidShape(
                f"source {text[:200]!r} starts with '-': {ACCEPTED_FORMS}.", source=text[:200]
            )
        if text.startswith("hf://"):
            parse_hf_source(text)
            return self._fetch_hf
        if _is_gguf(text):
            if _is_http(text):
                # Credentials in a URL are refused before anything quotes it (llmgw.sources):
                # a message, a note or a log line would carry them on.
                try:
                    parse_url(text, field="model.source")
                except SourceRefused as exc:
                    raise SourceNotAllowed(
                        exc.message, source=exc.source, field="model.source"
                    ) from None
            return self._fetch_gguf
        shown = text[:200]
        raise InvalidShape(f"source {shown!r} is not {ACCEPTED_FORMS}.", source=shown)

    def _check_policy(self, source: str) -> None:
        """SourceNotAllowed when the policy does not allow fetching `source` (checked on
        every fetch: a cached shape is answered without touching the source)."""
        if self._policy is None or source.startswith("hf://"):
            return  # the Hub endpoint is the policy's own
        if urlsplit(source).scheme in ("http", "https"):
            self._policy.check_url(source)
        else:
            real = os.path.realpath(os.path.abspath(source))
            self._policy.check_path(real, source)

    async def _fetch_and_store(
        self,
        key: tuple[str, tuple[tuple[str, int], ...]],
        fetch: Callable[[str, Sequence[tuple[str, int]]], Awaitable[ModelShape]],
        files: Sequence[tuple[str, int]],
        release: Callable[[], None],
    ) -> ModelShape:
        source = key[0]
        budget = FetchBudget(self._fetch_limits, source)
        try:
            with budget_in_force(budget):
                try:
                    async with asyncio.timeout(self._fetch_limits.max_fetch_s):
                        shape = await fetch(source, files)
                except TimeoutError:
                    raise budget.timed_out("longer than its time") from None
        except BaseException:
            self.stats.errors += 1
            raise
        finally:
            release()
            self._in_flight.pop(key, None)
        self._cache[key] = _Entry(shape, self._clock() + self._ttl_s)
        self._cache.move_to_end(key)
        while len(self._cache) > self._max_entries:
            self._cache.popitem(last=False)
        return shape

    async def _fetch_hf(self, source: str, files: Sequence[tuple[str, int]]) -> ModelShape:
        parsed = parse_hf_source(source)
        config, weights = await self._hf_fetcher(parsed.repo, parsed.revision, files=files)
        try:
            return shape_from_hf_config(config, weights_bytes=weights)
        except InvalidShape as error:
            raise InvalidShape(f"{source}: {error.message}", source=source) from error

    async def _fetch_gguf(self, source: str, files: Sequence[tuple[str, int]]) -> ModelShape:
        try:
            header = await self._gguf_reader(source)
        except SourceUnreachable as error:
            if _is_http(source) and _transport_failure(error):
                raise network_failure(source) from None
            raise
        sizes = getattr(header, "tensor_sizes", None)
        shape = shape_from_gguf(
            header.metadata,
            file_bytes=header.file_bytes,
            tensor_bytes=header.tensor_bytes,
            source=source,
            block_tensor_bytes=getattr(sizes, "by_block", None),
            named_tensor_bytes=getattr(sizes, "by_name", None),
        )
        if shape.weights_bytes == 0 and files:
            shape = replace(shape, weights_bytes=weight_bytes_from_files(files, source=source))
        return shape


def _is_http(source: str) -> bool:
    return urlsplit(source).scheme.lower() in ("http", "https")


def _transport_failure(error: BaseException) -> bool:
    """Whether `error` came of a transport failure (no HTTP answer: refused, reset, timed
    out, not HTTP), as opposed to an HTTP answer or a malformed file."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, httpx.TransportError | TimeoutError | ConnectionError):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _guarded_reader(policy: SourcePolicy | None) -> GGUFReader:
    """`read_gguf_header`, its http(s) requests made by a client that checks every request
    and every redirect against `policy` before it is sent or followed."""
    if policy is None:
        return read_gguf_header

    async def check_request(request: httpx.Request) -> None:
        policy.check_url(str(request.url))

    async def check_response(response: httpx.Response) -> None:
        if response.has_redirect_location:
            policy.check_redirect(str(response.request.url), response.headers["Location"])

    async def read(source: str) -> GGUFHeaderLike:
        if not _is_http(source):
            return await read_gguf_header(source)
        async with httpx.AsyncClient(
            timeout=httpx.Timeout(DEFAULT_TIMEOUT_S),
            event_hooks={"request": [check_request], "response": [check_response]},
        ) as client:
            return await read_gguf_header(source, client=client)

    return read
