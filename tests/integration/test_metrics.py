"""Prometheus metrics: scraped over HTTP from a real planner, fleet and agent process, the
series move when a rollout runs; the probe port answers health alone; the endpoint refuses
what is not a scrape."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from llmgw.agent.v1 import agent_pb2
from llmgw.build import build_info
from llmgw.demo.tiny_gguf import write_tiny_gguf
from llmgw.fleet.v1 import fleet_pb2
from llmgw.metrics import MAX_CONNECTIONS
from llmgw.planner.v1 import planner_pb2
from llmgw.probes import LIVENESS
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.fake_fleet import running_fake_fleet, spec
from llmgw.testing.scripted_agent import ScriptedAgent
from planner_svc.sources.policy import SourcePolicy
from planner_svc.sources.resolver import ShapeResolver
from tests.integration.test_rollouts import llamacpp_model, wait_rollout
from tests.support.fleet import running_fleet
from tests.support.planner import running_planner

ROOT = Path(__file__).resolve().parents[2]
HEALTHY = agent_pb2.PROCESS_PHASE_HEALTHY
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(port: int) -> Samples:
    """GET /metrics: every sample by name and labels."""
    async with httpx.AsyncClient() as client:
        answer = await client.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=")
    out: Samples = {}
    for family in text_string_to_metric_families(answer.text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


async def closed_unanswered(reader: asyncio.StreamReader) -> bool:
    """Whether the server closed the connection without a byte of answer (a close with the
    request unread may reach the client as a reset)."""
    try:
        return await asyncio.wait_for(reader.read(), 10) == b""
    except ConnectionResetError:
        return True


async def _scrapes(port: int) -> bool:
    """Whether a scrape answers now."""
    try:
        return bool(await scrape(port))
    except httpx.HTTPError:
        return False


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value (0 when the series is absent)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def rpc(samples: Samples, method: str, code: str = "OK", service: str = "") -> float:
    """How many `method` RPCs ended with `code`."""
    return sum(
        v
        for (name, labels), v in samples.items()
        if name == "grpc_server_handled_total"
        and ("grpc_method", method) in labels
        and ("grpc_code", code) in labels
        and (not service or ("grpc_service", service) in labels)
    )


async def test_fleet_and_planner_series_move_when_a_rollout_runs(tmp_path: Path) -> None:
    """A context change rolled out on two scripted nodes shows on both /metrics endpoints:
    the RPCs by method and code with their latencies, the rollout by outcome with its
    duration, the replicas by phase, the connected agents and their heartbeat lag, and the
    fleet's leadership; a refusal is counted under its own code."""
    async with (
        running_planner(metrics="127.0.0.1:0") as (planner, _p, _c),
        running_fleet(
            tmp_path,
            planner=f"127.0.0.1:{planner.port}",
            start_timeout_s=20.0,
            metrics="127.0.0.1:0",
        ) as (fleet, stub),
    ):
        assert fleet.metrics is not None and planner.metrics is not None
        fleet_now = await scrape(fleet.metrics.port)
        # The series the alerts in deploy/monitoring are written on.
        assert value(fleet_now, "llmgw_fleet_store_up") == 1
        assert value(fleet_now, "llmgw_fleet_rollout_oldest_running_seconds") == 0
        assert ("llmgw_fleet_watchers_cut_total", frozenset()) in fleet_now
        assert ("llmgw_fleet_watchers", frozenset()) in fleet_now
        agents = [ScriptedAgent(f"127.0.0.1:{fleet.port}", f"node-{i}", gpus=2) for i in range(2)]
        for a in agents:
            a.start()
        try:
            await stub.CreateModel(fleet_pb2.CreateModelRequest(model=llamacpp_model(2)))

            async def two_ready() -> Samples | None:
                now = await scrape(fleet.metrics.port)  # type: ignore[union-attr]
                return now if value(now, "llmgw_fleet_replicas", phase="READY") == 2 else None

            before = await assert_eventually(two_ready, what="2 READY on /metrics")
            assert value(before, "llmgw_fleet_rollouts_total", outcome="SUCCEEDED") == 0
            assert value(before, "llmgw_fleet_agents_connected") == 2
            assert value(before, "llmgw_fleet_nodes", phase="READY") == 2
            for node in ("node-0", "node-1"):
                lag = before[
                    ("llmgw_fleet_agent_heartbeat_lag_seconds", frozenset({("node", node)}))
                ]
                assert 0 <= lag < 30
            assert value(before, "llmgw_fleet_leader") == 1
            assert value(before, "llmgw_fleet_leader_epoch") == 0
            assert rpc(before, "CreateModel") == 1
            assert rpc(before, "Connect", "OK") == 0  # the agents' streams are still open
            planner_before = await scrape(planner.metrics.port)

            answer = await stub.SetContext(fleet_pb2.SetContextRequest(name="llama", tokens=16384))
            ro = await wait_rollout(stub, answer.rollout_id)
            assert ro.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, ro.reason
            refused = None
            try:
                await stub.SetContext(fleet_pb2.SetContextRequest(name="llama", tokens=10))
            except grpc.aio.AioRpcError as err:
                refused = err.code()
            assert refused is grpc.StatusCode.INVALID_ARGUMENT

            after = await scrape(fleet.metrics.port)
            assert value(after, "llmgw_fleet_rollouts_total", outcome="SUCCEEDED") == 1
            assert value(after, "llmgw_fleet_rollouts_total", outcome="FAILED") == 0
            duration = value(
                after, "llmgw_fleet_rollout_duration_seconds_count", outcome="SUCCEEDED"
            )
            assert duration == 1
            assert value(after, "llmgw_fleet_rollout_duration_seconds_sum", outcome="SUCCEEDED") > 0
            assert value(after, "llmgw_fleet_rollouts_running") == 0
            assert value(after, "llmgw_fleet_replicas", phase="READY") == 2
            assert rpc(after, "SetContext", "OK") == 1
            assert rpc(after, "SetContext", "INVALID_ARGUMENT") == 1
            assert rpc(after, "WatchRollout", "OK") == 1
            latency = value(
                after,
                "grpc_server_handling_seconds_count",
                grpc_service="llmgw.fleet.v1.FleetService",
                grpc_method="SetContext",
                grpc_type="unary",
                grpc_code="OK",
            )
            assert latency == 1
            planner_after = await scrape(planner.metrics.port)
            assert rpc(planner_after, "SizeContext", service="llmgw.planner.v1.PlannerService") == (
                rpc(planner_before, "SizeContext") + 1
            )
        finally:
            for a in agents:
                await a.stop()

        async def streams_counted() -> Samples | None:
            now = await scrape(fleet.metrics.port)  # type: ignore[union-attr]
            ended = sum(
                v
                for (name, labels), v in now.items()
                if name == "grpc_server_handled_total" and ("grpc_method", "Connect") in labels
            )
            return now if ended == 2 else None

        # The agents' bidirectional streams are counted once they end, as any RPC.
        closed = await assert_eventually(streams_counted, what="both Connect streams counted")
        assert value(closed, "llmgw_fleet_agents_connected") == 0


