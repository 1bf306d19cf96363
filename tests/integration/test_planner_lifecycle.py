"""The planner as an HPA's pods need it: each connection is closed after its maximum age, so
a client connects anew and the Service can send it to a new pod (the fleet's long streams get
no such age); and on stop it reports NOT_SERVING while still serving for its drain delay, so
a readiness probe sees it before calls are refused."""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fleet_svc import server as fleet_server
from llmgw.planner.v1 import planner_pb2, planner_pb2_grpc
from planner_svc.server import PlannerServer, start_planner


async def state_after(channel: grpc.aio.Channel, state: grpc.ChannelConnectivity) -> None:
    """Returns once the channel has left `state` (bounded by the test's timeout)."""
    while channel.get_state() == state:
        await channel.wait_for_state_change(state)


async def test_a_connection_is_closed_after_its_maximum_age() -> None:
    """A connection that reached its age gets GOAWAY: the channel leaves READY without the
    client doing anything, and its next call connects anew and is answered."""
    planner: PlannerServer = await start_planner("127.0.0.1:0", max_connection_age_s=0.5)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{planner.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            assert channel.get_state() == grpc.ChannelConnectivity.READY
            await asyncio.wait_for(state_after(channel, grpc.ChannelConnectivity.READY), 30)
            again = await health.Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert again.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await planner.stop(0.5)


def test_the_fleet_sets_no_connection_age() -> None:
    """The fleet's agents' streams and gateways' watches are meant to last: no age cuts them."""
    names = {name for name, _ in fleet_server.SERVER_OPTIONS}
    assert not names & {"grpc.max_connection_age_ms", "grpc.max_connection_age_grace_ms"}


async def test_stop_reports_not_serving_and_serves_through_its_drain_delay() -> None:
    """During the drain the health check answers NOT_SERVING and a planner call is still
    answered (here its refusal of an empty request); after it the server is gone."""
    planner: PlannerServer = await start_planner("127.0.0.1:0", max_connection_age_s=0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{planner.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        stub = planner_pb2_grpc.PlannerServiceStub(channel)
        stopping = asyncio.create_task(planner.stop(0.5, drain_s=5.0))
        while (await health.Check(health_pb2.HealthCheckRequest(), timeout=10)).status == (
            health_pb2.HealthCheckResponse.SERVING
        ):
            await asyncio.sleep(0.01)
        assert not stopping.done(), "the drain ended before NOT_SERVING was seen"
        try:
            await stub.SizeContext(planner_pb2.SizeContextRequest(), timeout=10)
            raise AssertionError("an empty SizeContext was answered OK")
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
        assert not stopping.done(), "the planner stopped before its drain delay"
        await stopping
        try:
            await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
            raise AssertionError("a stopped planner answered")
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err
