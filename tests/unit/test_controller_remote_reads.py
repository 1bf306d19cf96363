"""The leader's reads of the node reports other fleets wrote (fleet_svc/controller/core.py,
REMOTE_READ_S): ticks woken again and again read the store at most once a spacing, and a read
a tick put off is made without anything else waking the loop."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from fleet_svc.controller import Controller
from fleet_svc.controller.core import REMOTE_READ_S
from fleet_svc.domain.nodes import Liveness, NodeView
from fleet_svc.nodelink.remote import RemoteNodes
from fleet_svc.nodelink.reports import report_doc
from fleet_svc.store.base import NodeReport
from fleet_svc.store.sqlite import SQLiteStore
from llmgw.card import Card
from llmgw.clock import SystemClock

LIVENESS = Liveness(interval_s=1.0, grace_heartbeats=3, lost_after_s=30.0)


class CountingStore(SQLiteStore):
    """A SQLite store counting its reads of node reports."""

    reads = 0

    def list_node_reports(self, after_seq: int = 0) -> list[NodeReport]:
        self.reads += 1
        return super().list_node_reports(after_seq)


def _encode(node: str, version: int, rs: object, stop: object) -> bytes:
    return f"{node}:{version}".encode()


async def test_frequent_ticks_read_other_fleets_reports_once_a_spacing_and_none_is_left(
    tmp_path: Path,
) -> None:
    """A leader woken every millisecond for 0.2 s reads the other fleets' rows no more than
    once each REMOTE_READ_S (not once a tick), and a row written just before a tick that puts
    its read off is heard within a few spacings, though the tick interval is long and nothing
    else wakes the loop."""
    store = CountingStore(tmp_path / "fleet.db")
    controller = Controller(store, lambda: [], clock=SystemClock(), liveness=LIVENESS, tick_s=30)
    controller.remote = RemoteNodes(store, "f1", _encode, LIVENESS)
    task = asyncio.create_task(controller.run())
    try:
        started = time.monotonic()
        ticks = 0
        while time.monotonic() - started < 0.2:
            controller.wake()
            ticks += 1
            await asyncio.sleep(0.001)
        spent = time.monotonic() - started
        assert ticks > 50
        assert 1 <= store.reads <= spent / REMOTE_READ_S + 2, (store.reads, ticks)
        view = NodeView(name="n9", cards=(Card(0, model="H100"),))
        store.put_node_reports(
            [NodeReport("n9", "f2", "s1", True, time.time(), report_doc(view, (), 0, ()))]
        )
        controller.wake()  # within a spacing of the last read: the read is put off
        deadline = time.monotonic() + 1.0
        while "n9" not in controller.state.nodes:
            assert time.monotonic() < deadline, "the put-off read was never made"
            await asyncio.sleep(0.005)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        store.close()