async def test_planner_counts_shape_cache_hits_and_misses(tmp_path: Path) -> None:
    """Describing one GGUF file twice is one miss (a fetch) then one hit on /metrics."""
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    resolver = ShapeResolver(policy=SourcePolicy.from_settings(allow_roots=[str(tmp_path)]))
    async with running_planner(resolver, metrics="127.0.0.1:0") as (planner, stub, _c):
        assert planner.metrics is not None
        start = await scrape(planner.metrics.port)
        assert value(start, "llmgw_planner_shape_cache_misses_total") == 0
        for _ in range(2):
            await stub.DescribeModel(planner_pb2.DescribeModelRequest(source=str(gguf)))
        now = await scrape(planner.metrics.port)
        assert value(now, "llmgw_planner_shape_cache_misses_total") == 1
        assert value(now, "llmgw_planner_shape_cache_hits_total") == 1
        assert value(now, "llmgw_planner_shape_fetches_total") == 1
        assert rpc(now, "DescribeModel") == 2


async def test_metrics_endpoint_answers_scrapes_only(tmp_path: Path) -> None:
    """Another path is 404, another method 405, an oversized request head is dropped without
    an answer, and the endpoint still serves the next scrape."""
    async with running_fleet(tmp_path, metrics="127.0.0.1:0") as (fleet, _stub):
        assert fleet.metrics is not None
        base = f"http://127.0.0.1:{fleet.metrics.port}"
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{base}/", timeout=5)).status_code == 404
            assert (await client.post(f"{base}/metrics", timeout=5)).status_code == 405
            head = await client.head(f"{base}/metrics", timeout=5)
            assert head.status_code == 200 and head.content == b""
        reader, writer = await asyncio.open_connection("127.0.0.1", fleet.metrics.port)
        writer.write(b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * 20_000 + b"\r\n\r\n")
        await writer.drain()
        assert await closed_unanswered(reader)
        writer.close()
        assert value(await scrape(fleet.metrics.port), "llmgw_fleet_leader") == 1
        # Connections that send nothing hold at most MAX_CONNECTIONS places; the one past
        # them is closed unanswered, and a scrape goes through once they are gone.
        idle = [
            await asyncio.open_connection("127.0.0.1", fleet.metrics.port)
            for _ in range(MAX_CONNECTIONS)
        ]
        await asyncio.sleep(0.2)  # let the server accept them all
        extra_reader, extra_writer = await asyncio.open_connection("127.0.0.1", fleet.metrics.port)
        extra_writer.write(b"GET /metrics HTTP/1.1\r\n\r\n")
        assert await closed_unanswered(extra_reader)
        extra_writer.close()
        for _r, w in idle:
            w.close()
        await assert_eventually(
            lambda: _scrapes(fleet.metrics.port),  # type: ignore[union-attr]
            what="a scrape after the idle connections closed",
        )


