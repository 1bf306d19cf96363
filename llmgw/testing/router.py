"""A gateway's routing table from WatchReplicas alone, written as docs/gateway.md describes
the loop: upsert on ADDED/UPDATED by replica id, drop on REMOVED, replace the table at a fresh
snapshot's SYNCED, keep the last sequence (heartbeats' too) and resume from it after the
stream drops. Tests and benchmarks route with it; the Go gateway does the same."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import grpc

from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc

W = fleet_pb2.WatchReplicasResponse
RECONNECT_S = 0.1
"""The wait before watching again after the stream dropped."""


class Router:
    """Follows one model's endpoints (every model's with "") into `table`.

    Args:
        stub: the fleet's API.
        model: the model to route ("" for all).
        on_change: called after each event is applied (tests check invariants there).
    """

    def __init__(
        self,
        stub: fleet_pb2_grpc.FleetServiceAsyncStub,
        model: str = "",
        on_change: Callable[[Router, fleet_pb2.WatchReplicasResponse], None] | None = None,
    ) -> None:
        self.table: dict[str, fleet_pb2.Endpoint] = {}
        self.seq = 0
        self.epoch = ""
        self.synced = asyncio.Event()
        self.streams = 0
        """Streams opened (1 + reconnects)."""
        self.resumed = 0
        """Reconnects the fleet honoured by sending only what was missed."""
        self._stub = stub
        self._model = model
        self._on_change = on_change
        self._before_synced: list[fleet_pb2.WatchReplicasResponse] | None = None
        self._call: Any = None
        self._dropped = False
        self._task = asyncio.create_task(self._run())

    def apply(self, ev: fleet_pb2.WatchReplicasResponse) -> None:
        """One event of the stream into the table.

        Until a stream's SYNCED its events are held: at SYNCED they are applied in order when
        the fleet resumed (they are what was missed), or replace the table when it sent a
        snapshot. Routing goes on from the old table meanwhile.
        """
        if ev.seq:
            self.seq, self.epoch = ev.seq, ev.epoch
        if self._before_synced is not None:
            if ev.kind != W.KIND_SYNCED:
                self._before_synced.append(ev)
                return
            held, self._before_synced = self._before_synced, None
            if ev.resumed:
                self.resumed += 1
            else:
                self.table = {}
            for e in held:
                self._upsert(e)
            self.synced.set()
        else:
            self._upsert(ev)
        if self._on_change is not None:
            self._on_change(self, ev)

    def _upsert(self, ev: fleet_pb2.WatchReplicasResponse) -> None:
        if ev.kind in (W.KIND_ADDED, W.KIND_UPDATED):
            self.table[ev.endpoint.replica_id] = ev.endpoint
        elif ev.kind == W.KIND_REMOVED:
            self.table.pop(ev.endpoint.replica_id, None)

    async def _run(self) -> None:
        while True:
            self._before_synced = []
            request = fleet_pb2.WatchReplicasRequest(
                model=self._model, after_seq=self.seq, epoch=self.epoch
            )
            self._call = self._stub.WatchReplicas(request)
            self.streams += 1
            try:
                async for ev in self._call:
                    self.apply(ev)
            except grpc.aio.AioRpcError:
                pass
            except asyncio.CancelledError:
                if not self._dropped:
                    raise
            self._dropped = False
            await asyncio.sleep(RECONNECT_S)

    def drop(self) -> None:
        """Cut the current stream (as a proxy or a network would); the router resumes."""
        if self._call is not None:
            self._dropped = True  # the call's cancellation ends its stream, not the router
            self._call.cancel()

    async def stop(self) -> None:
        """Stop routing."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
