"""OpenTelemetry traces: one `llmgw ctl` command is one trace through the fleet to the planner,
the agent's stream is traced into the fleet, a SetContext's trace reaches the agent's start
and stop of its replicas, log lines inside a traced call carry its trace id, and without an
exporter configured nothing is instrumented."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from structlog.testing import LogCapture

from llmgw.build import build_info
from llmgw.cli.main import main as llmgw_main
from llmgw.fleet.v1 import fleet_pb2
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.scripted_agent import ScriptedAgent
from llmgw.tracing import (
    ChildSpans,
    Tracing,
    add_trace_ids,
    configure_tracing,
    current_traceparent,
    exporting,
    instrument,
)
from tests.integration.test_rollouts import llamacpp_model, wait_rollout
from tests.integration.test_rollouts_real_agents import n_ready, replicas, standin_model
from tests.support.agents import running_agent
from tests.support.fleet import running_fleet
from tests.support.planner import running_planner

ROOT = Path(__file__).resolve().parents[2]
EXPORTER = InMemorySpanExporter()


def _global_provider() -> TracerProvider:
    """The process's SDK tracer provider, exporting to EXPORTER (set once: OpenTelemetry
    allows the global provider to be set only once per process)."""
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)
    return provider


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> Iterator[Tracing]:
    """gRPC instrumented into the in-memory exporter for one test, then taken out."""
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "LLMGW_TRACE",
    ):
        monkeypatch.delenv(name, raising=False)
    EXPORTER.clear()
    tracing = instrument(_global_provider())
    try:
        yield tracing
    finally:
        tracing.shutdown()


def server_span(spans: tuple[ReadableSpan, ...], rpc: str) -> ReadableSpan:
    """The one server span of an RPC (named `package.Service/Method`)."""
    (found,) = [s for s in spans if s.kind is SpanKind.SERVER and s.name.endswith("/" + rpc)]
    return found


async def test_one_trace_from_the_cli_through_fleet_to_planner(
    tmp_path: Path, traced: Tracing
) -> None:
    """`llmgw ctl model context` is one trace: the CLI's command span, its SetContext call,
    the fleet's SetContext, its SizeContext call and the planner's SizeContext, each the
    parent of the next; the planner's and the fleet's log lines in that call carry its id."""
    capture = LogCapture()
    saved = structlog.get_config()
    structlog.configure(processors=[add_trace_ids, capture])
    try:
        async with (
            running_planner() as (planner, _p, _c),
            running_fleet(tmp_path, planner=f"127.0.0.1:{planner.port}") as (fleet, stub),
        ):
            await stub.CreateModel(fleet_pb2.CreateModelRequest(model=llamacpp_model(0)))
            EXPORTER.clear()
            code = await asyncio.to_thread(
                llmgw_main,
                [
                    "ctl",
                    "--fleet",
                    f"127.0.0.1:{fleet.port}",
                    "--plaintext",
                    "model",
                    "context",
                    "llama",
                    "16384",
                ],
            )
            assert code == 0
    finally:
        structlog.configure(**saved)
    spans = EXPORTER.get_finished_spans()
    (command,) = [s for s in spans if s.name == "llmgw ctl"]
    fleet_call = server_span(spans, "SetContext")
    planner_call = server_span(spans, "SizeContext")
    trace_id = command.context.trace_id
    assert command.parent is None
    assert {fleet_call.context.trace_id, planner_call.context.trace_id} == {trace_id}
    by_id = {s.context.span_id: s for s in spans}

    def parent(s: ReadableSpan) -> ReadableSpan:
        assert s.parent is not None, s.name
        return by_id[s.parent.span_id]

    cli_client = parent(fleet_call)
    assert cli_client.kind is SpanKind.CLIENT and parent(cli_client) is command
    fleet_client = parent(planner_call)
    assert fleet_client.kind is SpanKind.CLIENT and parent(fleet_client) is fleet_call
    hex_id = format(trace_id, "032x")
    in_call = [e for e in capture.entries if e.get("trace_id") == hex_id]
    # The planner's line for the sizing and the fleet's for the revision it wrote.
    assert {"context_sized", "model_written"} <= {e["event"] for e in in_call}


async def test_agent_stream_is_traced_into_the_fleet(tmp_path: Path, traced: Tracing) -> None:
    """An agent's Connect stream is a client span in the agent and the fleet's server span of
    the same trace, its context carried in the call's metadata."""
    async with running_fleet(tmp_path) as (fleet, _stub):
        agent = ScriptedAgent(f"127.0.0.1:{fleet.port}", "traced-node", gpus=1)
        agent.start()
        links = fleet.controller.state.links
        await assert_eventually(lambda: "traced-node" in links, what="the agent connected")
        await agent.stop()

        def connect_spans() -> tuple[ReadableSpan, ReadableSpan] | None:
            spans = [s for s in EXPORTER.get_finished_spans() if s.name.endswith("/Connect")]
            client = [s for s in spans if s.kind is SpanKind.CLIENT]
            server = [s for s in spans if s.kind is SpanKind.SERVER]
            return (client[0], server[0]) if client and server else None

        client, server = await assert_eventually(connect_spans, what="both Connect spans")
    assert server.context.trace_id == client.context.trace_id
    assert server.parent is not None and server.parent.span_id == client.context.span_id


