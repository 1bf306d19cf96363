"""One catalogue of stream cases — cancel, deadline, server shutdown, reconnect with a stale
version — run against each of the fleet's long-lived streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from fleet_svc.server import FleetServer
from llmgw.agent.v1 import agent_pb2, agent_pb2_grpc
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.eventually import assert_eventually
from tests.support.fleet import running_fleet

Opener = Callable[[grpc.aio.Channel, float | None], AsyncIterator[object]]


async def _hello(applied_version: int = 0) -> AsyncIterator[agent_pb2.ConnectRequest]:
    yield agent_pb2.ConnectRequest(
        hello=agent_pb2.Hello(
            node_name="node-s",
            applied_version=applied_version,
            cards=[common_pb2.Card(index=0, model="H100-80GB")],
        )
    )
    await asyncio.Event().wait()  # keep the agent's side open


def open_connect(channel: grpc.aio.Channel, timeout: float | None) -> AsyncIterator[object]:
    """An agent's Connect stream."""
    return agent_pb2_grpc.AgentServiceStub(channel).Connect(_hello(), timeout=timeout)  # type: ignore[return-value]


def open_watch(channel: grpc.aio.Channel, timeout: float | None) -> AsyncIterator[object]:
    """A gateway's WatchReplicas stream."""
    return fleet_pb2_grpc.FleetServiceStub(channel).WatchReplicas(  # type: ignore[return-value]
        fleet_pb2.WatchReplicasRequest(), timeout=timeout
    )


def stream_open(fleet: FleetServer, kind: str) -> bool:
    """Whether the fleet still holds the stream of that kind open."""
    if kind == "connect":
        return "node-s" in fleet.controller.state.links
    return fleet.controller.hub.watchers > 0


STREAMS = [
    pytest.param(open_connect, "connect", id="connect"),
    pytest.param(open_watch, "watch", id="watch"),
]


async def first_message(call: AsyncIterator[object]) -> object:
    """The stream's first message (Welcome, or the SYNCED marker)."""
    return await asyncio.wait_for(anext(aiter(call)), 5)


@pytest.mark.parametrize(("opener", "kind"), STREAMS)
async def test_client_cancel_releases_the_stream(tmp_path: Path, opener: Opener, kind: str) -> None:
    """A client that cancels its stream is forgotten by the fleet at once."""
    async with running_fleet(tmp_path) as (fleet, _stub):
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{fleet.port}")
        call = opener(channel, None)
        await first_message(call)
        await assert_eventually(lambda: stream_open(fleet, kind), what="stream registered")
        call.cancel()  # type: ignore[attr-defined]
        await assert_eventually(lambda: not stream_open(fleet, kind), what="stream released")
        await channel.close()


@pytest.mark.parametrize(("opener", "kind"), STREAMS)
async def test_deadline_ends_the_stream(tmp_path: Path, opener: Opener, kind: str) -> None:
    """A stream opened with a deadline ends DEADLINE_EXCEEDED, and the fleet releases it."""
    async with running_fleet(tmp_path) as (fleet, _stub):
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{fleet.port}")
        call = opener(channel, 0.5)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in call:
                pass
        assert caught.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        await assert_eventually(lambda: not stream_open(fleet, kind), what="stream released")
        await channel.close()


@pytest.mark.parametrize(("opener", "kind"), STREAMS)
async def test_server_shutdown_ends_the_stream(tmp_path: Path, opener: Opener, kind: str) -> None:
    """A fleet shutting down ends open streams promptly instead of leaving clients hanging."""
    async with running_fleet(tmp_path) as (fleet, _stub):
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{fleet.port}")
        call = opener(channel, None)
        await first_message(call)
        await assert_eventually(lambda: stream_open(fleet, kind), what="stream registered")

        async def drain() -> None:
            try:
                async for _ in call:
                    pass
            except grpc.aio.AioRpcError:
                pass

        reader = asyncio.create_task(drain())
        await fleet.stop(grace_s=1.0)
        await asyncio.wait_for(reader, 5)
        await channel.close()


async def test_reconnect_with_stale_version_gets_a_newer_full_set(tmp_path: Path) -> None:
    """An agent reconnecting with an old applied version is sent its full set at a newer one."""
    async with running_fleet(tmp_path) as (fleet, _stub):
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{fleet.port}")
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        versions = []
        for applied in (0, 1):
            call = stub.Connect(_hello(applied_version=applied))
            async for msg in call:
                if msg.WhichOneof("msg") == "desired":
                    versions.append(msg.desired.version)
                    break
            call.cancel()
            await assert_eventually(lambda: not stream_open(fleet, "connect"), what="released")
        assert versions[1] > versions[0] >= 1
        await channel.close()


async def test_first_message_must_be_hello(tmp_path: Path) -> None:
    """A stream that opens with anything but Hello is refused INVALID_ARGUMENT."""

    async def heartbeat_first() -> AsyncIterator[agent_pb2.ConnectRequest]:
        yield agent_pb2.ConnectRequest(heartbeat=agent_pb2.Heartbeat(seq=1))
        await asyncio.Event().wait()

    async with running_fleet(tmp_path) as (fleet, _stub):
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{fleet.port}")
        call = agent_pb2_grpc.AgentServiceStub(channel).Connect(heartbeat_first())
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in call:
                pass
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert reason_of(caught.value) == "NO_HELLO"
        await channel.close()


def reason_of(err: grpc.aio.AioRpcError) -> str:
    """The ErrorInfo reason a refusal carries ("" when it carries none)."""
    status = rpc_status.from_call(err)
    for detail in status.details if status is not None else ():
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return str(info.reason)
    return ""


async def test_streams_refuse_through_the_error_table(tmp_path: Path) -> None:
    """A stream's refusal carries the code, message and ErrorInfo a unary call's would:
    watching an unknown rollout is NOT_FOUND / ROLLOUT_NOT_FOUND."""
    async with running_fleet(tmp_path) as (_fleet, stub):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in stub.WatchRollout(fleet_pb2.WatchRolloutRequest(id="ro-nope")):
                pass
        assert caught.value.code() is grpc.StatusCode.NOT_FOUND
        assert caught.value.details() == "no rollout 'ro-nope'"
        assert reason_of(caught.value) == "ROLLOUT_NOT_FOUND"
        with pytest.raises(grpc.aio.AioRpcError) as unary:
            await stub.GetRollout(fleet_pb2.GetRolloutRequest(id="ro-nope"))
        assert (unary.value.code(), reason_of(unary.value)) == (
            caught.value.code(),
            reason_of(caught.value),
        )
