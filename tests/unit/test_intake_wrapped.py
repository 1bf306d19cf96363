"""The intake interceptor wraps each method's handler once, wraps anew a handler it has not
seen, and keeps a bounded number of them."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from llmgw.limits import DEFAULT_LIMITS
from llmgw.rpc.intake import WRAPPED_KEPT, IntakeInterceptor


class _Details(grpc.HandlerCallDetails):
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


async def _echo(request: Any, context: Any) -> Any:
    return request


def test_a_method_is_wrapped_once_and_another_handler_anew() -> None:
    """Two calls of one method get the same wrapped handler; when the continuation answers
    with another handler, that one is wrapped; the memory stays bounded."""
    intake = IntakeInterceptor("test", DEFAULT_LIMITS)
    first: Any = grpc.unary_unary_rpc_method_handler(_echo)
    second: Any = grpc.unary_unary_rpc_method_handler(_echo)

    async def wrapped(handler: Any, method: str = "/p.S/M") -> Any:
        async def continuation(details: grpc.HandlerCallDetails) -> Any:
            return handler

        return await intake.intercept_service(continuation, _Details(method))

    async def scenario() -> None:
        a, b = await wrapped(first), await wrapped(first)
        assert a is b and a is not first and a.unary_unary is not None
        c = await wrapped(second)
        assert c is not a
        assert await wrapped(None) is None
        for i in range(WRAPPED_KEPT + 3):
            await wrapped(first, f"/p.S/M{i}")
        assert len(intake._wrapped_of) <= WRAPPED_KEPT

    asyncio.run(scenario())