async def test_a_rollout_reaches_the_agents_replica_start_and_stop(
    tmp_path: Path, traced: Tracing
) -> None:
    """A SetContext's trace holds the real agent's start of the new replica (a child of the
    fleet's SetContext span, ended once healthy) and its stop of the old one; the agent's log
    lines for both carry that trace id."""
    capture = LogCapture()
    saved = structlog.get_config()
    structlog.configure(processors=[add_trace_ids, capture])
    state = tmp_path / "agent"
    state.mkdir()
    try:
        async with (
            running_planner() as (planner, _p, _c),
            running_fleet(tmp_path, planner=f"127.0.0.1:{planner.port}") as (fleet, stub),
            running_agent(fleet.port, state, gpus="2xH100-80GB", spans=ChildSpans()),
        ):
            await stub.CreateModel(fleet_pb2.CreateModelRequest(model=standin_model(1)))
            await assert_eventually(lambda: n_ready(stub, 1), timeout_s=30, what="1 READY")
            (old,) = await replicas(stub)
            EXPORTER.clear()
            answer = await stub.SetContext(
                fleet_pb2.SetContextRequest(name="vmodel", tokens=10_000)
            )
            ro = await wait_rollout(stub, answer.rollout_id)
            assert ro.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, ro.reason

            def agent_spans() -> dict[str, ReadableSpan] | None:
                found = {
                    s.name: s for s in EXPORTER.get_finished_spans() if s.name.startswith("agent ")
                }
                return found if len(found) == 2 else None

            spans = await assert_eventually(agent_spans, what="the agent's start and stop")
            (new,) = await replicas(stub)
    finally:
        structlog.configure(**saved)
    set_context = server_span(EXPORTER.get_finished_spans(), "SetContext")
    trace_id = set_context.context.trace_id
    start, stop = spans["agent replica start"], spans["agent replica stop"]
    assert start.attributes is not None and stop.attributes is not None
    assert start.attributes["llmgw.replica_id"] == new.id
    assert stop.attributes["llmgw.replica_id"] == old.id
    for span in (start, stop):
        assert span.context.trace_id == trace_id
        assert span.parent is not None and span.parent.span_id == set_context.context.span_id
    assert [e.name for e in start.events][-1] == "HEALTHY"
    hex_id = format(trace_id, "032x")
    in_trace = {
        (e["event"], e.get("replica_id")) for e in capture.entries if e.get("trace_id") == hex_id
    }
    assert {("replica_started", new.id), ("replica_healthy", new.id)} <= in_trace
    assert ("replica_stopped", old.id) in in_trace
    # The replica started before, by no traced rollout, logged no trace id.
    assert not [
        e
        for e in capture.entries
        if e.get("replica_id") == old.id and e["event"] == "replica_started" and "trace_id" in e
    ]


