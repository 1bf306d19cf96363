"""PostgreSQL going away under a running fleet: health NOT_SERVING meanwhile, the fleet
reconnects on its own, and nothing it accepted is lost (a real fleet on a fresh database on the
test server, tests/support/postgres.py; the server itself is never restarted: its connections
to the test's database are ended, and the database refuses new ones for a while)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from fleet_svc.server import FleetOptions, FleetServer, start_fleet
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from tests.support.postgres import allow_connections, fresh_database, terminate

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def model(i: int) -> common_pb2.Model:
    """A small catalog model (no replicas: the test is about the store)."""
    return common_pb2.Model(
        name=f"m{i}",
        source=f"hf://org/m{i}",
        profiles=[common_pb2.Profile(name="p", engine="vllm", gpu_class="H100-80GB", replicas=0)],
    )


@asynccontextmanager
async def fleet_on(dsn: str) -> AsyncIterator[tuple[FleetServer, grpc.aio.Channel]]:
    """A fleet in this process on the database, and a channel to it."""
    fleet = await start_fleet(
        FleetOptions(
            listen="127.0.0.1:0",
            store_url=dsn,
            tick_s=0.05,
            planner="127.0.0.1:1",
            metrics="127.0.0.1:0",
        )
    )
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{fleet.port}")
    try:
        yield fleet, channel
    finally:
        await channel.close()
        await fleet.stop(grace_s=0.5)


async def health_of(channel: grpc.aio.Channel) -> int:
    """The fleet's overall health status."""
    answer = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=""), timeout=5
    )
    return int(answer.status)


async def store_up(fleet: FleetServer) -> float:
    """llmgw_fleet_store_up as the fleet's /metrics serves it (the LlmgwStoreUnavailable
    alert's series)."""
    assert fleet.metrics is not None
    async with httpx.AsyncClient() as client:
        answer = await client.get(f"http://127.0.0.1:{fleet.metrics.port}/metrics", timeout=5)
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            if sample.name == "llmgw_fleet_store_up":
                return float(sample.value)
    raise AssertionError("no llmgw_fleet_store_up on /metrics")


async def wait_health(channel: grpc.aio.Channel, status: int, within_s: float) -> float:
    """Seconds until health reads `status` (failing the test after `within_s`)."""
    started = time.monotonic()
    while await health_of(channel) != status:
        assert time.monotonic() - started < within_s, f"health did not turn {status}"
        await asyncio.sleep(0.1)
    return time.monotonic() - started


async def create(
    stub: fleet_pb2_grpc.FleetServiceAsyncStub, i: int
) -> fleet_pb2.CreateModelResponse | None:
    """CreateModel m{i} with request id req-{i}: the answer, None when it was not accepted."""
    try:
        answer: fleet_pb2.CreateModelResponse = await stub.CreateModel(
            fleet_pb2.CreateModelRequest(model=model(i), request_id=f"req-{i}"), timeout=10
        )
        return answer
    except grpc.aio.AioRpcError as err:
        if err.code() is grpc.StatusCode.ALREADY_EXISTS:
            # Accepted by an attempt whose answer was lost with its connection: the model is
            # there (checked below); the request id's answer was never stored.
            return fleet_pb2.CreateModelResponse()
        return None


async def test_an_outage_is_not_serving_and_the_fleet_comes_back_losing_nothing() -> None:
    """While the database refuses connections health is NOT_SERVING and changes are refused;
    once it accepts them again health is SERVING within seconds, the refused changes go through
    on retry, and every model accepted before, during or after is there exactly once."""
    with fresh_database() as (name, dsn):
        async with fleet_on(dsn) as (fleet, channel):
            stub: fleet_pb2_grpc.FleetServiceAsyncStub = fleet_pb2_grpc.FleetServiceStub(channel)
            accepted = {i: await create(stub, i) for i in range(10)}
            assert all(accepted.values())
            assert await health_of(channel) == SERVING
            assert await store_up(fleet) == 1
            try:
                allow_connections(name, False)
                terminate(name)
                took = await wait_health(channel, NOT_SERVING, within_s=10)
                assert await store_up(fleet) == 0
                refused = [i for i in range(10, 15) if await create(stub, i) is None]
                assert refused == list(range(10, 15)), "a change was accepted with no store"
            finally:
                allow_connections(name, True)
            back = await wait_health(channel, SERVING, within_s=15)
            assert await store_up(fleet) == 1
            for i in refused:
                answer = None
                deadline = time.monotonic() + 15
                while answer is None:
                    assert time.monotonic() < deadline, f"m{i} never went through"
                    answer = await create(stub, i)
                    await asyncio.sleep(0.1)
                accepted[i] = answer
            listed = await stub.ListModels(fleet_pb2.ListModelsRequest(), timeout=10)
            names = [m.model.name for m in listed.models]
            assert sorted(names) == sorted(f"m{i}" for i in range(15))
            assert {m.revision for m in listed.models} == {1}
            again = await create(stub, 3)
            assert again == accepted[3]
    # Generous bounds: the probe runs every second; a connect attempt may take a few.
    assert took < 10 and back < 15


async def test_connections_cut_under_load_lose_nothing_accepted() -> None:
    """Connections ended again and again while clients create models (as a server restart
    does): every model whose creation was answered is there, and the fleet is SERVING after."""
    with fresh_database() as (name, dsn):
        async with fleet_on(dsn) as (_fleet, channel):
            stub: fleet_pb2_grpc.FleetServiceAsyncStub = fleet_pb2_grpc.FleetServiceStub(channel)
            acknowledged: list[int] = []
            stop = asyncio.Event()

            async def writer() -> None:
                i = 0
                while not stop.is_set():
                    if await create(stub, i) is not None:
                        acknowledged.append(i)
                        i += 1
                    else:
                        await asyncio.sleep(0.05)

            task = asyncio.create_task(writer())
            for _ in range(5):
                await asyncio.sleep(0.3)
                terminate(name)
            await asyncio.sleep(0.3)
            stop.set()
            await task
            assert len(acknowledged) > 10
            await wait_health(channel, SERVING, within_s=15)
            listed = await stub.ListModels(fleet_pb2.ListModelsRequest(), timeout=10)
            names = {m.model.name for m in listed.models}
            assert {f"m{i}" for i in acknowledged} <= names
            assert len(names) == len(listed.models)
