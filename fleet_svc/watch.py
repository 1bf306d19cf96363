"""The endpoint hub: which replicas are routable, numbered changes told to every WatchReplicas
stream, a bounded history to resume from, and heartbeats on idle streams."""

from __future__ import annotations

import asyncio
import enum
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, replace

import structlog

from fleet_svc.domain.endpoints import Endpoint, EndpointReason

log = structlog.get_logger(__name__)

WATCHER_QUEUE = 10_000
"""Events a watcher may fall behind by before it is cut off (it reconnects for a snapshot)."""
HISTORY = 4096
"""Events kept to resume a watcher from (every model's together)."""
HEARTBEAT_S = 5.0
"""Silence after which an idle stream gets a HEARTBEAT: well under the 15 s read timeouts
proxies hold streams to (nginx's `grpc_read_timeout` defaults to 60 s; meshes often cut
idle HTTP/2 streams after 15-60 s)."""


class EventKind(enum.Enum):
    """What an event of the endpoint stream says."""

    ADDED = "ADDED"
    """The endpoint is routable (a replica id the watcher holds is replaced: upsert)."""
    UPDATED = "UPDATED"
    """An endpoint already ADDED changed what a router reads (its address, its ready time)."""
    REMOVED = "REMOVED"
    """The endpoint must no longer be routed to; `reason` says why."""
    SYNCED = "SYNCED"
    """The snapshot (or the events missed since a resumed sequence) has been sent."""
    HEARTBEAT = "HEARTBEAT"
    """Nothing happened for the heartbeat interval; carries the latest sequence."""


@dataclass(frozen=True)
class EndpointEvent:
    """One message of the endpoint stream."""

    kind: EventKind
    seq: int
    at_s: float
    """When the hub made it, on the wall clock."""
    epoch: str
    endpoint: Endpoint | None = None
    reason: EndpointReason | None = None
    resumed: bool = False
    """On SYNCED: the missed events were sent again (False: a fresh snapshot)."""
    note: str = ""
    """On SYNCED: why a resume could not be honoured."""

    @property
    def model(self) -> str:
        """The endpoint's model ("" for SYNCED and HEARTBEAT)."""
        return self.endpoint.model if self.endpoint is not None else ""


Split = Callable[[Mapping[str, tuple[int, int]]], Mapping[str, int]]
"""(replica id -> (revision, own weight)) -> replica id -> the weight to publish."""
Weigher = Callable[[str], Split | None]
"""A model -> how its endpoints' weights are split now (a canary's step), or None when each
endpoint keeps its own weight."""


def no_split(model: str) -> Split | None:
    """Every endpoint keeps its own weight (no canary)."""
    return None


class WatcherTooSlow(Exception):
    """A watcher fell too far behind and was cut off."""