async def test_an_untraced_fleet_sends_agents_no_trace_context(tmp_path: Path) -> None:
    """With tracing off in the fleet, a rollout's desired sets carry no traceparent, for the
    replicas it starts or the ones it stops."""
    async with (
        running_planner() as (planner, _p, _c),
        running_fleet(tmp_path, planner=f"127.0.0.1:{planner.port}") as (fleet, stub),
    ):
        agent = ScriptedAgent(f"127.0.0.1:{fleet.port}", "plain-node", gpus=2)
        agent.start()
        try:
            await stub.CreateModel(fleet_pb2.CreateModelRequest(model=standin_model(1)))
            await assert_eventually(lambda: n_ready(stub, 1), timeout_s=30, what="1 READY")
            answer = await stub.SetContext(
                fleet_pb2.SetContextRequest(name="vmodel", tokens=10_000)
            )
            ro = await wait_rollout(stub, answer.rollout_id)
            assert ro.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, ro.reason
            await assert_eventually(lambda: n_ready(stub, 1), timeout_s=30, what="old gone")
        finally:
            await agent.stop()
    started = {spec.replica_id for d in agent.desired for spec in d.replicas}
    assert len(started) == 2  # the first replica, and the rollout's
    assert all(spec.traceparent == "" for d in agent.desired for spec in d.replicas)
    assert all(not d.stop_traceparents for d in agent.desired)


def test_no_trace_context_outside_a_span() -> None:
    """Outside a span there is no traceparent to carry, and an empty or malformed one starts
    no child span; inside one it is that span's, in the W3C format."""
    assert current_traceparent() == ""
    spans = ChildSpans()
    assert spans.start("x", "") is None
    assert spans.start("x", "00-not-a-trace-01") is None
    provider = TracerProvider()
    with provider.get_tracer("t").start_as_current_span("work") as current:
        carried = current_traceparent()
    context = current.get_span_context()
    flags = int(context.trace_flags)
    assert carried == f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}"


def test_nothing_is_traced_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an OTLP endpoint or a mode asking for export, configure_tracing does nothing;
    an endpoint in the environment turns `auto` into OTLP; OTEL_SDK_DISABLED wins; an unknown
    mode is refused."""
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert configure_tracing("llmgw-test", "auto") is None
    assert configure_tracing("llmgw-test", "off", {"OTEL_EXPORTER_OTLP_ENDPOINT": "x"}) is None
    assert exporting("auto", {}) == "off"
    assert exporting("auto", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}) == "otlp"
    assert exporting("auto", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317"}) == "otlp"
    assert exporting("console", {"OTEL_SDK_DISABLED": "true"}) == "off"
    with pytest.raises(ValueError, match="not one of"):
        exporting("zipkin", {})


def test_log_lines_outside_a_span_carry_no_trace_id() -> None:
    """A log line written outside any span gets no trace_id; inside one it gets that span's."""
    assert "trace_id" not in add_trace_ids(None, "info", {"event": "x"})
    provider = TracerProvider()
    with provider.get_tracer("t").start_as_current_span("work") as current:
        event = add_trace_ids(None, "info", {"event": "x"})
    assert event["trace_id"] == format(current.get_span_context().trace_id, "032x")
    assert event["span_id"] == format(current.get_span_context().span_id, "016x")


async def test_a_service_asked_to_trace_exports_its_spans(tmp_path: Path) -> None:
    """`python -m planner_svc --trace console` exports a span for a call it served (to
    stderr), under the name OTEL_SERVICE_NAME gives, flushed when it stops on SIGTERM."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OTEL_SERVICE_NAME": "planner-under-test",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "planner_svc",
        "--listen",
        "127.0.0.1:0",
        "--trace",
        "console",
        "--log-format",
        "json",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        first = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert first.startswith("planner listening on 127.0.0.1:"), first
        port = int(first.rsplit(":", 1)[1])
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            await health.Check(health_pb2.HealthCheckRequest(service=""))
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0
    text = err.decode()  # spans go to stderr with the logs
    assert '"name": "/grpc.health.v1.Health/Check"' in text
    assert '"service.name": "planner-under-test"' in text
    assert f'"service.version": "{build_info().version}"' in text
