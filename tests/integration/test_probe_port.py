"""The plaintext probe port under abuse: Check only, small requests, bounded streams and
connections, and a flood of each process's probe port (planner, fleet, agent) that leaves its
memory bounded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from llmgw.probes import LIVENESS, MAX_CONNECTIONS, MAX_REQUEST_BYTES, start_probe_server
from llmgw.testing.eventually import assert_eventually

ROOT = Path(__file__).resolve().parents[2]

FLOOD_STREAMS = 48
"""Watch streams (and Check calls) the flood opens, each on its own connection."""
FLOOD_NAME_BYTES = 2 << 20
"""The service name each carries: 2 MiB, past any probe's need and under gRPC's 4 MiB."""
RSS_GROWTH_BOUND_BYTES = 64 << 20
"""What the flood may add to a process's resident memory (issue 18's benchmark bound). Before
the port was bounded, 40 streams of 1 MB names grew a fleet by ~190 MB."""


def _identity(b: bytes) -> bytes:
    return bytes(b)


def _request(name_bytes: int) -> bytes:
    return bytes(health_pb2.HealthCheckRequest(service="x" * name_bytes).SerializeToString())


async def _check(port: int, service: str) -> tuple[grpc.StatusCode, int]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            answer = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        except grpc.aio.AioRpcError as err:
            return err.code(), -1
        return grpc.StatusCode.OK, answer.status


async def test_probe_port_serves_check_and_nothing_else() -> None:
    """Check answers; Watch, reflection and every other method are UNIMPLEMENTED, and a request
    past 1 KiB is refused (RESOURCE_EXHAUSTED) before any servicer sees it."""
    servicer = health.aio.HealthServicer()
    probes = await start_probe_server("127.0.0.1:0", servicer)
    try:
        assert await _check(probes.port, LIVENESS) == (
            grpc.StatusCode.OK,
            health_pb2.HealthCheckResponse.SERVING,
        )
        async with grpc.aio.insecure_channel(f"127.0.0.1:{probes.port}") as channel:
            watch = channel.unary_stream(
                "/grpc.health.v1.Health/Watch",
                request_serializer=_identity,
                response_deserializer=_identity,
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in watch(_request(8), timeout=10):
                    pass
            assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED
            reflect = channel.stream_stream(
                "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                request_serializer=_identity,
                response_deserializer=_identity,
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                call = reflect(timeout=10)
                await call.write(b"")
                await call.read()
            assert err.value.code() is grpc.StatusCode.UNIMPLEMENTED
            check = channel.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=_identity,
                response_deserializer=_identity,
            )
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await check(_request(MAX_REQUEST_BYTES + 1), timeout=10)
            assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        await probes.stop(0)


async def test_probe_port_off_loopback_warns() -> None:
    """A probe port bound to every address logs `probe_port_off_loopback` as a warning; one on
    loopback does not."""
    with structlog.testing.capture_logs() as logs:
        for listen in ("0.0.0.0:0", "127.0.0.1:0"):
            probes = await start_probe_server(listen, health.aio.HealthServicer())
            await probes.stop(0)
    warned = [e for e in logs if e["event"] == "probe_port_off_loopback"]
    assert [(e["log_level"], e["listen"]) for e in warned] == [("warning", "0.0.0.0:0")]


async def test_probe_port_caps_connections() -> None:
    """Past the connection cap a new connection gets no answer, and once the flood's
    connections close the port answers again."""
    probes = await start_probe_server("127.0.0.1:0", health.aio.HealthServicer())
    channels = [
        grpc.aio.insecure_channel(
            f"127.0.0.1:{probes.port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        for _ in range(MAX_CONNECTIONS + 8)
    ]
    try:
        outcomes = []
        for channel in channels:  # one at a time: each holds its connection open
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                await stub.Check(health_pb2.HealthCheckRequest(service=LIVENESS), timeout=3)
                outcomes.append(grpc.StatusCode.OK)
            except grpc.aio.AioRpcError as err:
                outcomes.append(err.code())
        assert outcomes.count(grpc.StatusCode.OK) <= MAX_CONNECTIONS, outcomes
        assert outcomes[0] is grpc.StatusCode.OK
        assert grpc.StatusCode.OK not in outcomes[MAX_CONNECTIONS:], outcomes
    finally:
        for channel in channels:
            await channel.close()
    # The server learns of each close from its socket, a moment after the client's: the port
    # answers again once it has (a check at once lost that race in a full run).
    serving = (grpc.StatusCode.OK, health_pb2.HealthCheckResponse.SERVING)

    async def answers_again() -> bool:
        return await _check(probes.port, LIVENESS) == serving

    try:
        await assert_eventually(answers_again, what="the port answering again", timeout_s=15)
    finally:
        await probes.stop(0)


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@contextlib.contextmanager
def _process(args: list[str], log: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A service process with --probe-listen on a free port; yields it and the probe port its
    log names."""
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", *args, "--probe-listen", "127.0.0.1:0", "--log-format", "json"],
            stdout=subprocess.DEVNULL,
            stderr=sink,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
        )
    try:
        port = 0
        for _ in range(600):
            for line in log.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    event = json.loads(line)
                    if event.get("event") == "probe_port_listening":
                        port = int(event["port"])
            if port or proc.poll() is not None:
                break
            subprocess.run(["sleep", "0.1"], check=True)
        assert port, log.read_text()[-2000:]
        yield proc, port
    finally:
        proc.kill()
        proc.wait(timeout=10)


