"""Prometheus metrics for every llmgw process: one registry per server, an interceptor that
counts and times every RPC, and the small HTTP endpoint that serves `/metrics`.

Each server (planner, fleet, agent) makes its own `CollectorRegistry` (several run in one test
process) and adds its own collectors to it: the fleet's in fleet_svc/metrics.py, the planner's
in planner_svc/metrics.py, the agent's in fleet_svc/agent/metrics.py. The RPC series follow the
names of go-grpc-prometheus (`grpc_server_handled_total`, `grpc_server_handling_seconds`), so
the dashboards written for it read these too.

Every endpoint also serves what a Prometheus target is expected to (start_metrics_server adds
them to the registry it serves, once): `process_*` (CPU, memory, open files, start time),
`python_info` and `python_gc_*`, and `llmgw_build_info{version,commit,python}` (llmgw.build).
A scraper that accepts `application/openmetrics-text` gets the OpenMetrics format (with its
`# EOF`); others get Prometheus' text format 0.0.4, as prometheus_client's own server chooses.

The endpoint is served from the process's own event loop (asyncio.start_server), so collectors
read the server's state on the thread that changes it; it is off unless `--metrics HOST:PORT`
is given, answers GET and HEAD on `/metrics` only, reads at most 8 KiB of request head for at
most 5 s per connection, and serves at most 32 connections at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.exposition import choose_encoder

from llmgw.build import build_info

log = structlog.get_logger(__name__)

HEAD_LIMIT_BYTES = 8 << 10
"""The most of a request's line and headers the endpoint reads."""
READ_TIMEOUT_S = 5.0
"""How long a connection may take to send its request head."""
MAX_CONNECTIONS = 32
"""Connections served at once; more are closed unanswered (a scraper needs one)."""
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
"""RPC latency buckets: a cached SizeContext (about a millisecond) to a cold Hub fetch."""


def add_metrics_argument(parser: argparse.ArgumentParser) -> None:
    """`--metrics HOST:PORT`: serve Prometheus metrics there (default: off)."""
    parser.add_argument(
        "--metrics",
        default="",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (default off); plain "
        "HTTP, so keep it on loopback or behind a NetworkPolicy",
    )


def split_address(listen: str) -> tuple[str, int]:
    """HOST:PORT (or [V6]:PORT) as a host and a port number.

    Raises:
        ValueError: not HOST:PORT with a port in 0..65535.
    """
    host, sep, port_text = listen.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{listen!r} is not HOST:PORT (a port 0-65535)")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port_text)


def _method_parts(full: str) -> tuple[str, str]:
    service, _, method = full.lstrip("/").partition("/")
    return service, method


