"""What one shape resolution may fetch: bytes, files, header items and time, across everything
it reads (a GGUF header; a repo's config.json, index and every shard's header), and how many
resolutions may fetch at once.

Any caller the planner lets in can name a source, so a source is hostile: a repo of a hundred
shards with 3 MB headers, a 300 MB index, a GGUF header of one 250 MiB string or of 25 million
empty ones. Each reader charges what it is about to take to the resolution's `FetchBudget`
*before* it takes it (a declared length is checked before anything is allocated), and the
first charge past a limit ends the resolution with `FetchLimitExceeded` (LIMIT_EXCEEDED,
naming the limit). The budget of the resolution running is a context variable
(`current_budget`), set by the resolver around each fetch, so readers deep in a call chain (or
on a worker thread: `asyncio.to_thread` copies the context) find it without every signature
carrying it.
"""

from __future__ import annotations

import contextvars
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields

from planner_svc.domain.errors import FetchLimitExceeded, ResolutionsBusy


@dataclass(frozen=True)
class FetchLimits:
    """One resolution's budget and the resolutions' concurrency. The defaults hold every real
    model with room to spare: the largest GGUF headers (a 262k-token vocabulary with its
    scores, types and merges) are ~20 MiB, the most shards of a public repo ~200
    (Llama-3.1-405B has 191), a shard's safetensors header ~100 KiB."""

    max_fetch_bytes: int = 64 << 20
    """Bytes one resolution takes off the wire or the disk, every file together."""
    max_fetch_files: int = 512
    """Files one resolution reads (config, index, each shard's header, a GGUF)."""
    max_fetch_s: int = 60
    """Seconds one resolution may take, every request together."""
    max_header_items: int = 4_000_000
    """Array items one GGUF header may declare, every array together (a vocabulary of 262k
    tokens with scores, types and merges is ~1M): the parser walks each, so this bounds its
    CPU where the byte budget alone would let 8 million empty strings through."""
    max_resolutions: int = 16
    """Resolutions fetching at once, over every caller."""
    max_resolutions_per_identity: int = 4
    """Resolutions one caller (certificate identity, else its address) has fetching at once."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> FetchLimits:
        """Limits from `LLMGW_PLANNER_<FIELD>` variables; the defaults for the rest.

        Raises:
            ValueError: a variable that is not a positive whole number.
        """
        values: dict[str, int] = {}
        for f in fields(cls):
            name = f"LLMGW_PLANNER_{f.name.upper()}"
            raw = env.get(name, "").strip()
            if not raw:
                continue
            value = int(raw) if raw.isdigit() else 0
            if value < 1:
                raise ValueError(f"{name}={raw!r}: give a positive whole number")
            values[f.name] = value
        return cls(**values)


DEFAULT_FETCH_LIMITS = FetchLimits()


class FetchBudget:
    """What one resolution of `source` has taken so far, against `limits`."""

    def __init__(
        self,
        limits: FetchLimits,
        source: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.source = source
        self.bytes = 0
        self.files = 0
        self.items = 0
        self._clock = clock
        self._deadline = clock() + limits.max_fetch_s

    def exceeded(self, limit: str, count: int, what: str) -> FetchLimitExceeded:
        """The refusal of going past `limit` (a FetchLimits field) with `count`."""
        maximum: int = getattr(self.limits, limit)
        return FetchLimitExceeded(
            f"resolving {self.source[:200]} would take {what} ({count:,}), past this planner's "
            f"{limit} ({maximum:,}); give a smaller source, or raise "
            f"LLMGW_PLANNER_{limit.upper()} if the source is real.",
            source=self.source[:200],
            limit=limit,
            maximum=maximum,
            count=count,
        )

    @property
    def remaining_bytes(self) -> int:
        """Bytes still allowed."""
        return max(0, self.limits.max_fetch_bytes - self.bytes)

    @property
    def remaining_s(self) -> float:
        """Seconds still allowed (0 once the deadline passed)."""
        return max(0.0, self._deadline - self._clock())

    def check_bytes(self, n: int, what: str) -> None:
        """Refuse taking `n` more bytes when they would pass the byte budget (nothing
        charged)."""
        if self.bytes + n > self.limits.max_fetch_bytes:
            raise self.exceeded("max_fetch_bytes", self.bytes + n, what)

    def charge_bytes(self, n: int, what: str) -> None:
        """Count `n` bytes taken; refuse when they pass the byte budget."""
        self.check_bytes(n, what)
        self.bytes += n

    def charge_file(self, what: str) -> None:
        """Count one more file read; refuse past the file budget."""
        if self.files + 1 > self.limits.max_fetch_files:
            raise self.exceeded("max_fetch_files", self.files + 1, what)
        self.files += 1

    def check_files(self, n: int, what: str) -> None:
        """Refuse `n` more files up front when they would pass the file budget."""
        if self.files + n > self.limits.max_fetch_files:
            raise self.exceeded("max_fetch_files", self.files + n, what)

    def charge_items(self, n: int, what: str) -> None:
        """Count `n` header array items declared; refuse past the item budget."""
        if self.items + n > self.limits.max_header_items:
            raise self.exceeded("max_header_items", self.items + n, what)
        self.items += n

    def check_time(self, what: str) -> None:
        """Refuse once the resolution's time is up."""
        if self.remaining_s <= 0:
            raise self.timed_out(what)

    def timed_out(self, what: str) -> FetchLimitExceeded:
        """The refusal of a resolution that ran past its time."""
        return self.exceeded("max_fetch_s", self.limits.max_fetch_s, what)


