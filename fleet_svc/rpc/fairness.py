"""How much of the fleet one caller may hold: streams (WatchReplicas, WatchRollout) and unary
calls in flight, per identity and in all, in the spirit of kube-apiserver's max-inflight
limits and API Priority and Fairness: a caller past its share is refused at once
(RESOURCE_EXHAUSTED, TOO_MANY_CALLS, with google.rpc.RetryInfo), never queued, so a flooding
viewer holds no more than its share and cannot starve the others.

Admins keep their own share (their calls do not count against, nor are held to, the totals:
an admin can always get in to fix things), and agents' Connect streams are not counted here
at all (one per node, already bounded by the nodes the CA certified).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2

from fleet_svc.domain.errors import TooManyCalls
from fleet_svc.rpc.status import to_status
from llmgw.limits import Limits

STREAMS = "stream"
UNARY = "unary"


class Shares:
    """Counts what each caller holds, per kind (`STREAMS`, `UNARY`)."""

    def __init__(self, limits: Limits) -> None:
        self._caps = {
            STREAMS: (limits.max_streams_per_identity, limits.max_streams),
            UNARY: (limits.max_inflight_per_identity, limits.max_inflight),
        }
        self._names = {
            STREAMS: ("max_streams_per_identity", "max_streams"),
            UNARY: ("max_inflight_per_identity", "max_inflight"),
        }
        self._held: dict[str, Counter[str]] = {STREAMS: Counter(), UNARY: Counter()}
        self._total: Counter[str] = Counter()

    def held(self, kind: str, who: str = "") -> int:
        """What `who` holds of `kind` (everyone's shared total when "")."""
        return self._held[kind][who] if who else self._total[kind]

    def acquire(self, kind: str, who: str, *, own_share: bool) -> Callable[[], None]:
        """Take one of `kind` for `who` ("" for nobody verified: held to the totals only);
        `own_share` (an admin) is not counted in the total.
        Returns the function that gives it back (once).

        Raises:
            TooManyCalls: `who` holds its share already, or everyone together does.
        """
        per_identity, total = self._caps[kind]
        names = self._names[kind]
        noun = "open streams" if kind == STREAMS else "calls in flight"
        # who "" is nobody verified (dev mode): only the totals hold.
        if who and self._held[kind][who] >= per_identity:
            raise TooManyCalls(
                f"{who} already has {per_identity} {noun} ({names[0]}); close some, then retry",
                limit=names[0],
                maximum=per_identity,
                scope="identity",
                identity=who,
            )
        if not own_share and self._total[kind] >= total:
            raise TooManyCalls(
                f"the fleet already serves {total} {noun} ({names[1]}); retry in a moment",
                limit=names[1],
                maximum=total,
                scope="total",
                identity=who,
            )
        self._held[kind][who] += 1
        if not own_share:
            self._total[kind] += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            self._held[kind][who] -= 1
            if self._held[kind][who] <= 0:
                del self._held[kind][who]
            if not own_share:
                self._total[kind] -= 1

        return release


def busy_status(exc: TooManyCalls) -> status_pb2.Status:
    """The refusal's status: the table's, with google.rpc.RetryInfo saying when to retry."""
    status = to_status(exc)
    status.details.add().Pack(
        error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=exc.retry_after_s))
    )
    return status