def status_code_name(context: Any, error: BaseException | None) -> str:
    """The status code an RPC ended with, as its caller sees it: the code the handler set
    (an abort sets one), else CANCELLED for a cancelled call, UNKNOWN for an exception, OK."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code.name
    if isinstance(error, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED.name
    if error is not None:
        return grpc.StatusCode.UNKNOWN.name
    return grpc.StatusCode.OK.name


class RpcMetrics(grpc.aio.ServerInterceptor):
    """Counts every RPC by service, method, type and status code, and times it (from the
    handler's start to its last message), refusals included."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("grpc_service", "grpc_method", "grpc_type")
        self.started = Counter(
            "grpc_server_started",
            "RPCs started on the server.",
            labels,
            registry=registry,
        )
        self.handled = Counter(
            "grpc_server_handled",
            "RPCs completed on the server, whatever their status code.",
            (*labels, "grpc_code"),
            registry=registry,
        )
        self.seconds = Histogram(
            "grpc_server_handling_seconds",
            "How long RPCs took, from the handler's start to its end.",
            (*labels, "grpc_code"),
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )

    def _done(self, labels: tuple[str, str, str], code: str, started_s: float) -> None:
        self.handled.labels(*labels, code).inc()
        self.seconds.labels(*labels, code).observe(time.perf_counter() - started_s)

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        service, method = _method_parts(handler_call_details.method)
        behavior: Any
        make: Any
        if handler.unary_unary is not None:
            kind, behavior, make = "unary", handler.unary_unary, grpc.unary_unary_rpc_method_handler
        elif handler.unary_stream is not None:
            kind, behavior = "server_stream", handler.unary_stream
            make = grpc.unary_stream_rpc_method_handler
        elif handler.stream_unary is not None:
            kind, behavior = "client_stream", handler.stream_unary
            make = grpc.stream_unary_rpc_method_handler
        else:
            kind, behavior = "bidi_stream", handler.stream_stream
            make = grpc.stream_stream_rpc_method_handler
        wrapped = self._wrap(behavior, (service, method, kind))
        return make(  # type: ignore[no-any-return]
            wrapped,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _wrap(self, behavior: Any, labels: tuple[str, str, str]) -> Any:
        if inspect.isasyncgenfunction(behavior):

            async def streaming(request: Any, context: Any) -> AsyncIterator[Any]:
                self.started.labels(*labels).inc()
                started_s = time.perf_counter()
                try:
                    async for message in behavior(request, context):
                        yield message
                except BaseException as exc:
                    self._done(labels, status_code_name(context, exc), started_s)
                    raise
                self._done(labels, status_code_name(context, None), started_s)

            return streaming

        async def unary(request: Any, context: Any) -> Any:
            self.started.labels(*labels).inc()
            started_s = time.perf_counter()
            try:
                result = behavior(request, context)
                if inspect.isawaitable(result):
                    result = await result
            except BaseException as exc:
                self._done(labels, status_code_name(context, exc), started_s)
                raise
            self._done(labels, status_code_name(context, None), started_s)
            return result

        return unary


_STANDARD = "_llmgw_standard_collectors"
"""Marks a registry start_metrics_server already gave the standard collectors."""


def add_standard_collectors(registry: CollectorRegistry) -> None:
    """The process, platform and garbage-collector collectors prometheus_client's global
    registry has, and `llmgw_build_info`, on `registry` (once; a registry served twice keeps
    one of each). The default global instances are left alone: these are the registry's own."""
    if getattr(registry, _STANDARD, False):
        return
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    info = build_info()
    Info("llmgw_build", "The llmgw build serving this endpoint.", registry=registry).info(
        {"version": info.version, "commit": info.commit, "python": info.python}
    )
    setattr(registry, _STANDARD, True)


def _accept(head: bytes) -> str:
    """The Accept header of a request head ("" when there is none)."""
    for line in head.split(b"\r\n")[1:]:
        name, sep, val = line.partition(b":")
        if sep and name.strip().lower() == b"accept":
            return val.strip().decode("latin-1")
    return ""


@dataclass
class MetricsServer:
    """The running `/metrics` endpoint."""

    server: asyncio.Server
    port: int

    async def stop(self) -> None:
        """Close the endpoint."""
        self.server.close()
        with contextlib.suppress(Exception):
            await self.server.wait_closed()


def _response(status: str, body: bytes, content_type: str, head_only: bool) -> bytes:
    lines = [
        f"HTTP/1.1 {status}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
        "Connection: close",
        "",
        "",
    ]
    return "\r\n".join(lines).encode() + (b"" if head_only else body)


async def start_metrics_server(listen: str, registry: CollectorRegistry) -> MetricsServer:
    """Serve `registry` at http://`listen`/metrics.

    Raises:
        ValueError: `listen` is not HOST:PORT.
        OSError: the address could not be bound.
    """
    host, port = split_address(listen)
    add_standard_collectors(registry)
    open_connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_connections
        if open_connections >= MAX_CONNECTIONS:
            writer.close()
            return
        open_connections += 1
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
            if len(parts) != 3 or parts[0] not in ("GET", "HEAD"):
                reply = _response("405 Method Not Allowed", b"GET /metrics\n", "text/plain", False)
            elif parts[1].split("?", 1)[0] != "/metrics":
                reply = _response("404 Not Found", b"see /metrics\n", "text/plain", False)
            else:
                encode, content_type = choose_encoder(_accept(head))
                body = encode(registry)
                reply = _response("200 OK", body, content_type, parts[0] == "HEAD")
            writer.write(reply)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # a slow, oversized or vanished client: close and forget it
        finally:
            open_connections -= 1
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, host, port, limit=HEAD_LIMIT_BYTES)
    bound = server.sockets[0].getsockname()[1]
    log.info("metrics_listening", listen=listen, port=bound)
    return MetricsServer(server, int(bound))
