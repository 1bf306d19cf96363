"""The audit of reads: who listed, got or watched what, in bounded space and log volume.

Mutations are audited one event each (fleet_svc.rpc.auth). Reads are far more frequent (a
dashboard polls ListModels, a gateway watches), so they are counted instead: the first read of
a kind (identity, RPC, model, outcome) in a window is logged at once as `audit_read`; further
ones of that kind in the window are added up and logged as one `audit_read_repeated` with
their count when the window ends (at the first read after it). At most `max_kinds` kinds are
kept per window; reads of further kinds are counted together and reported as
`audit_read_overflow`. So a window writes at most 2 x max_kinds + 1 lines whatever the call
rate, and the table never holds more than max_kinds entries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from fleet_svc.domain.access import Caller, short

log = structlog.get_logger(__name__)

READ_WINDOW_S = 60.0
"""How long repeats of one kind of read are added up before their count is logged."""
MAX_READ_KINDS = 1024
"""How many kinds of read one window tells apart (more are counted together)."""

Kind = tuple[str, str, str, str, str, str]
"""(identity, by, via, rpc, model, outcome)."""


@dataclass
class _Window:
    started: float
    repeats: dict[Kind, int] = field(default_factory=dict)
    overflow: int = 0


class ReadAudit:
    """Counts reads per kind and window, logging first sightings and the repeats' totals."""

    def __init__(
        self,
        window_s: float = READ_WINDOW_S,
        max_kinds: int = MAX_READ_KINDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self.max_kinds = max_kinds
        self._clock = clock
        self._window = _Window(clock())

    @property
    def kinds(self) -> int:
        """How many kinds of read the current window holds."""
        return len(self._window.repeats)

    def record(
        self, method: str, caller: Caller | None, model: str, outcome: str, reason: str = ""
    ) -> None:
        """One read of `method` by `caller` about `model` ("" for none), ended `outcome`
        (a status code's name, "opened" for a stream, "refused")."""
        now = self._clock()
        if now - self._window.started >= self.window_s:
            self.flush(now)
        kind: Kind = (
            caller.identity if caller else "unverified",
            caller.audit_name if caller else "",
            caller.how if caller else "none",
            short(method),
            model[:200],
            outcome,
        )
        repeats = self._window.repeats
        if kind in repeats:
            repeats[kind] += 1
            return
        if len(repeats) >= self.max_kinds:
            self._window.overflow += 1
            return
        repeats[kind] = 0
        identity, by, via, rpc, model_name, ended = kind
        log.info(
            "audit_read",
            identity=identity,
            by=by,
            via=via,
            rpc=rpc,
            model=model_name,
            outcome=ended,
            reason=reason[:300],
            window_s=self.window_s,
        )

    def flush(self, now: float | None = None) -> None:
        """Log the current window's repeat counts and overflow, and start a new window."""
        window = self._window
        for (identity, by, via, rpc, model, outcome), count in window.repeats.items():
            if count:
                log.info(
                    "audit_read_repeated",
                    identity=identity,
                    by=by,
                    via=via,
                    rpc=rpc,
                    model=model,
                    outcome=outcome,
                    count=count,
                    window_s=self.window_s,
                )
        if window.overflow:
            log.warning(
                "audit_read_overflow",
                count=window.overflow,
                kinds=self.max_kinds,
                window_s=self.window_s,
            )
        self._window = _Window(self._clock() if now is None else now)
