"""OpenTelemetry traces for every llmgw process: OpenTelemetry's own gRPC instrumentation on
every server and channel, the trace context carried in each call's metadata (W3C
`traceparent`), and the current trace and span ids in every log line.

Tracing is off unless it is asked for: `--trace otlp` (or `console`), or with `--trace auto`
(the default) an OTLP endpoint in the environment (`OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, read by the exporter as the OpenTelemetry
specification says). Off, nothing is instrumented and nothing is sent; `OTEL_SDK_DISABLED=true`
turns it off whatever the flag says.

How far one trace reaches: `llmgw ctl` → fleet → planner is one trace (each hop's client span
the parent of the next server span). The agent's Connect stream is traced from the agent (its
client span) to the fleet (the server span of the stream). The desired sets the fleet pushes
down that stream are messages, not calls, so the fleet carries the context itself: a rollout
keeps the `traceparent` of the request that started it (`current_traceparent`), its replicas
carry it in the desired set, and the agent starts and stops them in child spans
(`child_span`), so a SetContext's trace reaches the agent's start of the new replica.

Only this module imports the SDK and the instrumentation, and only when tracing is on; the
log processor needs the API alone.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from llmgw.build import build_info

MODES = ("auto", "off", "otlp", "console")
ENV_TRACE = "LLMGW_TRACE"
"""The `--trace` mode when the flag is not given."""
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def add_trace_argument(parser: argparse.ArgumentParser) -> None:
    """`--trace {auto,off,otlp,console}`."""
    action = parser.add_argument(
        "--trace",
        choices=MODES,
        default=os.environ.get(ENV_TRACE, "auto"),
        help="export OpenTelemetry traces: otlp (to $OTEL_EXPORTER_OTLP_ENDPOINT, default "
        "localhost:4317), console (to stderr), off; auto (the default, or $LLMGW_TRACE) is "
        "otlp when an OTLP endpoint is set in the environment, else off",
    )
    action.env = ENV_TRACE  # type: ignore[attr-defined]  # named in the help (llmgw.cmdline)


def exporting(mode: str, environ: Mapping[str, str]) -> str:
    """Where spans go for `mode` in `environ`: "otlp", "console" or "off".

    Raises:
        ValueError: an unknown mode.
    """
    if mode not in MODES:
        raise ValueError(f"trace mode {mode!r} is not one of {', '.join(MODES)}")
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return "off"
    if mode == "auto":
        return "otlp" if any(environ.get(name) for name in ENDPOINT_VARIABLES) else "off"
    return mode


@dataclass
class Tracing:
    """Tracing on: the provider spans go to, and the instrumentors to take out at the end."""

    provider: Any
    instrumentors: list[Any] = field(default_factory=list)
    owns_provider: bool = True

    def shutdown(self) -> None:
        """Take the instrumentation out and flush what is still buffered."""
        for instrumentor in self.instrumentors:
            instrumentor.uninstrument()
        self.instrumentors.clear()
        if self.owns_provider:
            self.provider.shutdown()


def instrument(provider: Any) -> Tracing:
    """Instrument every gRPC server and channel made from now on (grpc.aio servers, grpc.aio
    and blocking channels) to trace into `provider`.

    The blocking channels' instrumentation takes the global tracer provider whatever it is
    given, so `provider` should be the global one (configure_tracing makes it so).
    """
    from opentelemetry.instrumentation.grpc import (
        GrpcAioInstrumentorClient,
        GrpcAioInstrumentorServer,
        GrpcInstrumentorClient,
    )

    out = Tracing(provider, owns_provider=False)
    for instrumentor in (
        GrpcAioInstrumentorServer(),  # type: ignore[no-untyped-call]
        GrpcAioInstrumentorClient(),  # type: ignore[no-untyped-call]
        GrpcInstrumentorClient(),  # type: ignore[no-untyped-call]
    ):
        instrumentor.instrument(tracer_provider=provider)
        out.instrumentors.append(instrumentor)
    return out


def resource_attributes(name: str) -> dict[str, str]:
    """What every span of this process says about it: the service's name and its build's
    version (OpenTelemetry's `service.version`), and the commit it was built from
    (llmgw.build)."""
    info = build_info()
    return {"service.name": name, "service.version": info.version, "vcs.revision": info.commit}


def configure_tracing(
    service: str, mode: str = "auto", environ: Mapping[str, str] | None = None
) -> Tracing | None:
    """Turn tracing on for this process when `mode` (and the environment) ask for it: a tracer
    provider named `service` (or $OTEL_SERVICE_NAME), made the global one, exporting in
    batches, and every gRPC server and channel instrumented. None when tracing is off
    (nothing is done).

    Call it before any server or channel is made (the instrumentation wraps their
    constructors), and `shutdown()` what it returns before exiting.
    """
    env = os.environ if environ is None else environ
    where = exporting(mode, env)
    if where == "off":
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    # OTEL_SERVICE_NAME, when set, names the process as the specification says it should.
    name = env.get("OTEL_SERVICE_NAME") or service
    provider = TracerProvider(resource=Resource.create(resource_attributes(name)))
    exporter: Any
    if where == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    else:
        exporter = ConsoleSpanExporter(out=sys.stderr)  # stdout's first line is the address
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    tracing = instrument(provider)
    tracing.owns_provider = True
    return tracing


@contextmanager
def span(name: str, **attributes: str) -> Iterator[None]:
    """A span around a piece of work (the CLI's whole command), under the global provider: a
    no-op while tracing is off."""
    with trace.get_tracer("llmgw").start_as_current_span(name, attributes=attributes):
        yield


_W3C = TraceContextTextMapPropagator()
"""The W3C trace-context format, whatever global propagator is set."""


def current_traceparent() -> str:
    """The W3C `traceparent` of the span running now, to carry where no call's metadata goes
    (a message on a stream); "" outside a span (so when tracing is off)."""
    if not trace.get_current_span().get_span_context().is_valid:
        return ""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    return carrier.get("traceparent", "")


def child_span(name: str, traceparent: str, **attributes: str | int) -> trace.Span | None:
    """A span started (not made current: see `trace.use_span`) as a child of `traceparent`,
    under the global provider; None for an empty or malformed `traceparent` (nothing to
    join). The caller ends it."""
    if not traceparent:
        return None
    parent = _W3C.extract({"traceparent": traceparent})
    if not trace.get_current_span(parent).get_span_context().is_valid:
        return None
    return trace.get_tracer("llmgw").start_span(name, context=parent, attributes=attributes)


@contextmanager
def in_span(span: trace.Span | None) -> Iterator[None]:
    """`span` made current for the block (not ended after it), so log lines written there
    carry its ids; nothing for None."""
    if span is None:
        yield
        return
    with trace.use_span(span, end_on_exit=False):
        yield


def end_span(span: trace.Span, error: str = "") -> None:
    """End `span`, marked as failed with `error` when one is given."""
    if error:
        span.set_status(trace.Status(trace.StatusCode.ERROR, error))
    span.end()


class ChildSpans:
    """`child_span`, `in_span` and `end_span` as one object, for code that must not import
    OpenTelemetry itself (the agent's runners are handed one where the agent traces)."""

    def start(self, name: str, traceparent: str, **attributes: str | int) -> trace.Span | None:
        """See `child_span`."""
        return child_span(name, traceparent, **attributes)

    def current(self, span: Any) -> AbstractContextManager[None]:
        """See `in_span`."""
        return in_span(span)

    def end(self, span: Any, error: str = "") -> None:
        """See `end_span`."""
        end_span(span, error)


def add_trace_ids(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """structlog processor: the current span's `trace_id` and `span_id` (hex, as trace
    backends print them) on every log line written inside a traced call."""
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event.setdefault("trace_id", format(context.trace_id, "032x"))
        event.setdefault("span_id", format(context.span_id, "016x"))
    return event