class EndpointHub:
    """Keeps the routable endpoints, numbers their changes and fans them out to watchers.

    Args:
        wall: the wall clock that stamps events.
        history: how many events are kept to resume from.
        heartbeat_s: a stream's longest silence before it gets a HEARTBEAT.
        epoch: names this hub's numbering (a fresh random one by default).
    """

    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        *,
        history: int = HISTORY,
        heartbeat_s: float = HEARTBEAT_S,
        epoch: str = "",
    ) -> None:
        if heartbeat_s <= 0:
            raise ValueError("the heartbeat interval must be positive")
        self._wall = wall
        self.heartbeat_s = heartbeat_s
        self.epoch = epoch or uuid.uuid4().hex[:16]
        self._ready: dict[str, Endpoint] = {}
        self._own: dict[str, Endpoint] = {}
        """The routable endpoints as put, with their own weights (`_ready` as published)."""
        self._of_model: dict[str, set[str]] = {}
        """Model -> the replica ids of its endpoints in `_own`."""
        self.weigh: Weigher = no_split
        """What decides the published weights of a model's endpoints (a canary's split)."""
        self._split: set[str] = set()
        """Models whose endpoints were last published at split weights; every other model's
        are published at their own weights, so a put or remove of one endpoint of such a model
        changes no other's and is published alone (a model of N endpoints turning ready one
        by one is N events, not N² comparisons)."""
        self._seq = 0
        self._history: deque[EndpointEvent] = deque(maxlen=max(history, 1))
        self._watchers: set[asyncio.Queue[EndpointEvent | None]] = set()
        self.cut = 0
        """Watchers cut off so far for falling behind (fleet_svc.metrics counts them)."""

    @property
    def ready(self) -> dict[str, Endpoint]:
        """The routable endpoints by replica id (a copy)."""
        return dict(self._ready)

    def __contains__(self, replica_id: object) -> bool:
        return replica_id in self._ready

    @property
    def seq(self) -> int:
        """The latest event's number (0 before any)."""
        return self._seq

    @property
    def watchers(self) -> int:
        """How many streams watch now."""
        return len(self._watchers)

    def since(self, seq: int) -> list[EndpointEvent]:
        """The kept events numbered after `seq` (all of them if older ones were dropped)."""
        return [e for e in self._history if e.seq > seq]

    def put(self, endpoint: Endpoint) -> None:
        """An endpoint is routable: ADDED when new, UPDATED when it changed, else nothing."""
        if self._own.get(endpoint.replica_id) == endpoint and endpoint.replica_id in self._ready:
            return
        was = self._own.get(endpoint.replica_id)
        if was is not None and was.model != endpoint.model:
            self._of_model.get(was.model, set()).discard(endpoint.replica_id)
        self._own[endpoint.replica_id] = endpoint
        self._of_model.setdefault(endpoint.model, set()).add(endpoint.replica_id)
        if endpoint.model in self._split or self.weigh(endpoint.model) is not None:
            self.reweigh(endpoint.model, first=endpoint.replica_id)
            return
        old = self._ready.get(endpoint.replica_id)
        if old != endpoint:
            self._ready[endpoint.replica_id] = endpoint
            self._publish(EventKind.ADDED if old is None else EventKind.UPDATED, endpoint)

    def remove(self, replica_id: str, reason: EndpointReason) -> None:
        """An endpoint must no longer be routed to: REMOVED with `reason` (before it stops);
        the model's other endpoints are weighed again while its weights are split."""
        own = self._own.pop(replica_id, None)
        if own is not None:
            ids = self._of_model.get(own.model, set())
            ids.discard(replica_id)
            if not ids:
                self._of_model.pop(own.model, None)
        old = self._ready.pop(replica_id, None)
        if old is not None:
            self._publish(EventKind.REMOVED, old, reason)
            if old.model in self._split or self.weigh(old.model) is not None:
                self.reweigh(old.model)

    def reweigh(self, model: str = "", *, first: str = "") -> None:
        """Publish the weights `weigh` gives each endpoint of `model` (every model's when ""):
        UPDATED for an endpoint whose weight changed, ADDED for one not published yet
        (`first`, the endpoint just put, goes first)."""
        models = [model] if model else sorted(self._of_model)
        for name in models:
            mine = {rid: self._own[rid] for rid in self._of_model.get(name, ())}
            split = self.weigh(name)
            if split is None:
                self._split.discard(name)
                weights: Mapping[str, int] = {}
            else:
                self._split.add(name)
                weights = split({rid: (e.revision, e.weight) for rid, e in mine.items()})
            order = sorted(mine, key=lambda rid: (rid != first, rid))
            for rid in order:
                own = mine[rid]
                weight = weights.get(rid, own.weight)
                want = own if weight == own.weight else replace(own, weight=weight)
                old = self._ready.get(rid)
                if old == want:
                    continue
                self._ready[rid] = want
                self._publish(EventKind.ADDED if old is None else EventKind.UPDATED, want)

    def _event(self, kind: EventKind, **fields: object) -> EndpointEvent:
        return EndpointEvent(kind, self._seq, self._wall(), self.epoch, **fields)  # type: ignore[arg-type]

    def _publish(
        self, kind: EventKind, endpoint: Endpoint, reason: EndpointReason | None = None
    ) -> None:
        self._seq += 1
        event = self._event(kind, endpoint=endpoint, reason=reason)
        self._history.append(event)
        for queue in list(self._watchers):
            if queue.qsize() >= WATCHER_QUEUE:
                # Cut it off: the None tells its stream to end; it watches again to resume.
                self._watchers.discard(queue)
                queue.put_nowait(None)
                self.cut += 1
                log.warning("watcher_dropped", reason="too slow", behind=queue.qsize())
                continue
            queue.put_nowait(event)

    def _missed(self, after_seq: int, epoch: str) -> tuple[list[EndpointEvent] | None, str]:
        """The events after `after_seq` of `epoch`, or None and why they cannot be sent."""
        if epoch != self.epoch:
            return None, (
                f"epoch {epoch!r} is not this fleet's ({self.epoch}): the fleet restarted or "
                "another instance answers"
            )
        if after_seq > self._seq:
            return None, f"sequence {after_seq} is past this fleet's last ({self._seq})"
        first = self._history[0].seq if self._history else self._seq + 1
        if after_seq < first - 1:
            return None, (
                f"sequence {after_seq} is older than the history kept (from {first}, the "
                f"last {self._history.maxlen} events)"
            )
        return self.since(after_seq), ""

    async def watch(
        self, model: str = "", *, after_seq: int = 0, epoch: str = ""
    ) -> AsyncIterator[EndpointEvent]:
        """The endpoints of `model` (every model's when ""): the events after `after_seq` of
        `epoch` when the history still holds them, else a snapshot of ADDED events; then
        SYNCED; then every change, and a HEARTBEAT after each `heartbeat_s` of silence.

        Raises:
            WatcherTooSlow: the watcher fell more than WATCHER_QUEUE events behind.
        """
        queue: asyncio.Queue[EndpointEvent | None] = asyncio.Queue()
        # Registered and read in one step (no await between): no change falls in a gap.
        missed, note = self._missed(after_seq, epoch) if after_seq > 0 else (None, "")
        if missed is not None:
            first = [e for e in missed if not model or e.model == model]
        else:
            first = [
                self._event(EventKind.ADDED, endpoint=e)
                for e in self._ready.values()
                if not model or e.model == model
            ]
        synced = self._event(EventKind.SYNCED, resumed=missed is not None, note=note)
        self._watchers.add(queue)
        loop = asyncio.get_running_loop()
        try:
            for event in first:
                yield event
            yield synced
            last_sent = loop.time()
            while True:
                wait = last_sent + self.heartbeat_s - loop.time()
                queued: EndpointEvent | None
                if not queue.empty():
                    queued = queue.get_nowait()
                elif wait <= 0:
                    queued = self._event(EventKind.HEARTBEAT)
                else:
                    try:
                        async with asyncio.timeout(wait):  # a timer, not a task per wait
                            queued = await queue.get()
                    except TimeoutError:
                        queued = self._event(EventKind.HEARTBEAT)
                if queued is None:
                    raise WatcherTooSlow("the watcher fell behind and was cut off: watch again")
                if model and queued.endpoint is not None and queued.model != model:
                    # Another model's change: this stream still needs its heartbeat on time.
                    if loop.time() - last_sent < self.heartbeat_s:
                        continue
                    # Numbered as the event it stands for: later ones may still be queued.
                    seq = queued.seq
                    queued = EndpointEvent(EventKind.HEARTBEAT, seq, self._wall(), self.epoch)
                yield queued
                last_sent = loop.time()
        finally:
            self._watchers.discard(queue)
