"""The one table from planner exceptions to gRPC status codes and reasons, and the
decorator that applies it to every servicer method."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import structlog
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from planner_svc.domain import errors

DOMAIN = "planner.llmgw.dev"
"""`ErrorInfo.domain` of every planner error."""

log = structlog.get_logger(__name__)

# class -> (code, reason). Subclasses come before their bases: the first match wins.
# Refusals are never UNAVAILABLE: meshes retry that code.
_TABLE: tuple[tuple[type[errors.PlannerError], grpc.StatusCode, str | None], ...] = (
    (errors.ContextTooShort, grpc.StatusCode.INVALID_ARGUMENT, "CONTEXT_TOO_SHORT"),
    (errors.SlotsOutOfRange, grpc.StatusCode.INVALID_ARGUMENT, "SLOTS_OUT_OF_RANGE"),
    (errors.InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT, None),  # reason from the error
    (errors.ContextOverTrained, grpc.StatusCode.INVALID_ARGUMENT, "CONTEXT_OVER_TRAINED"),
    (errors.HeadsNotDivisible, grpc.StatusCode.INVALID_ARGUMENT, "HEADS_NOT_DIVISIBLE"),
    (errors.UnknownEngine, grpc.StatusCode.INVALID_ARGUMENT, "UNKNOWN_ENGINE"),
    (errors.InvalidShape, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SHAPE"),
    (errors.EngineNoContext, grpc.StatusCode.FAILED_PRECONDITION, "ENGINE_NO_CONTEXT"),
    (errors.CardsTooSmall, grpc.StatusCode.FAILED_PRECONDITION, "CARDS_TOO_SMALL"),
    (errors.GPUCountUnavailable, grpc.StatusCode.FAILED_PRECONDITION, "GPU_COUNT_UNAVAILABLE"),
    (errors.EngineSingleCard, grpc.StatusCode.FAILED_PRECONDITION, "ENGINE_SINGLE_CARD"),
    (errors.EngineRefuses, grpc.StatusCode.FAILED_PRECONDITION, "ENGINE_REFUSES"),
    (errors.SourceUnreachable, grpc.StatusCode.FAILED_PRECONDITION, "SOURCE_UNREACHABLE"),
    (errors.ProfileNotFound, grpc.StatusCode.NOT_FOUND, "PROFILE_NOT_FOUND"),
    (errors.PlannerError, grpc.StatusCode.FAILED_PRECONDITION, "REFUSED"),
)

# The request field each refusal is about, for google.rpc.BadRequest.
_FIELDS: dict[type[errors.PlannerError], str] = {
    errors.ContextOverTrained: "tokens",
    errors.HeadsNotDivisible: "gpus",
    errors.UnknownEngine: "model.profiles.engine",
    errors.InvalidShape: "model.source",
}


def code_and_reason(exc: errors.PlannerError) -> tuple[grpc.StatusCode, str]:
    """The status code and ErrorInfo reason of a planner exception."""
    for cls, code, reason in _TABLE:
        if isinstance(exc, cls):
            if reason is None and isinstance(exc, errors.InvalidRequest):
                return code, exc.reason
            return code, reason or "REFUSED"
    return grpc.StatusCode.INTERNAL, "INTERNAL"


def to_status(exc: errors.PlannerError) -> status_pb2.Status:
    """A google.rpc.Status with ErrorInfo and, where they fit, BadRequest,
    PreconditionFailure or ResourceInfo."""
    code, reason = code_and_reason(exc)
    details = [error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=exc.metadata())]
    field = exc.field if isinstance(exc, errors.InvalidRequest) else _FIELDS.get(type(exc))
    if field:
        details.append(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(
                        field=field, description=exc.message, reason=reason
                    )
                ]
            )
        )
    elif code is grpc.StatusCode.FAILED_PRECONDITION:
        details.append(
            error_details_pb2.PreconditionFailure(
                violations=[
                    error_details_pb2.PreconditionFailure.Violation(
                        type=reason, subject=_subject(exc), description=exc.message
                    )
                ]
            )
        )
    elif isinstance(exc, errors.ProfileNotFound):
        details.append(
            error_details_pb2.ResourceInfo(
                resource_type="llmgw.common.v1.Profile",
                resource_name=exc.profile,
                description=exc.message,
            )
        )
    packed = []
    for detail in details:
        holder = any_pb2.Any()
        holder.Pack(detail)
        packed.append(holder)
    return status_pb2.Status(code=code.value[0], message=exc.message, details=packed)


def _subject(exc: errors.PlannerError) -> str:
    """What a precondition failure is about: the profile, or the source."""
    for attr in ("profile", "source"):
        value = getattr(exc, attr, "")
        if isinstance(value, str) and value:
            return value
    return ""


Servicer = TypeVar("Servicer")
Request = TypeVar("Request")
Response = TypeVar("Response")


def refusals_as_status(
    method: Callable[[Servicer, Request, grpc.aio.ServicerContext[Any, Any]], Awaitable[Response]],
) -> Callable[[Servicer, Request, grpc.aio.ServicerContext[Any, Any]], Awaitable[Response]]:
    """Apply the table to a servicer method: planner exceptions become their status with
    details; anything else is logged with its traceback and answered INTERNAL."""

    @functools.wraps(method)
    async def wrapper(
        self: Servicer, request: Request, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Response:
        try:
            return await method(self, request, context)
        except errors.PlannerError as exc:
            status = to_status(exc)
            log.info(
                "request_refused",
                method=method.__name__,
                reason=code_and_reason(exc)[1],
                message=exc.message,
            )
        except Exception:
            log.exception("request_failed", method=method.__name__)
            status = status_pb2.Status(
                code=code_pb2.INTERNAL,
                message="the planner failed on this request; its log has the details",
            )
        await context.abort_with_status(rpc_status.to_status(status))
        raise AssertionError("abort_with_status returns only by raising")

    return wrapper
