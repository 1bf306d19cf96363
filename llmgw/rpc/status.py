"""The Google error model for every llmgw server: a status with ErrorInfo and the details
that fit, and the decorator that turns a service's exceptions into it. Callers read it back
in one place, llmgw.clients.errors."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import structlog
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

log = structlog.get_logger(__name__)

RETRIED_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
"""The codes every status of which carries google.rpc.RetryInfo: a caller's signal that the
condition may pass, and how long to wait first (AIP-193's RetryInfo)."""
RETRY_DELAY_S = 1.0
"""The RetryInfo delay of a status of those codes that names none of its own: the order of a
restarting server's or store's gap, and the clients' backoffs (llmgw/clients/service_config.json)
stay under it, so the server's word is what a careful caller waits."""


def build_status(
    code: grpc.StatusCode,
    reason: str,
    domain: str,
    message: str,
    metadata: dict[str, str],
    *,
    field: str = "",
    subject: str = "",
    resource: tuple[str, str] | None = None,
    retry_delay_s: float | None = None,
) -> status_pb2.Status:
    """A google.rpc.Status: ErrorInfo always; BadRequest when a `field` is at fault;
    PreconditionFailure for FAILED_PRECONDITION; ResourceInfo when a `resource` (type, name)
    is missing or in the way; RetryInfo for UNAVAILABLE and RESOURCE_EXHAUSTED (after
    `retry_delay_s`, RETRY_DELAY_S unless given)."""
    details: list[Message] = [
        error_details_pb2.ErrorInfo(reason=reason, domain=domain, metadata=metadata)
    ]
    if field:
        details.append(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=field, description=message, reason=reason
                    )
                ]
            )
        )
    elif code is grpc.StatusCode.FAILED_PRECONDITION:
        details.append(
            error_details_pb2.PreconditionFailure(
                violations=[
                    error_details_pb2.PreconditionFailure.Violation(
                        type=reason, subject=subject, description=message
                    )
                ]
            )
        )
    if resource is not None:
        details.append(
            error_details_pb2.ResourceInfo(
                resource_type=resource[0], resource_name=resource[1], description=message
            )
        )
    if code in RETRIED_CODES:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(
            round(1e9 * (RETRY_DELAY_S if retry_delay_s is None else retry_delay_s))
        )
        details.append(error_details_pb2.RetryInfo(retry_delay=delay))
    packed = []
    for detail in details:
        holder = any_pb2.Any()
        holder.Pack(detail)
        packed.append(holder)
    return status_pb2.Status(code=code.value[0], message=message, details=packed)


INTERNAL = status_pb2.Status(
    code=code_pb2.INTERNAL, message="the server failed on this request; its log has the details"
)

S = TypeVar("S")
Q = TypeVar("Q")
R = TypeVar("R")
Method = Callable[[S, Q, grpc.aio.ServicerContext[Any, Any]], Awaitable[R]]


def guarded(
    to_status: Callable[[Exception], status_pb2.Status | None],
) -> Callable[[Method[S, Q, R]], Method[S, Q, R]]:
    """A decorator for unary servicer methods: an exception `to_status` knows becomes that
    status; any other is logged with its traceback and answered INTERNAL."""

    def decorate(method: Method[S, Q, R]) -> Method[S, Q, R]:
        @functools.wraps(method)
        async def wrapper(self: S, request: Q, context: grpc.aio.ServicerContext[Any, Any]) -> R:
            try:
                return await method(self, request, context)
            except Exception as exc:
                status = to_status(exc)
                if status is None:
                    log.exception("request_failed", method=method.__name__)
                    status = INTERNAL
                else:
                    log.info(
                        "request_refused",
                        method=method.__name__,
                        code=grpc.StatusCode(_code_tuple(status.code)).name,
                        message=status.message,
                    )
            await context.abort_with_status(rpc_status.to_status(status))
            raise AssertionError("abort_with_status returns only by raising")

        return wrapper

    return decorate


def _code_tuple(code: int) -> tuple[int, str]:
    """The grpc.StatusCode value for a numeric code."""
    for c in grpc.StatusCode:
        if c.value[0] == code:
            return c.value
    return grpc.StatusCode.UNKNOWN.value


E = TypeVar("E", bound=Exception)


def subclasses(root: type[E]) -> list[type[E]]:
    """`root` and every class below it that is loaded, each once, roots first."""
    seen: list[type[E]] = []
    todo = [root]
    while todo:
        cls = todo.pop(0)
        if cls not in seen:
            seen.append(cls)
            todo.extend(cls.__subclasses__())
    return seen


def error_info(status: status_pb2.Status) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo a status carries (None when it carries none)."""
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info
    return None