async def test_every_endpoint_has_build_info_and_process_series(tmp_path: Path) -> None:
    """The fleet's and the planner's endpoints serve llmgw_build_info with this build's
    version, commit and Python, the process and platform collectors' series, and the
    OpenMetrics format to a scraper that asks for it (Prometheus' text to one that does not)."""
    info = build_info()
    build = {"version": info.version, "commit": info.commit, "python": info.python}
    async with (
        running_fleet(tmp_path, metrics="127.0.0.1:0") as (fleet, _stub),
        running_planner(metrics="127.0.0.1:0") as (planner, _pstub, _channel),
    ):
        assert fleet.metrics is not None and planner.metrics is not None
        fleet_now = await scrape(fleet.metrics.port)
        # The series the alerts in deploy/monitoring are written on.
        assert value(fleet_now, "llmgw_fleet_store_up") == 1
        assert value(fleet_now, "llmgw_fleet_rollout_oldest_running_seconds") == 0
        assert ("llmgw_fleet_watchers_cut_total", frozenset()) in fleet_now
        assert ("llmgw_fleet_watchers", frozenset()) in fleet_now
        for port in (fleet.metrics.port, planner.metrics.port):
            samples = await scrape(port)
            assert value(samples, "llmgw_build_info", **build) == 1
            assert value(samples, "process_start_time_seconds") > 0
            assert value(samples, "process_resident_memory_bytes") > 0
            assert ("python_info", frozenset()) not in samples  # it has labels
            assert any(name == "python_info" for name, _ in samples)
            async with httpx.AsyncClient() as client:
                answer = await client.get(
                    f"http://127.0.0.1:{port}/metrics",
                    headers={"Accept": "application/openmetrics-text; version=1.0.0"},
                    timeout=5,
                )
            assert answer.headers["content-type"].startswith("application/openmetrics-text")
            assert answer.text.endswith("# EOF\n")
            families = {f.name for f in openmetrics_families(answer.text)}  # type: ignore[no-untyped-call]
            assert "llmgw_build" in families and "process_cpu_seconds" in families


