"""The controller's loop while its store fails: one log line when the problem starts (no
traceback each tick), one when it ends, and the changes it held written then."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Sequence
from pathlib import Path

from structlog.testing import capture_logs

from fleet_svc.controller import Controller
from fleet_svc.domain.nodes import NodeView
from fleet_svc.store.base import NotLeader, ReplicaRecord, StoreUnavailable
from fleet_svc.store.sqlite import SQLiteStore
from llmgw.card import Card
from llmgw.clock import SystemClock
from llmgw.testing.eventually import assert_eventually
from tests.unit.test_controller import LIVENESS, WANT, Link


class FlakyStore(SQLiteStore):
    """A real SQLite store whose replica writes fail while `failure` is set (as a PostgreSQL
    that went away fails them)."""

    failure: Exception | None = None

    def write_replicas(self, puts: Sequence[ReplicaRecord], deletes: Sequence[str]) -> None:
        if self.failure is not None:
            raise self.failure
        super().write_replicas(puts, deletes)


def controller_on(store: FlakyStore) -> Controller:
    """A controller ticking every 10 ms wanting one replica, an agent with a card connected."""
    counter = itertools.count(1)
    controller = Controller(
        store,
        lambda: [WANT],
        clock=SystemClock(),
        liveness=LIVENESS,
        tick_s=0.01,
        new_id=lambda: f"r{next(counter)}",
    )
    view = NodeView(name="n1", cards=(Card(0, model="L4"),), memory_bytes=1 << 34)
    controller.agent_connected(view, [], Link())
    return controller


async def test_a_store_down_is_logged_once_not_every_tick(tmp_path: Path) -> None:
    """Dozens of ticks failing on an unreachable store log one tick_failed naming the store and
    the problem, with no traceback; once it answers, one tick_recovered and the replica the
    controller held is stored."""
    store = FlakyStore(tmp_path / "fleet.db")
    store.failure = StoreUnavailable("postgresql://db", "connection refused")
    controller = controller_on(store)
    with capture_logs() as logs:
        task = asyncio.create_task(controller.run())
        try:
            await asyncio.sleep(0.5)
            failed = [e for e in logs if e["event"] == "tick_failed"]
            assert len(failed) == 1, failed
            assert failed[0]["problem"] == "connection refused"
            assert "exc_info" not in failed[0] and failed[0]["store"] == "postgresql://db"
            store.failure = None
            await assert_eventually(lambda: store.list_replicas(), what="the replica stored")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert [e["event"] for e in logs].count("tick_recovered") == 1


async def test_a_write_meeting_the_fence_tells_the_leadership(tmp_path: Path) -> None:
    """A tick whose write is refused with NotLeader calls on_fenced with it (the fleet then
    stops leading) and logs tick_fenced, not a traceback."""
    store = FlakyStore(tmp_path / "fleet.db")
    refused = NotLeader("postgresql://db", 1, leader_epoch=2, leader="b", leader_address="b:1")
    store.failure = refused
    controller = controller_on(store)
    told: list[NotLeader] = []
    controller.on_fenced = told.append
    with capture_logs() as logs:
        task = asyncio.create_task(controller.run())
        try:
            await assert_eventually(lambda: told, what="on_fenced called")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert told[0] is refused
    assert "tick_fenced" in [e["event"] for e in logs]
    assert not any("exc_info" in e for e in logs)
