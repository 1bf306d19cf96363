"""A check run before a gRPC method handler, whatever the method's kind: what a server
interceptor that only admits or refuses calls wraps each handler in."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

Admit = Callable[[Any, Any], Awaitable[object]]
"""`admit(request, context)`, awaited before the handler runs (request None for the
client-streaming kinds); it refuses a call by aborting the context."""


def admitted(handler: Any, admit: Admit) -> Any:
    """`handler` (a grpc.RpcMethodHandler) with `admit` awaited before its method runs."""
    if handler.unary_unary is not None:
        inner_uu = handler.unary_unary

        async def unary_unary(request: Any, context: Any) -> Any:
            await admit(request, context)
            return await inner_uu(request, context)

        return handler._replace(unary_unary=unary_unary)
    if handler.unary_stream is not None:
        inner_us = handler.unary_stream

        async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            await admit(request, context)
            async for message in inner_us(request, context):
                yield message

        return handler._replace(unary_stream=unary_stream)
    if handler.stream_stream is not None:
        inner_ss = handler.stream_stream

        async def stream_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
            await admit(None, context)
            async for message in inner_ss(requests, context):
                yield message

        return handler._replace(stream_stream=stream_stream)
    inner_su = handler.stream_unary

    async def stream_unary(requests: Any, context: Any) -> Any:
        await admit(None, context)
        return await inner_su(requests, context)

    return handler._replace(stream_unary=stream_unary)