_CURRENT: contextvars.ContextVar[FetchBudget | None] = contextvars.ContextVar(
    "llmgw_fetch_budget", default=None
)


def current_budget() -> FetchBudget | None:
    """The budget of the resolution this code runs in (None outside one: library use)."""
    return _CURRENT.get()


@contextmanager
def budget_in_force(budget: FetchBudget) -> Iterator[None]:
    """Make `budget` the current one for the body."""
    token = _CURRENT.set(budget)
    try:
        yield
    finally:
        _CURRENT.reset(token)


class ResolutionGate:
    """How many resolutions fetch at once, per caller and in all; past either, a new one is
    refused at once (ResolutionsBusy, RESOURCE_EXHAUSTED with a retry delay), never queued:
    a queue would hold the caller's memory as surely as the fetch."""

    def __init__(self, limits: FetchLimits) -> None:
        self._limits = limits
        self._by_caller: Counter[str] = Counter()
        self._total = 0

    @property
    def running(self) -> int:
        """Resolutions fetching now."""
        return self._total

    def acquire(self, caller: str) -> Callable[[], None]:
        """Take one place for `caller`; returns the function that gives it back (once).

        Raises:
            ResolutionsBusy: no place for this caller, or none at all.
        """
        if self._by_caller[caller] >= self._limits.max_resolutions_per_identity:
            raise ResolutionsBusy(
                f"{caller or 'this caller'} already has "
                f"{self._limits.max_resolutions_per_identity} model sources being fetched "
                "(max_resolutions_per_identity); wait for them, then retry.",
                limit="max_resolutions_per_identity",
                maximum=self._limits.max_resolutions_per_identity,
                scope="identity",
            )
        if self._total >= self._limits.max_resolutions:
            raise ResolutionsBusy(
                f"the planner is already fetching {self._limits.max_resolutions} model sources "
                "(max_resolutions); retry in a moment.",
                limit="max_resolutions",
                maximum=self._limits.max_resolutions,
                scope="total",
            )
        self._by_caller[caller] += 1
        self._total += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self._total -= 1
            self._by_caller[caller] -= 1
            if self._by_caller[caller] <= 0:
                del self._by_caller[caller]

        return release