@contextlib.asynccontextmanager
async def _flood(port: int) -> AsyncIterator[None]:
    """Watch streams and Checks with 2 MiB names, each on its own connection, held open
    while the body runs (the process's memory is read there)."""
    channels = [
        grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
        )
        for _ in range(FLOOD_STREAMS)
    ]
    request = _request(FLOOD_NAME_BYTES)
    calls = []
    for channel in channels:
        watch = channel.unary_stream(
            "/grpc.health.v1.Health/Watch",
            request_serializer=_identity,
            response_deserializer=_identity,
        )
        calls.append(watch(request, timeout=30))

    async def first(call: grpc.aio.UnaryStreamCall) -> None:  # type: ignore[type-arg]
        with contextlib.suppress(grpc.aio.AioRpcError, StopAsyncIteration):
            await call.read()

    async def check(channel: grpc.aio.Channel) -> None:
        method = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=_identity,
            response_deserializer=_identity,
        )
        with contextlib.suppress(grpc.aio.AioRpcError):
            await method(request, timeout=30)

    try:
        await asyncio.wait_for(
            asyncio.gather(*(first(c) for c in calls), *(check(ch) for ch in channels)), 120
        )
        yield
    finally:
        for call in calls:
            call.cancel()
        for channel in channels:
            await channel.close()


@pytest.mark.parametrize(
    "service",
    [
        ["planner_svc", "--listen", "127.0.0.1:0"],
        ["fleet_svc", "--listen", "127.0.0.1:0", "--store", "{tmp}/fleet.db"],
        [
            "fleet_svc.agent",
            "--fleet",
            "127.0.0.1:1",
            "--node",
            "flood",
            "--gpus",
            "1xL4-24GB",
            "--state-dir",
            "{tmp}/agent",
        ],
    ],
    ids=["planner", "fleet", "agent"],
)
async def test_probe_flood_leaves_memory_bounded(tmp_path: Path, service: list[str]) -> None:
    """48 Watch streams and 48 Checks with 2 MiB service names, each on a connection of its
    own, grow the process's resident memory by less than 64 MiB, and the port still answers a
    probe afterwards."""
    args = [a.replace("{tmp}", str(tmp_path)) for a in service]
    with _process(args, tmp_path / "service.log") as (proc, port):
        assert await _check(port, LIVENESS) == (
            grpc.StatusCode.OK,
            health_pb2.HealthCheckResponse.SERVING,
        )
        before = _rss_bytes(proc.pid)
        async with _flood(port):
            during = _rss_bytes(proc.pid)
        assert during - before < RSS_GROWTH_BOUND_BYTES, (before, during)
        serving = (grpc.StatusCode.OK, health_pb2.HealthCheckResponse.SERVING)

        async def answers_again() -> bool:
            # As after the connection cap: the flood's closes reach the server a moment later.
            return await _check(port, LIVENESS) == serving

        await assert_eventually(answers_again, what="the port answering again", timeout_s=15)
