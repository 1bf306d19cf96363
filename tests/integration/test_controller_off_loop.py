"""The controller on PostgreSQL never holds the event loop while it waits on the store: with
the store's writes and rollout reads made slow (0.3 s each), a probe on the same loop is still
answered within 150 ms (half of one slowed call), while the tick does place a replica and
tell its node; a fleet taking over as leader loads its state, and its ticks read the wants,
on threads."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from fleet_svc.catalog import Catalog
from fleet_svc.controller import Controller
from fleet_svc.domain.catalog import Entry, ProfileWant
from fleet_svc.domain.nodes import NodeView
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.placement import Want
from fleet_svc.domain.replicas import ReplicaState, RunSpec
from fleet_svc.duties import Duties
from fleet_svc.leadership import Leadership
from fleet_svc.store.base import ReplicaRecord
from fleet_svc.store.postgres import PostgresStore
from llmgw.card import Card
from llmgw.clock import SystemClock
from llmgw.model import Model, Profile
from tests.support.postgres import fresh_database

SLOW_S = 0.3
PROBE_LIMIT_S = 0.15
"""Half of one slowed store call: a call made on the loop holds it SLOW_S at least, while a
loaded machine's scheduling alone was seen to wake the probe 58 ms late."""
SLOW_CALLS = frozenset({"write_replicas", "list_rollout_requests", "put_value"})
"""The tick's store calls made slow: the replica flush, the adoption's read, the desired
version."""
WANT = ProfileWant(
    "m", "gpu", revision=1, replicas=1, want=Want("L4", 1), spec=RunSpec("vllm", ("-x",))
)


class SlowStore:
    """A PostgreSQL store whose chosen calls first sleep `slow_s` on the calling thread, noting
    which thread made them (and which calls)."""

    def __init__(
        self, inner: PostgresStore, calls: frozenset[str] = SLOW_CALLS, slow_s: float = SLOW_S
    ) -> None:
        self._inner = inner
        self.slowed = calls
        self._slow_s = slow_s
        self.slow_threads: list[int] = []
        self.slow_calls: list[str] = []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in self.slowed:
            return attr

        def slowly(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.slow_threads.append(threading.get_ident())
                self.slow_calls.append(name)
            time.sleep(self._slow_s)
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


TAKEOVER_CALLS = frozenset(
    {"list_replicas", "list_rollouts", "get_value", "list_models", "get_model", "put_model"}
)
"""The store calls of taking over: the state, the desired version, the wants, the settings
file's models read and written."""
DECLARED = Entry(
    Model(
        name="m",
        source="hf://org/m",
        profiles=(Profile(name="gpu", engine="vllm", gpu_class="L4", gpus_per_node=1),),
    )
)


async def test_taking_over_loads_the_state_off_the_loop() -> None:
    """A fleet elected leader on PostgreSQL reads the state its predecessor left, the wants and
    the settings file's models, and writes those, on threads, as its ticks read the wants: the
    loop's thread makes none of those store calls, and the state it then holds is the stored
    one."""
    with fresh_database() as (_name, dsn), PostgresStore(dsn) as inner:
        inner.write_replicas(
            [
                ReplicaRecord(
                    "r-1", "m", "gpu", 1, node="n1", phase="READY", address="10.0.0.1:8000"
                )
            ],
            [],
        )
        store = SlowStore(inner, calls=frozenset(), slow_s=0.05)
        catalog = Catalog(store, time.time)
        controller = Controller(
            store, catalog.wants, clock=SystemClock(), model_at=catalog.model_at
        )
        assert set(controller.state.replicas) == {"r-1"}  # read as it starts, before it serves
        store.slowed = TAKEOVER_CALLS  # from here on, as the fleet serves
        controller.state.replicas.clear()
        leadership = Leadership(store, "127.0.0.1:1")
        duties = Duties(
            controller, catalog, leadership, declared=[DECLARED], settings_path="/etc/f.yaml"
        )
        try:
            await duties.start()
            assert leadership.is_leader
            assert set(controller.state.replicas) == {"r-1"}
            written = inner.get_model("m")
            assert written is not None and written.declared_in == "/etc/f.yaml"
            # A tick after a catalog change reads the wants again: on its thread too.
            listed = store.slow_calls.count("list_models")
            catalog.forget_wants()
            controller.wake()
            deadline = time.monotonic() + 10.0
            while store.slow_calls.count("list_models") == listed:
                assert time.monotonic() < deadline, "no tick read the wants again"
                await asyncio.sleep(0.02)
        finally:
            await duties.stop()
            controller.calls.close()
        assert {"list_replicas", "list_rollouts", "get_value", "put_model"} <= set(store.slow_calls)
        assert threading.get_ident() not in store.slow_threads
