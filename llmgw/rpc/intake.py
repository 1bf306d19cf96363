"""The gate every request's bytes pass before a handler sees them: a message past the server's
byte limit, or bytes that do not parse as the method's request, are refused with the Google
error model like any other refusal (ErrorInfo, reason, metadata), not with gRPC's bare
RESOURCE_EXHAUSTED or its UNKNOWN "Unexpected DecodeError".

grpc's asyncio server decodes a request with the handler's `request_deserializer` before any
interceptor or servicer code runs, and turns an exception there into UNKNOWN. So the
interceptor swaps in a deserializer that never raises: it returns a `_Refused` holding the
status, and the handler it wraps answers that status instead of calling the servicer. gRPC
core's own receive limit (`grpc.max_receive_message_length`) is raised above ours
(`core_limit`: twice ours, at least 16 MiB), so a message between the two reaches this check
and is refused with details; one past core's is refused by core itself, without them."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias

import grpc
import structlog
from google.rpc import status_pb2
from grpc_status import rpc_status

from llmgw.limits import Limits
from llmgw.rpc.status import build_status

log = structlog.get_logger(__name__)

Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


class _Refused:
    """A request that was not decoded, and the status it is answered with."""

    __slots__ = ("status",)

    def __init__(self, status: status_pb2.Status) -> None:
        self.status = status


CORE_LIMIT_FLOOR_BYTES = 16 << 20
"""gRPC core's receive limit is at least this: a caller sending what gRPC's default 4 MiB
lets through, or a little more, is told our limit with ErrorInfo rather than core's bare
RESOURCE_EXHAUSTED. Core holds a message up to this before the intake sees it."""


def core_limit(limits: Limits) -> int:
    """gRPC core's receive limit for a server holding to `limits`: twice ours, and at least
    CORE_LIMIT_FLOOR_BYTES; a request past ours but not past this is refused here, with
    ErrorInfo."""
    return max(2 * limits.max_message_bytes, CORE_LIMIT_FLOOR_BYTES)


def server_options(limits: Limits) -> list[tuple[str, int]]:
    """The gRPC server options that go with the intake: core's receive limit."""
    return [("grpc.max_receive_message_length", core_limit(limits))]


def too_large(domain: str, size: int, limit: int, method: str) -> status_pb2.Status:
    """A request of `size` bytes past the server's `limit`: RESOURCE_EXHAUSTED, as gRPC core
    answers past its own limit, but with ErrorInfo naming the limit."""
    return build_status(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "MESSAGE_TOO_LARGE",
        domain,
        f"the request is {size} bytes, more than this server's max_message_bytes ({limit}): "
        "send a smaller one",
        {"limit": "max_message_bytes", "maximum": str(limit), "count": str(size), "method": method},
    )


def malformed(domain: str, type_name: str, method: str) -> status_pb2.Status:
    """A request whose bytes do not parse as the method's message: INVALID_ARGUMENT."""
    return build_status(
        grpc.StatusCode.INVALID_ARGUMENT,
        "MALFORMED_MESSAGE",
        domain,
        f"the request's bytes do not parse as {type_name}: send the message the method "
        "takes, encoded as protobuf",
        {"message_type": type_name, "method": method},
    )


def example_statuses(domain: str) -> list[status_pb2.Status]:
    """One status of each reason the intake answers with (for docs/errors.md's test)."""
    return [
        too_large(domain, 5 << 20, 4 << 20, "/pkg.Service/Method"),
        malformed(domain, "pkg.Request", "/pkg.Service/Method"),
    ]


WRAPPED_KEPT = 256
"""Methods whose wrapped handler is kept, at most (past it the memory starts again)."""