async def test_probe_port_serves_health_alone_in_plaintext(tmp_path: Path) -> None:
    """The fleet's probe port answers `llmgw.liveness` and "" as SERVING and offers no
    other service (the fleet's API stays behind its own port)."""
    async with running_fleet(tmp_path, probes="127.0.0.1:0") as (fleet, _stub):
        assert fleet.probes is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{fleet.probes.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in (LIVENESS, ""):
                answer = await health.Check(health_pb2.HealthCheckRequest(service=service))
                assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
            listing: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
                "/llmgw.fleet.v1.FleetService/ListModels"
            )
            try:
                await listing(b"")
                code = grpc.StatusCode.OK
            except grpc.aio.AioRpcError as err:
                code = err.code()
            assert code is grpc.StatusCode.UNIMPLEMENTED


@asynccontextmanager
async def agent_process(port: int, state_dir: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """`python -m fleet_svc.agent` with --metrics and --probe-listen on free ports."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "fleet_svc.agent",
        "--fleet",
        f"127.0.0.1:{port}",
        "--node",
        "metrics-node",
        "--gpus",
        "2xL4-24GB",
        "--state-dir",
        str(state_dir),
        "--metrics",
        "127.0.0.1:0",
        "--probe-listen",
        "127.0.0.1:0",
        "--advertise-host",
        "10.1.2.3",
        "--log-format",
        "json",
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def listening_ports(proc: asyncio.subprocess.Process) -> dict[str, int]:
    """The ports the agent's log says its metrics and probe ports took."""
    ports: dict[str, int] = {}
    assert proc.stderr is not None
    while len(ports) < 2:
        line = await asyncio.wait_for(proc.stderr.readline(), 20)
        assert line, "the agent exited before it listened"
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") in ("metrics_listening", "probe_port_listening"):
            ports[event["event"]] = int(event["port"])
    return ports


async def test_agent_process_serves_metrics_and_readiness(tmp_path: Path) -> None:
    """The agent run with --metrics and --probe-listen reports its stream as connected on
    /metrics and as ready on its probe port once the fleet welcomed it, its cards, and the
    replica it runs by phase, reported at the --advertise-host address."""
    async with (
        running_fake_fleet() as (fleet, port),
        agent_process(port, tmp_path / "state") as proc,
    ):
        ports = await listening_ports(proc)

        async def connected() -> Samples | None:
            now = await scrape(ports["metrics_listening"])
            return now if value(now, "llmgw_agent_connected") == 1 else None

        now = await assert_eventually(connected, what="the agent connected on /metrics")
        assert value(now, "llmgw_agent_cards") == 2
        assert value(now, "llmgw_agent_replicas", phase="HEALTHY") == 0
        async with grpc.aio.insecure_channel(f"127.0.0.1:{ports['probe_port_listening']}") as ch:
            health = health_pb2_grpc.HealthStub(ch)

            async def ready() -> bool:
                answer = await health.Check(health_pb2.HealthCheckRequest(service=""))
                return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)

            await assert_eventually(ready, what="the agent ready on its probe port")
            live = await health.Check(health_pb2.HealthCheckRequest(service=LIVENESS))
            assert live.status == health_pb2.HealthCheckResponse.SERVING

        # A replica it runs shows by phase, and its address names --advertise-host.
        fleet.desire(spec("m1"))
        up = await assert_eventually(
            lambda: next((u for u in fleet.updates_of("m1") if u.phase == HEALTHY), None),
            timeout_s=20,
            what="m1 HEALTHY",
        )
        assert up.address.startswith("10.1.2.3:"), up.address

        async def one_healthy() -> bool:
            now = await scrape(ports["metrics_listening"])
            return value(now, "llmgw_agent_replicas", phase="HEALTHY") == 1

        await assert_eventually(one_healthy, what="one HEALTHY replica on /metrics")
        proc.send_signal(signal.SIGTERM)  # the agent stops its engine before it exits
        assert await asyncio.wait_for(proc.wait(), 30) == 0
