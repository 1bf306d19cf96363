"""The controller's tick on PostgreSQL never holds the event loop while it waits on the store:
with the store's writes and rollout reads made slow (0.3 s each), a probe on the same loop
is still answered within 50 ms, while the tick does place a replica and tell its node."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from fleet_svc.controller import Controller
from fleet_svc.domain.catalog import ProfileWant
from fleet_svc.domain.nodes import Card, NodeView
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.placement import Want
from fleet_svc.domain.replicas import ReplicaSpec, ReplicaState
from fleet_svc.store.postgres import PostgresStore
from llmgw.clock import SystemClock
from tests.support.postgres import fresh_database

SLOW_S = 0.3
PROBE_LIMIT_S = 0.05
SLOW_CALLS = frozenset({"write_replicas", "list_rollout_requests", "put_value"})
"""The tick's store calls made slow: the replica flush, the adoption's read, the desired
version."""
WANT = ProfileWant(
    "m", "gpu", revision=1, replicas=1, want=Want("L4", 1), spec=ReplicaSpec("vllm", ("-x",))
)


class SlowStore:
    """A PostgreSQL store whose chosen calls first sleep SLOW_S on the calling thread, noting
    which thread made them."""

    def __init__(self, inner: PostgresStore) -> None:
        self._inner = inner
        self.slow_threads: list[int] = []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in SLOW_CALLS:
            return attr

        def slowly(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.slow_threads.append(threading.get_ident())
            time.sleep(SLOW_S)
            return attr(*args, **kwargs)

        return slowly


class Link:
    """A fake agent stream: records the desired sets sent to it."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []

    def send_desired(
        self, version: int, replicas: Sequence[ReplicaState], stop_traces: Mapping[str, str]
    ) -> None:
        self.sent.append([r.id for r in replicas])

    def close(self, reason: str) -> None:
        """Nothing to end."""


async def _probe(lags: list[float], stop: asyncio.Event) -> None:
    """How late a 10 ms sleep on the loop wakes, again and again (a health check's wait)."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        began = loop.time()
        await asyncio.sleep(0.01)
        lags.append(loop.time() - began - 0.01)


async def test_a_tick_waiting_on_postgres_leaves_the_loop_free() -> None:
    with fresh_database() as (_name, dsn), PostgresStore(dsn) as inner:
        store = SlowStore(inner)
        controller = Controller(store, lambda: [WANT], clock=SystemClock())
        link = Link()
        view = NodeView(name="n1", cards=(Card(0, model="L4"),), memory_bytes=1 << 34)
        controller.agent_connected(view, [], link)
        lags: list[float] = []
        stop = asyncio.Event()
        probe = asyncio.create_task(_probe(lags, stop))
        running = asyncio.create_task(controller.run())
        try:
            deadline = time.monotonic() + 10.0
            while not link.sent and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        finally:
            stop.set()
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
            await probe
            controller.calls.close()
        loop_thread = threading.get_ident()
        assert link.sent, "the tick never told the node its desired set"
        (r,) = controller.state.replicas.values()
        assert r.phase is ReplicaPhase.STARTING
        assert [rec.id for rec in inner.list_replicas()] == [r.id]
        assert len(store.slow_threads) >= 3  # adopted, flushed, version stored: each slow
        assert max(lags) < PROBE_LIMIT_S, f"the loop was held {max(lags) * 1000:.0f} ms"
        assert loop_thread not in store.slow_threads
