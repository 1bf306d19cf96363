"""The planner's memory of answers is bounded in bytes as well as entries, and the limits
that set it are read from the environment."""

from __future__ import annotations

import pytest

from llmgw.common.v1 import common_pb2
from llmgw.limits import Limits
from llmgw.planner.v1 import planner_pb2
from planner_svc.rpc.servicer import ENTRY_OVERHEAD_BYTES, _Answers, _memo_key


def answer(args_bytes: int) -> planner_pb2.SizeContextResponse:
    """An answer of about `args_bytes` serialized bytes."""
    return planner_pb2.SizeContextResponse(
        profiles=[common_pb2.Profile(name="p", args=["x" * args_bytes])]
    )


def key(i: int) -> tuple[str, bytes, int]:
    """The memo key of the i-th distinct request (inline shape: nothing resolved)."""
    key = _memo_key(planner_pb2.SizeContextRequest(tokens=256 + i), None)
    assert key is not None
    return key


def test_answers_past_the_byte_bound_push_the_oldest_out() -> None:
    """Ten answers of ~100 KB under a 350 KB bound: the three newest are kept, the bytes held
    stay under the bound, and a kept answer reads back whole."""
    answers = _Answers(limit=1024, limit_bytes=350_000)
    for i in range(10):
        answers.put(key(i), answer(100_000), None)
        assert answers.held_bytes <= 350_000
    assert len(answers) == 3
    assert answers.get(key(0), planner_pb2.SizeContextResponse) is None
    kept = answers.get(key(9), planner_pb2.SizeContextResponse)
    assert kept is not None and len(kept.profiles[0].args[0]) == 100_000


def test_an_answer_larger_than_the_whole_bound_is_not_kept() -> None:
    """An answer bigger than the bound is answered but not remembered (and pushes nothing
    out)."""
    answers = _Answers(limit=1024, limit_bytes=50_000)
    answers.put(key(1), answer(10), None)
    answers.put(key(2), answer(60_000), None)
    assert answers.get(key(2), planner_pb2.SizeContextResponse) is None
    assert answers.get(key(1), planner_pb2.SizeContextResponse) is not None
    assert (
        answers.held_bytes
        == len(answer(10).SerializeToString())
        + 32
        + len("SizeContextRequest")
        + ENTRY_OVERHEAD_BYTES
    )


def test_a_4_mib_request_keeps_a_32_byte_key() -> None:
    """The memo key holds the request's digest, not the request."""
    big = planner_pb2.SizeContextRequest(
        model=common_pb2.Model(
            name="m", profiles=[common_pb2.Profile(name="p", args=["y" * (4 << 20)])]
        )
    )
    memo = _memo_key(big, None)
    assert memo is not None and len(memo[1]) == 32


def test_many_small_answers_are_bounded_by_entries() -> None:
    """Small answers stop at the entry limit."""
    answers = _Answers(limit=5, limit_bytes=1 << 30)
    for i in range(20):
        answers.put(key(i), answer(1), None)
    assert len(answers) == 5


def test_limits_come_from_the_environment_and_refuse_nonsense() -> None:
    """LLMGW_* variables set the limits; the rest keep their defaults; a value that is not a
    positive whole number is refused, naming the variable."""
    limits = Limits.from_env({"LLMGW_MAX_PROFILES": "8", "LLMGW_ANSWER_CACHE_BYTES": " 1024 "})
    assert (limits.max_profiles, limits.answer_cache_bytes) == (8, 1024)
    assert limits.max_args == Limits().max_args
    for bad in ("0", "-3", "lots", "1.5"):
        with pytest.raises(ValueError, match="LLMGW_MAX_MESSAGE_BYTES"):
            Limits.from_env({"LLMGW_MAX_MESSAGE_BYTES": bad})
