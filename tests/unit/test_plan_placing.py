"""Where the planner runs a plan: on the event loop only once a plan like it was seen to be
cheap, back on the planning thread when it grows past the budget; the memory stays bounded."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from llmgw.common.v1 import common_pb2
from llmgw.planner.v1 import planner_pb2
from llmgw.shape import ModelShape
from planner_svc.rpc.decoded import KEPT_MESSAGE_BYTES
from planner_svc.rpc.placing import INLINE_PLAN_S, PlanCosts
from planner_svc.rpc.servicer import PlannerServicer


class _NoResolver:
    async def resolve(
        self, source: str, files: Any = (), *, caller: str | Callable[[], str] = ""
    ) -> ModelShape:
        raise AssertionError("no source is resolved here")


def _spin(seconds: float) -> None:
    """Burn `seconds` of this thread's CPU."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_plan_runs_on_the_thread_until_one_like_it_was_cheap_and_goes_back_when_not() -> None:
    """The first plan of a key runs on the planning thread; after a cheap one the next runs on
    the loop; one that took past the budget sends the next back to the thread."""

    async def scenario() -> list[str]:
        servicer = PlannerServicer(_NoResolver())
        values = (object(), object())
        like = PlanCosts.key(values, ("SizeContextRequest", 0))
        where: list[str] = []
        cost = [0.0]

        def plan() -> int:
            where.append(threading.current_thread().name)
            _spin(cost[0])
            return 7

        assert await servicer._planned(plan, like, values) == 7
        assert await servicer._planned(plan, like, values) == 7
        cost[0] = INLINE_PLAN_S * 3
        await servicer._planned(plan, like, values)  # inline still: the last one was cheap
        await servicer._planned(plan, like, values)  # back on the thread
        await servicer._planned(plan, None, ())  # no key: always the thread
        return where

    where = asyncio.run(scenario())
    loop_thread = threading.current_thread().name
    assert [name == loop_thread for name in where] == [False, True, True, False, False]
    assert all(name.startswith("planning") for i, name in enumerate(where) if i in (0, 3, 4))


def test_a_refusal_raised_inline_is_raised_to_the_caller_and_still_timed() -> None:
    """A plan that raises on the loop raises the same to the caller, and its cost is noted."""

    async def scenario() -> int:
        servicer = PlannerServicer(_NoResolver())
        values = (object(),)
        like = PlanCosts.key(values, ())

        def refuse() -> int:
            raise ValueError("refused")

        for _ in range(2):  # thread, then loop
            with pytest.raises(ValueError, match="refused"):
                await servicer._planned(refuse, like, values)
        return len(servicer._costs)

    assert asyncio.run(scenario()) == 1


def test_the_costs_kept_are_bounded_and_large_messages_get_no_key() -> None:
    """Past the limit the least recently used cost goes; a request whose model message is too
    large to be kept decoded has no key (its plan always runs on the thread)."""
    costs = PlanCosts(limit=3)
    held = [object() for _ in range(5)]
    for value in held:
        costs.note(PlanCosts.key((value,), ()), 0.0, (value,))
    assert len(costs) == 3
    assert not costs.cheap(PlanCosts.key((held[0],), ()))
    assert costs.cheap(PlanCosts.key((held[4],), ()))
    servicer = PlannerServicer(_NoResolver())
    small = planner_pb2.SizeContextRequest(model=common_pb2.Model(name="m"), tokens=4096)
    assert servicer._like(small, (), ()) is not None
    big = planner_pb2.SizeContextRequest(
        model=common_pb2.Model(name="m" * (KEPT_MESSAGE_BYTES + 1)), tokens=4096
    )
    assert servicer._like(big, (), ()) is None
