"""The one table from planner exceptions to gRPC status codes and reasons, and the
decorator that applies it to every servicer method."""

from __future__ import annotations

import grpc
from google.rpc import status_pb2

from llmgw.authz.policy import AccessRefusal, RoleRequired, Unauthenticated
from llmgw.engines.gang import EngineSingleNode
from llmgw.refusal import Refusal
from llmgw.rpc.status import build_status, guarded, subclasses
from planner_svc.domain import errors

DOMAIN = "planner.llmgw.dev"
"""`ErrorInfo.domain` of every planner error."""

# class -> (code, reason). Subclasses come before their bases: the first match wins.
# Refusals are never UNAVAILABLE: meshes retry that code.
# The engines' refusals (llmgw.engines.errors: UnknownEngine, EngineSingleCard, EngineRefuses)
# are raised through the planner's domain and mapped here like its own.
# The shared refusals of llmgw.model and llmgw.shape (bad values, bad inline shapes) are here
# too: the planner raises them while converting a request.
_TABLE: tuple[tuple[type[Refusal], grpc.StatusCode, str | None], ...] = (
    (errors.ContextTooShort, grpc.StatusCode.INVALID_ARGUMENT, "CONTEXT_TOO_SHORT"),
    (errors.SlotsOutOfRange, grpc.StatusCode.INVALID_ARGUMENT, "SLOTS_OUT_OF_RANGE"),
    (errors.InvalidValue, grpc.StatusCode.INVALID_ARGUMENT, None),  # reason from the error
    (errors.ContextOverTrained, grpc.StatusCode.INVALID_ARGUMENT, "CONTEXT_OVER_TRAINED"),
    (errors.HeadsNotDivisible, grpc.StatusCode.INVALID_ARGUMENT, "HEADS_NOT_DIVISIBLE"),
    (errors.UnknownEngine, grpc.StatusCode.INVALID_ARGUMENT, "UNKNOWN_ENGINE"),
    (errors.InvalidShape, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SHAPE"),
    (errors.EngineNoContext, grpc.StatusCode.FAILED_PRECONDITION, "ENGINE_NO_CONTEXT"),
    (errors.CardsTooSmall, grpc.StatusCode.FAILED_PRECONDITION, "CARDS_TOO_SMALL"),
    (errors.GPUCountUnavailable, grpc.StatusCode.FAILED_PRECONDITION, "GPU_COUNT_UNAVAILABLE"),
    (errors.EngineSingleCard, grpc.StatusCode.FAILED_PRECONDITION, "ENGINE_SINGLE_CARD"),
    (EngineSingleNode, grpc.StatusCode.FAILED_PRECONDITION, "ENGINE_SINGLE_NODE"),
    (errors.EngineRefuses, grpc.StatusCode.FAILED_PRECONDITION, "ENGINE_REFUSES"),
    (errors.SourceUnreachable, grpc.StatusCode.FAILED_PRECONDITION, "SOURCE_UNREACHABLE"),
    (errors.ProfileNotFound, grpc.StatusCode.NOT_FOUND, "PROFILE_NOT_FOUND"),
    (errors.ResolutionsBusy, grpc.StatusCode.RESOURCE_EXHAUSTED, "RESOLUTIONS_BUSY"),
    # Who calls (llmgw.authz, the fleet's rules too): the same reasons as the fleet's.
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED"),
    (RoleRequired, grpc.StatusCode.PERMISSION_DENIED, "ROLE_REQUIRED"),
    (errors.PlannerError, grpc.StatusCode.FAILED_PRECONDITION, "REFUSED"),
    (errors.EngineError, grpc.StatusCode.FAILED_PRECONDITION, "REFUSED"),
)

# The request field each refusal is about, for google.rpc.BadRequest.
_FIELDS: dict[type[Refusal], str] = {
    errors.ContextOverTrained: "tokens",
    errors.HeadsNotDivisible: "gpus",
    errors.UnknownEngine: "model.profiles.engine",
    errors.InvalidShape: "model.source",
}


def code_and_reason(exc: Refusal) -> tuple[grpc.StatusCode, str]:
    """The status code and ErrorInfo reason of a planner exception."""
    for cls, code, reason in _TABLE:
        if isinstance(exc, cls):
            if reason is None and isinstance(exc, errors.InvalidValue):
                return code, exc.reason
            return code, reason or "REFUSED"
    return grpc.StatusCode.INTERNAL, "INTERNAL"


def to_status(exc: Refusal) -> status_pb2.Status:
    """A google.rpc.Status with ErrorInfo and, where they fit, BadRequest,
    PreconditionFailure or ResourceInfo."""
    code, reason = code_and_reason(exc)
    field = exc.field if isinstance(exc, errors.InvalidValue) else _FIELDS.get(type(exc), "")
    resource = (
        ("llmgw.common.v1.Profile", exc.profile)
        if isinstance(exc, errors.ProfileNotFound)
        else None
    )
    return build_status(
        code,
        reason,
        DOMAIN,
        exc.message,
        exc.metadata(),
        field=field,
        subject=_subject(exc),
        resource=resource,
    )


def _subject(exc: Refusal) -> str:
    """What a precondition failure is about: the profile, or the source."""
    for attr in ("profile", "source"):
        value = getattr(exc, attr, "")
        if isinstance(value, str) and value:
            return value
    return ""


def _status_of(exc: Exception) -> status_pb2.Status | None:
    planner = (
        errors.PlannerError,
        errors.EngineError,
        errors.InvalidValue,
        errors.InvalidShape,
        AccessRefusal,
    )
    return to_status(exc) if isinstance(exc, planner) else None


refusals_as_status = guarded(_status_of)
"""Applies the table to a servicer method: planner exceptions become their status with
details; anything else is logged with its traceback and answered INTERNAL."""


_ROOTS: tuple[type[Refusal], ...] = (
    errors.PlannerError,
    errors.EngineError,
    errors.InvalidValue,
    errors.InvalidShape,
)


def example_statuses() -> list[status_pb2.Status]:
    """One status for every class the table answers (each refusal class loaded, built with
    its defaults): the reasons, codes and metadata keys docs/errors.md must list. REFUSED is
    among them only for the roots, which nothing raises as such."""
    out = [to_status(Unauthenticated("example")), to_status(RoleRequired("example"))]
    for root in _ROOTS:
        for cls in subclasses(root):
            out.append(to_status(cls("example")))
    return out
