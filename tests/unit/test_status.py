"""The error table: every refusal has the code and reason DESIGN §3 gives it, and details."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2

from llmgw.refusal import Refusal
from planner_svc.domain import errors
from planner_svc.rpc.status import code_and_reason, to_status

CASES: list[tuple[Refusal, grpc.StatusCode, str]] = [
    (errors.ContextTooShort("m", tokens=3), grpc.StatusCode.INVALID_ARGUMENT, "CONTEXT_TOO_SHORT"),
    (errors.SlotsOutOfRange("m", slots=99), grpc.StatusCode.INVALID_ARGUMENT, "SLOTS_OUT_OF_RANGE"),
    (
        errors.ContextOverTrained("m", tokens=9, trained=8),
        grpc.StatusCode.INVALID_ARGUMENT,
        "CONTEXT_OVER_TRAINED",
    ),
    (errors.EngineNoContext("m"), grpc.StatusCode.FAILED_PRECONDITION, "ENGINE_NO_CONTEXT"),
    (errors.CardsTooSmall("m"), grpc.StatusCode.FAILED_PRECONDITION, "CARDS_TOO_SMALL"),
    (
        errors.GPUCountUnavailable("m"),
        grpc.StatusCode.FAILED_PRECONDITION,
        "GPU_COUNT_UNAVAILABLE",
    ),
    (errors.HeadsNotDivisible("m"), grpc.StatusCode.INVALID_ARGUMENT, "HEADS_NOT_DIVISIBLE"),
    (errors.EngineSingleCard("m"), grpc.StatusCode.FAILED_PRECONDITION, "ENGINE_SINGLE_CARD"),
    (errors.InvalidShape("m"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_SHAPE"),
    (errors.UnknownEngine("m"), grpc.StatusCode.INVALID_ARGUMENT, "UNKNOWN_ENGINE"),
    (errors.ProfileNotFound("m"), grpc.StatusCode.NOT_FOUND, "PROFILE_NOT_FOUND"),
    (errors.SourceUnreachable("m"), grpc.StatusCode.FAILED_PRECONDITION, "SOURCE_UNREACHABLE"),
    (
        errors.InvalidRequest("m", field="gpus", reason="GPU_COUNT_OUT_OF_RANGE"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "GPU_COUNT_OUT_OF_RANGE",
    ),
]


@pytest.mark.parametrize(("exc", "code", "reason"), CASES)
def test_each_refusal_has_its_code_and_reason(
    exc: Refusal, code: grpc.StatusCode, reason: str
) -> None:
    """Each refusal maps to its canonical code and stable reason, never UNAVAILABLE."""
    assert code_and_reason(exc) == (code, reason)
    assert code is not grpc.StatusCode.UNAVAILABLE


def test_cards_too_small_carries_numbers_as_strings() -> None:
    """CARDS_TOO_SMALL's ErrorInfo has need, budget, cards, longest context and fewest cards."""
    exc = errors.CardsTooSmall(
        "too big",
        profile="gpu",
        need_bytes=10,
        budget_bytes=5,
        cards=1,
        longest_context_tokens=4096,
        fewest_cards=2,
    )
    status = to_status(exc)
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert info.reason == "CARDS_TOO_SMALL"
    assert dict(info.metadata) == {
        "profile": "gpu",
        "need_bytes": "10",
        "budget_bytes": "5",
        "cards": "1",
        "longest_context_tokens": "4096",
        "fewest_cards": "2",
    }
    failure = error_details_pb2.PreconditionFailure()
    assert status.details[1].Unpack(failure)
    assert failure.violations[0].subject == "gpu"


def test_bad_field_carries_a_bad_request() -> None:
    """An out-of-range field is named in a BadRequest field violation."""
    status = to_status(errors.SlotsOutOfRange("slots 1..64", slots=99))
    bad = error_details_pb2.BadRequest()
    assert status.details[1].Unpack(bad)
    assert bad.field_violations[0].field == "slots"
    assert status.message == "slots 1..64"
