"""The fleet's error table applied to streams: a refusal raised inside a stream ends it with
the status a unary call would get; anything else ends it INTERNAL."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from fleet_svc.domain import errors
from fleet_svc.rpc.planner import _failed as planner_failure
from fleet_svc.rpc.status import (
    PlannerRefused,
    code_and_reason,
    store_status,
    stream_refusals_as_status,
)
from fleet_svc.store.base import NotLeader, StoreDamaged, StoreError, StoreUnavailable
from fleet_svc.watch import WATCHER_QUEUE, WatcherTooSlow
from llmgw.clients.errors import Refused


class Aborted(Exception):
    """What the fake context raises to end the stream, as grpc's does."""


class Context:
    """A fake servicer context that keeps the status a stream ended with."""

    def __init__(self) -> None:
        self.status: Any = None

    async def abort_with_status(self, status: Any) -> None:
        self.status = status
        raise Aborted


class Streams:
    """Stream methods that yield one message, then fail as told."""

    def __init__(self, failure: Exception) -> None:
        self.failure = failure

    @stream_refusals_as_status
    async def Watch(self, request: int, context: Any) -> AsyncIterator[int]:
        yield request
        raise self.failure


async def run(failure: Exception) -> tuple[list[int], Context]:
    """The messages a stream sent before it ended, and its context."""
    context = Context()
    got = []
    with pytest.raises(Aborted):
        async for msg in Streams(failure).Watch(7, cast(Any, context)):
            got.append(msg)
    return got, context


def reason_of(status: Any) -> str:
    """The ErrorInfo reason of an ended stream's status."""
    message = status_pb2.Status.FromString(
        dict(status.trailing_metadata)["grpc-status-details-bin"]
    )
    for detail in message.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return str(info.reason)
    return ""


async def test_a_refusal_in_a_stream_gets_the_table_s_status() -> None:
    """A rollout refused mid-stream ends the stream NOT_FOUND with its reason, after the
    messages already sent."""
    got, context = await run(errors.RolloutNotFound("no rollout 'ro-x'", rollout_id="ro-x"))
    assert got == [7]
    assert context.status.code is grpc.StatusCode.NOT_FOUND
    assert context.status.details == "no rollout 'ro-x'"
    assert reason_of(context.status) == "ROLLOUT_NOT_FOUND"


async def test_an_unknown_failure_in_a_stream_is_internal_with_a_generic_message() -> None:
    """A bug inside a stream is not shown to the caller: INTERNAL, a generic message."""
    _, context = await run(KeyError("secret detail"))
    assert context.status.code is grpc.StatusCode.INTERNAL
    assert "secret" not in context.status.details


@pytest.mark.parametrize(
    ("exc", "code", "reason"),
    [
        (errors.NoHello("x"), grpc.StatusCode.INVALID_ARGUMENT, "NO_HELLO"),
        (errors.StreamReplaced("x"), grpc.StatusCode.ABORTED, "STREAM_REPLACED"),
        (errors.RolloutInProgress("x"), grpc.StatusCode.ABORTED, "ROLLOUT_IN_PROGRESS"),
        (errors.PlannerUnavailable("x"), grpc.StatusCode.UNAVAILABLE, "PLANNER_UNAVAILABLE"),
    ],
)
def test_the_stream_refusals_are_in_the_table(
    exc: errors.FleetError, code: grpc.StatusCode, reason: str
) -> None:
    """The agent stream's refusals have their own code and reason in the one table."""
    assert code_and_reason(exc) == (code, reason)


def _info(status: status_pb2.Status) -> error_details_pb2.ErrorInfo:
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info
    raise AssertionError("no ErrorInfo in the status")


@pytest.mark.parametrize(
    ("failure", "code", "reason"),
    [
        (
            StoreUnavailable("db.sqlite", "disk full"),
            grpc.StatusCode.UNAVAILABLE,
            "STORE_UNAVAILABLE",
        ),
        (
            StoreDamaged("db.sqlite", "bad JSON", table="models", key="m"),
            grpc.StatusCode.DATA_LOSS,
            "STORE_DAMAGED",
        ),
        (
            NotLeader(
                "postgresql://h/db", 3, leader_epoch=4, leader="f2", leader_address="10.0.0.2:50052"
            ),
            grpc.StatusCode.UNAVAILABLE,
            "NOT_LEADER",
        ),
    ],
)
def test_a_store_failure_under_a_call_has_its_own_status(
    failure: Exception, code: grpc.StatusCode, reason: str
) -> None:
    """A store that is down, damaged or no longer led by this fleet answers UNAVAILABLE or
    DATA_LOSS with its reason and the store named, never INTERNAL; not-the-leader names the
    leader's address."""
    status = store_status(cast(StoreError, failure))
    assert status is not None
    assert status.code == code.value[0]
    info = _info(status)
    assert info.reason == reason
    assert info.metadata["store"] in ("db.sqlite", "postgresql://h/db")
    if reason == "NOT_LEADER":
        assert info.metadata["leader_address"] == "10.0.0.2:50052"


async def test_a_watcher_cut_off_ends_resource_exhausted_with_its_limit() -> None:
    """WatchReplicas' cut-off of a slow watcher goes through the table: RESOURCE_EXHAUSTED,
    reason WATCHER_TOO_SLOW, and the queue limit it passed in the metadata."""
    got, context = await run(WatcherTooSlow("the watcher fell behind and was cut off"))
    assert got == [7]
    assert context.status.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    message = status_pb2.Status.FromString(
        dict(context.status.trailing_metadata)["grpc-status-details-bin"]
    )
    info = _info(message)
    assert info.reason == "WATCHER_TOO_SLOW"
    assert dict(info.metadata) == {"limit": "watcher_queue", "maximum": str(WATCHER_QUEUE)}


def _refused(code: str, reason: str | None) -> Refused:
    status = status_pb2.Status(code=getattr(grpc.StatusCode, code).value[0], message="m")
    return Refused(reason=reason, message="m", metadata=None, code=code, status=status)


@pytest.mark.parametrize(
    ("code", "reason", "passed_on"),
    [
        ("FAILED_PRECONDITION", "CARDS_TOO_SMALL", True),
        ("INVALID_ARGUMENT", "MEMORY_OUT_OF_RANGE", True),
        ("NOT_FOUND", "PROFILE_NOT_FOUND", True),
        ("INTERNAL", None, False),
        ("UNKNOWN", None, False),
        ("INVALID_ARGUMENT", None, False),  # no ErrorInfo: not the planner's refusal
    ],
)
def test_only_a_planner_refusal_is_passed_on(
    code: str, reason: str | None, passed_on: bool
) -> None:
    """A planner refusal reaches the caller with its own status; a planner failure (INTERNAL,
    UNKNOWN, no ErrorInfo) becomes the fleet's INTERNAL PLANNER_FAILED naming the code."""
    failed = planner_failure(_refused(code, reason))
    if passed_on:
        assert isinstance(failed, PlannerRefused)
        assert failed.status.code == getattr(grpc.StatusCode, code).value[0]
        return
    assert isinstance(failed, errors.PlannerFailed)
    assert code_and_reason(failed) == (grpc.StatusCode.INTERNAL, "PLANNER_FAILED")
    assert failed.metadata() == {"planner_code": code}
