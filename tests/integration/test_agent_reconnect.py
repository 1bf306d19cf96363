"""How the agent's stream ends and comes back: one catalogue of stream cases."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import grpc
import pytest
from structlog.testing import capture_logs

from fleet_svc.agent import claims
from llmgw.agent.v1 import agent_pb2
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.fake_fleet import running_fake_fleet, spec
from tests.support.agents import running_agent

HEALTHY = agent_pb2.PROCESS_PHASE_HEALTHY


@pytest.mark.parametrize(
    "ending",
    [
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.INTERNAL,
        None,
    ],
    ids=["unavailable", "cancelled", "deadline", "internal", "clean-end"],
)
async def test_any_stream_end_reconnects_with_full_state(
    ending: grpc.StatusCode | None, tmp_path: Path
) -> None:
    """However the fleet ends the stream (an error status or a clean end), the agent says
    Hello again with its running replica and the version it applied."""
    async with running_fake_fleet() as (fleet, port), running_agent(port, tmp_path):
        await assert_eventually(lambda: fleet.streams)
        version = fleet.desire(spec("r1"))
        up = await assert_eventually(
            lambda: next((u for u in fleet.updates_of("r1") if u.phase == HEALTHY), None)
        )
        fleet.drop(ending)
        await assert_eventually(lambda: len(fleet.hellos) == 2)
        hello = fleet.hellos[1]
        assert hello.applied_version == version
        assert [(r.replica_id, r.pid) for r in hello.replicas] == [("r1", up.pid)]


async def test_restarted_fleet_gets_hello_and_may_send_an_older_version(tmp_path: Path) -> None:
    """When the fleet goes away and comes back on its address the agent reconnects; a desired
    set of a lower version than the last is still the fleet's word: applied and acknowledged."""
    first = AsyncExitStack()
    fleet, port = await first.enter_async_context(running_fake_fleet())
    try:
        async with running_agent(port, tmp_path) as agent:
            await assert_eventually(lambda: fleet.streams)
            fleet.version = 10
            fleet.desire(spec("r1"))
            up = await assert_eventually(
                lambda: next((u for u in fleet.updates_of("r1") if u.phase == HEALTHY), None)
            )
            await first.aclose()  # the fleet goes away
            async with running_fake_fleet(port=port) as (again, _):
                await assert_eventually(lambda: again.hellos, timeout_s=10)
                assert [r.pid for r in again.hellos[0].replicas] == [up.pid]
                assert again.hellos[0].applied_version == 11
                version = again.desire()  # version 1: the restarted fleet counts afresh
                ack = await assert_eventually(lambda: again.ack(version))
                assert ack.version == 1
                await assert_eventually(lambda: not agent.replicas.observed())
                assert not claims.process_alive(up.pid)
    finally:
        await first.aclose()


async def test_silent_fleet_is_left_and_reconnected(tmp_path: Path) -> None:
    """A fleet that sent heartbeats and then falls silent past the grace is taken for gone:
    the agent logs it and connects again."""
    async with (
        running_fake_fleet(heartbeat_interval_s=1, grace_heartbeats=1) as (fleet, port),
        running_agent(port, tmp_path),
    ):
        await assert_eventually(lambda: fleet.heartbeats)
        with capture_logs() as logs:
            fleet.send_heartbeats = False
            await assert_eventually(lambda: len(fleet.hellos) == 2, timeout_s=6)
        assert any(e["event"] == "stream_silent" for e in logs)


async def test_fleet_without_welcome_still_gets_acks(tmp_path: Path) -> None:
    """A fleet that never welcomes (nor sends heartbeats) keeps the stream: desired sets are
    applied and acknowledged, and the agent does not give up on it."""
    async with (
        running_fake_fleet(welcome=False, send_heartbeats=False) as (fleet, port),
        running_agent(port, tmp_path) as agent,
    ):
        await assert_eventually(lambda: fleet.streams)
        version = fleet.desire()
        await assert_eventually(lambda: fleet.ack(version))
        assert len(fleet.hellos) == 1 and not agent.client.connected.is_set()


async def test_rejections_are_logged_as_events(tmp_path: Path) -> None:
    """A refused replica is one structured event with its reason, besides the Ack."""
    async with running_fake_fleet() as (fleet, port), running_agent(port, tmp_path):
        await assert_eventually(lambda: fleet.streams)
        with capture_logs() as logs:
            version = fleet.desire(spec("r1", engine="nope"))
            await assert_eventually(lambda: fleet.ack(version))
        [event] = [e for e in logs if e["event"] == "replica_rejected"]
        assert event["reason"] == "ENGINE_NOT_ALLOWED" and event["replica_id"] == "r1"