class IntakeInterceptor(grpc.aio.ServerInterceptor):
    """Refuses requests too large or malformed, with ErrorInfo in `domain`, before any other
    interceptor or servicer sees them. Put it first in the server's interceptors."""

    def __init__(self, domain: str, limits: Limits) -> None:
        self.domain = domain
        self.limits = limits
        # The wrapped handler of each method, built once: wrapping anew on every call was a
        # tenth of a health check's CPU. Kept with the handler it wraps, so a continuation
        # that answers with another handler is wrapped anew; bounded (WRAPPED_KEPT), since a
        # generic handler could answer methods a caller makes up.
        self._wrapped_of: dict[str, tuple[Handler, Handler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        kept = self._wrapped_of.get(method)
        if kept is not None and kept[0] is handler:
            return kept[1]
        wrapped = self._wrapped(handler, method)
        if len(self._wrapped_of) >= WRAPPED_KEPT:
            self._wrapped_of.clear()
        self._wrapped_of[method] = (handler, wrapped)
        return wrapped

    def _read(self, deserialize: Callable[[bytes], Any] | None, method: str) -> Callable[..., Any]:
        """A deserializer that never raises: the message, or a `_Refused`."""
        limit = self.limits.max_message_bytes
        kind = getattr(getattr(deserialize, "__self__", None), "DESCRIPTOR", None)
        type_name = kind.full_name if kind is not None else "request"

        def read(raw: bytes) -> Any:
            if len(raw) > limit:
                return _Refused(too_large(self.domain, len(raw), limit, method))
            if deserialize is None:
                return raw
            try:
                return deserialize(raw)
            except Exception as exc:  # DecodeError, or whatever else a parser may raise
                log.info("request_undecodable", method=method, error=str(exc))
                return _Refused(malformed(self.domain, type_name, method))

        return read

    def _wrapped(self, handler: Handler, method: str) -> Handler:
        read = self._read(handler.request_deserializer, method)
        serialize = handler.response_serializer
        # The behaviours are typed for the sync server by grpc's stubs; these are asyncio's.
        inner_streams: Any = handler.stream_stream
        inner_unary: Any = handler.stream_unary
        inner_stream: Any = handler.unary_stream
        inner: Any = handler.unary_unary
        if handler.request_streaming:

            async def checked(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
                async for request in requests:
                    if isinstance(request, _Refused):
                        await _refuse(context, request.status, method)
                    yield request

            if handler.response_streaming:

                async def stream_stream(requests: AsyncIterator[Any], context: Context) -> Any:
                    answers = inner_streams(checked(requests, context), context)
                    async for message in _results(answers):
                        yield message

                return grpc.stream_stream_rpc_method_handler(
                    stream_stream, request_deserializer=read, response_serializer=serialize
                )

            async def stream_unary(requests: AsyncIterator[Any], context: Context) -> Any:
                return await _result(inner_unary(checked(requests, context), context))

            return grpc.stream_unary_rpc_method_handler(
                stream_unary, request_deserializer=read, response_serializer=serialize
            )
        if handler.response_streaming:

            async def unary_stream(request: Any, context: Context) -> Any:
                if isinstance(request, _Refused):
                    await _refuse(context, request.status, method)
                async for message in _results(inner_stream(request, context)):
                    yield message

            return grpc.unary_stream_rpc_method_handler(
                unary_stream, request_deserializer=read, response_serializer=serialize
            )

        async def unary_unary(request: Any, context: Context) -> Any:
            if isinstance(request, _Refused):
                await _refuse(context, request.status, method)
            return await _result(inner(request, context))

        return grpc.unary_unary_rpc_method_handler(
            unary_unary, request_deserializer=read, response_serializer=serialize
        )


async def _result(value: Any) -> Any:
    """A handler's answer, whether it was written as a coroutine or a plain function."""
    return await value if inspect.isawaitable(value) else value


async def _results(value: Any) -> AsyncIterator[Any]:
    """A streaming handler's messages: an async iterator's, a plain iterator's, or none (a
    coroutine that wrote them with context.write)."""
    if hasattr(value, "__aiter__"):
        try:
            async for message in value:
                yield message
        finally:
            # Closed with this one (a call cancelled between messages), so the handler's own
            # cleanup (a watcher leaving the hub) runs now, not when it is collected.
            close = getattr(value, "aclose", None)
            if close is not None:
                await close()
    elif inspect.isawaitable(value):
        await value
    else:
        for message in value:
            yield message


async def _refuse(context: Context, status: status_pb2.Status, method: str) -> None:
    """End the call with `status` (raises, as abort does)."""
    log.info(
        "request_refused",
        method=method,
        code=grpc.StatusCode.INVALID_ARGUMENT.name
        if status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        else grpc.StatusCode.RESOURCE_EXHAUSTED.name,
        message=status.message,
    )
    await context.abort_with_status(rpc_status.to_status(status))
    raise AssertionError("abort_with_status returns only by raising")
