"""PostgreSQL stopped and started again under load, with two fleet processes on it: health is
NOT_SERVING while it is down, the fleets reconnect on their own, one still leads, and every
change acknowledged before, during or after is there exactly once (a private server, so the
machine's shared one is never restarted)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llmgw.clients.errors import Refused, Unreachable
from llmgw.clients.fleet import FleetClient
from llmgw.common.v1 import common_pb2
from llmgw.testing.eventually import assert_eventually
from tests.support.fleet_procs import FleetProc, fleet_processes, lease_of
from tests.support.private_postgres import private_postgres

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def model(i: int) -> common_pb2.Model:
    """A small catalog model (no replicas: the test is about the store)."""
    return common_pb2.Model(
        name=f"m{i}",
        source=f"hf://org/m{i}",
        profiles=[common_pb2.Profile(name="p", engine="vllm", gpu_class="H100-80GB", replicas=0)],
    )


def health_of(fleet: FleetProc) -> int:
    """The fleet's overall health (-1 when it does not answer)."""
    with grpc.insecure_channel(fleet.address) as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=3
            )
        except grpc.RpcError:
            return -1
    return int(answer.status)


class Writer:
    """Creates m0, m1 … through a client given every fleet, each under its own request id,
    trying each again until it is accepted; counts what was acknowledged."""

    def __init__(self, fleets: str) -> None:
        self.acked: list[int] = []
        self.refused_meanwhile = 0
        self._fleets = fleets
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with FleetClient(self._fleets, timeout_s=5, sleep=lambda _s: None) as client:
            i = 0
            while not self._stop.is_set():
                try:
                    client.create_model(model(i), request_id=f"req-{i}")
                except Unreachable:
                    self.refused_meanwhile += 1
                    time.sleep(0.1)
                    continue
                except Refused as exc:
                    # Accepted by an attempt whose answer was lost with its connection: the
                    # model is there (checked after); its request id's answer was not stored.
                    assert exc.reason == "MODEL_EXISTS", exc
                self.acked.append(i)
                i += 1
                time.sleep(0.02)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


async def test_a_restart_under_load_is_not_serving_meanwhile_and_loses_nothing(
    tmp_path: Path,
) -> None:
    """Stop the server for a few seconds while a client writes: both fleets turn NOT_SERVING,
    writes are refused (nothing accepted without the store), and after the start both are
    SERVING again on their own, writes go through, a fleet leads, and every acknowledged model
    is listed exactly once."""
    with private_postgres() as server, fleet_processes(server.dsn, tmp_path, 2) as fleets:
        writer = Writer(",".join(f.address for f in fleets))
        writer.start()
        try:
            await assert_eventually(lambda: len(writer.acked) >= 5, timeout_s=30)
            server.stop("fast")
            for fleet in fleets:
                await assert_eventually(
                    lambda f=fleet: health_of(f) == NOT_SERVING,  # type: ignore[misc]
                    timeout_s=15,
                    what=f"{fleet.name} NOT_SERVING",
                )
            during = len(writer.acked)
            # One call may go on for a while before it gives up: it looks for a leader for
            # FIND_LEADER_S and tries every address, each with its own deadline. So wait for
            # the refusal rather than give it a fixed window, and check meanwhile that nothing
            # was acknowledged while no store was there.
            await assert_eventually(
                lambda: writer.refused_meanwhile > 0,
                timeout_s=60,
                what="a write refused while the store is down",
            )
            await asyncio.sleep(1)
            assert len(writer.acked) == during, "a change was acknowledged with no store"
            server.start()
            for fleet in fleets:
                await assert_eventually(
                    lambda f=fleet: health_of(f) == SERVING,  # type: ignore[misc]
                    timeout_s=30,
                    what=f"{fleet.name} SERVING again",
                )
            await assert_eventually(
                lambda: len(writer.acked) >= during + 5, timeout_s=30, what="writes again"
            )
        finally:
            writer.stop()
        lease = lease_of(server.dsn)
        assert lease is not None and lease.live
        assert lease.address in {f.address for f in fleets}
        with FleetClient(",".join(f.address for f in fleets)) as client:
            listed = client.list_models().models
        names = [m.model.name for m in listed]
        assert len(names) == len(set(names))
        assert {f"m{i}" for i in writer.acked} <= set(names)
        assert {m.revision for m in listed} == {1}
