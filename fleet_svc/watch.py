"""The endpoint hub: which replicas are routable, told to every WatchReplicas stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

WATCHER_QUEUE = 10_000
"""Events a watcher may fall behind by before it is cut off (it reconnects for a snapshot)."""


@dataclass(frozen=True)
class EndpointEvent:
    """An endpoint that became routable (`added`) or must no longer be routed to."""

    added: bool
    replica_id: str
    model: str
    profile: str
    address: str
    revision: int
    node: str
    phase: str


SYNCED = EndpointEvent(False, "", "", "", "", 0, "", "")
"""Sent after the snapshot: every ready endpoint has been told once."""


class WatcherTooSlow(Exception):
    """A watcher fell too far behind and was cut off."""


class EndpointHub:
    """Keeps the ready endpoints and fans their changes out to watchers."""

    def __init__(self) -> None:
        self._ready: dict[str, EndpointEvent] = {}
        self._watchers: set[asyncio.Queue[EndpointEvent | None]] = set()

    @property
    def ready(self) -> dict[str, EndpointEvent]:
        """The routable endpoints by replica id."""
        return dict(self._ready)

    def add(self, event: EndpointEvent) -> None:
        """An endpoint became ready: tell every watcher."""
        if self._ready.get(event.replica_id) == event:
            return
        self._ready[event.replica_id] = event
        self._publish(event)

    def remove(self, replica_id: str) -> None:
        """An endpoint must no longer be routed to: tell every watcher (before it stops)."""
        old = self._ready.pop(replica_id, None)
        if old is not None:
            self._publish(
                EndpointEvent(
                    False,
                    old.replica_id,
                    old.model,
                    old.profile,
                    old.address,
                    old.revision,
                    old.node,
                    "REMOVED",
                )
            )

    def _publish(self, event: EndpointEvent) -> None:
        for queue in list(self._watchers):
            if queue.qsize() >= WATCHER_QUEUE:
                # Cut it off: the None tells its stream to end; it watches again for a snapshot.
                self._watchers.discard(queue)
                queue.put_nowait(None)
                log.warning("watcher_dropped", reason="too slow", behind=queue.qsize())
                continue
            queue.put_nowait(event)

    async def watch(self, model: str = "") -> AsyncIterator[EndpointEvent]:
        """The ready endpoints of `model` (all when ""), SYNCED, then every change.

        Raises:
            WatcherTooSlow: the watcher fell more than WATCHER_QUEUE events behind.
        """
        queue: asyncio.Queue[EndpointEvent | None] = asyncio.Queue()
        snapshot = [e for e in self._ready.values() if not model or e.model == model]
        self._watchers.add(queue)
        try:
            for event in snapshot:
                yield event
            yield SYNCED
            while True:
                queued = await queue.get()
                if queued is None:
                    raise WatcherTooSlow("the watcher fell behind and was cut off: watch again")
                if not model or queued.model == model:
                    yield queued
        finally:
            self._watchers.discard(queue)

    @property
    def watchers(self) -> int:
        """How many streams watch now."""
        return len(self._watchers)
