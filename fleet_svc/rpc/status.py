"""The one table from fleet exceptions to gRPC status codes and reasons."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc
import structlog
from google.rpc import status_pb2
from grpc_status import rpc_status

from fleet_svc.domain import errors
from fleet_svc.store.base import NotLeader, StoreDamaged, StoreError, StoreUnavailable
from fleet_svc.watch import WATCHER_QUEUE, WatcherTooSlow
from llmgw.refusal import Refusal
from llmgw.rpc.status import INTERNAL, build_status, guarded, subclasses

log = structlog.get_logger(__name__)

DOMAIN = "fleet.llmgw.dev"
"""`ErrorInfo.domain` of every fleet error."""

# class -> (code, reason); never UNAVAILABLE for a refusal (meshes retry that code).
_TABLE: tuple[tuple[type[Refusal], grpc.StatusCode, str], ...] = (
    (errors.ModelNotFound, grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND"),
    (errors.ModelExists, grpc.StatusCode.ALREADY_EXISTS, "MODEL_EXISTS"),
    (errors.ModelDeclared, grpc.StatusCode.FAILED_PRECONDITION, "MODEL_DECLARED"),
    (errors.StaleRevision, grpc.StatusCode.ABORTED, "STALE_REVISION"),
    (errors.InvalidSource, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SOURCE"),
    (errors.ModelTooLarge, grpc.StatusCode.INVALID_ARGUMENT, "LIMIT_EXCEEDED"),
    (errors.UnknownEngine, grpc.StatusCode.INVALID_ARGUMENT, "UNKNOWN_ENGINE"),
    (errors.InvalidModel, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_MODEL"),
    (errors.RequestIdReused, grpc.StatusCode.ALREADY_EXISTS, "REQUEST_ID_REUSED"),
    (errors.RolloutInProgress, grpc.StatusCode.ABORTED, "ROLLOUT_IN_PROGRESS"),
    (errors.NoRoomBeside, grpc.StatusCode.FAILED_PRECONDITION, "NO_ROOM_BESIDE"),
    (errors.NoRoomInPlace, grpc.StatusCode.FAILED_PRECONDITION, "NO_ROOM_IN_PLACE"),
    (errors.PlanNotChecked, grpc.StatusCode.FAILED_PRECONDITION, "PLAN_NOT_CHECKED"),
    (errors.RolloutNotFound, grpc.StatusCode.NOT_FOUND, "ROLLOUT_NOT_FOUND"),
    (errors.CannotUndo, grpc.StatusCode.FAILED_PRECONDITION, "CANNOT_UNDO"),
    (errors.NotCanary, grpc.StatusCode.FAILED_PRECONDITION, "NOT_CANARY"),
    # Never a call's answer: the reason in a failed canary's Rollout.failure.
    (errors.CanaryAnalysisFailed, grpc.StatusCode.FAILED_PRECONDITION, "CANARY_ANALYSIS_FAILED"),
    (errors.InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_REQUEST"),
    (errors.NoHello, grpc.StatusCode.INVALID_ARGUMENT, "NO_HELLO"),
    (errors.StreamReplaced, grpc.StatusCode.ABORTED, "STREAM_REPLACED"),
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED"),
    (errors.TooManyCalls, grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_CALLS"),
    (errors.RoleRequired, grpc.StatusCode.PERMISSION_DENIED, "ROLE_REQUIRED"),
    (errors.NodeIdentityMismatch, grpc.StatusCode.PERMISSION_DENIED, "NODE_IDENTITY_MISMATCH"),
    # The planner being down is not a refusal: nothing changed and a retry may succeed.
    (errors.PlannerUnavailable, grpc.StatusCode.UNAVAILABLE, "PLANNER_UNAVAILABLE"),
    # The planner failing (not refusing): the fleet's own INTERNAL, with its reason, never the
    # planner's status passed on as if it were a refusal.
    (errors.PlannerFailed, grpc.StatusCode.INTERNAL, "PLANNER_FAILED"),
    (errors.FleetError, grpc.StatusCode.FAILED_PRECONDITION, "REFUSED"),
)


def code_and_reason(exc: Refusal) -> tuple[grpc.StatusCode, str]:
    """The status code and ErrorInfo reason of a fleet exception."""
    for cls, code, reason in _TABLE:
        if isinstance(exc, cls):
            return code, reason
    return grpc.StatusCode.INTERNAL, "INTERNAL"


def to_status(exc: Refusal) -> status_pb2.Status:
    """A google.rpc.Status with ErrorInfo and the details that fit."""
    code, reason = code_and_reason(exc)
    name = getattr(exc, "name", "")
    return build_status(
        code,
        reason,
        DOMAIN,
        exc.message,
        exc.metadata(),
        field=exc.field if isinstance(exc, errors.InvalidModel | errors.InvalidRequest) else "",
        subject=name,
        resource=("llmgw.fleet.v1.CatalogModel", name)
        if isinstance(exc, errors.ModelNotFound | errors.ModelExists)
        else None,
    )


class PlannerRefused(Exception):
    """The planner refused a change: its status reaches the caller unchanged (only a refusal:
    `fleet_svc.rpc.planner` turns a planner failure into PlannerFailed)."""

    def __init__(self, status: status_pb2.Status) -> None:
        super().__init__(status.message)
        self.status = status


# The store failing under a call. Unreachable and not-the-leader are UNAVAILABLE: the call
# wrote nothing and a retry (later, or at the leader ErrorInfo names) may succeed. Damage is
# DATA_LOSS (grpc.io's status codes: "unrecoverable data loss or corruption"), never retried.
_STORE_TABLE: tuple[tuple[type[StoreError], grpc.StatusCode, str], ...] = (
    (NotLeader, grpc.StatusCode.UNAVAILABLE, "NOT_LEADER"),
    (StoreUnavailable, grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE"),
    (StoreDamaged, grpc.StatusCode.DATA_LOSS, "STORE_DAMAGED"),
)


def store_status(exc: StoreError) -> status_pb2.Status | None:
    """The status of a store failure (None for one the table does not name)."""
    for cls, code, reason in _STORE_TABLE:
        if isinstance(exc, cls):
            metadata = {"store": exc.where}
            delay = None
            if isinstance(exc, NotLeader):
                metadata.update(leader=exc.leader, leader_address=exc.leader_address)
                # Named, the leader answers now; during an election, in about a renewal.
                delay = 0.0 if exc.leader_address else None
            return build_status(code, reason, DOMAIN, str(exc), metadata, retry_delay_s=delay)
    return None


WATCHER_RETRY_S = 0.1
"""A watcher cut off may watch again at once: it resumes, or gets a snapshot."""
WATCHER_TOO_SLOW = "WATCHER_TOO_SLOW"
"""The reason a WatchReplicas stream is cut off with: it fell `watch.WATCHER_QUEUE` events
behind."""


def watcher_status(exc: WatcherTooSlow) -> status_pb2.Status:
    """A watcher cut off for falling behind: RESOURCE_EXHAUSTED (its queue is the resource),
    with the limit it passed; the gateway watches again and gets a fresh snapshot."""
    return build_status(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        WATCHER_TOO_SLOW,
        DOMAIN,
        str(exc),
        {"limit": "watcher_queue", "maximum": str(WATCHER_QUEUE)},
        retry_delay_s=WATCHER_RETRY_S,
    )


def _status_of(exc: Exception) -> status_pb2.Status | None:
    if isinstance(exc, WatcherTooSlow):
        return watcher_status(exc)
    if isinstance(exc, PlannerRefused):
        return exc.status
    if isinstance(exc, StoreError):
        return store_status(exc)
    return to_status(exc) if isinstance(exc, errors.FleetError | errors.AccessRefusal) else None


refusals_as_status = guarded(_status_of)
"""Applies the table to a unary servicer method."""


S = TypeVar("S")
Q = TypeVar("Q")
R = TypeVar("R")
StreamMethod = Callable[[S, Q, "grpc.aio.ServicerContext[Any, Any]"], AsyncIterator[R]]


def stream_refusals_as_status(method: StreamMethod[S, Q, R]) -> StreamMethod[S, Q, R]:
    """Applies the table to a server-streaming method: a refusal raised before or between
    messages ends the stream with its status, as a unary method's would; an unknown exception
    is logged and ends it INTERNAL. A status the method set itself (context.abort) stands."""

    @functools.wraps(method)
    async def wrapper(
        self: S, request: Q, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[R]:
        try:
            async for message in method(self, request, context):
                yield message
            return
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            status = _status_of(exc)
            if status is None:
                log.exception("request_failed", method=method.__name__)
                status = INTERNAL
            else:
                log.info("request_refused", method=method.__name__, message=status.message)
        await context.abort_with_status(rpc_status.to_status(status))

    return wrapper


def example_statuses() -> list[status_pb2.Status]:
    """One status for every class the tables answer (each fleet refusal built with its
    defaults, each store failure, a watcher cut off): the reasons, codes and metadata keys
    docs/errors.md must list. REFUSED is among them only for the root, FleetError, which
    nothing raises as such."""
    classes: list[type[Refusal]] = [*subclasses(errors.FleetError)]
    classes += [errors.Unauthenticated, errors.RoleRequired]
    out = [to_status(cls("example")) for cls in classes]
    for failure in (
        StoreUnavailable("data/fleet.db", "example"),
        StoreDamaged("data/fleet.db", "example"),
        NotLeader("db", 1, leader_epoch=2, leader="fleet-b", leader_address="10.0.0.2:50052"),
    ):
        status = store_status(failure)
        assert status is not None
        out.append(status)
    out.append(watcher_status(WatcherTooSlow("example")))
    return out
