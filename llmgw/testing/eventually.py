"""Waiting for a condition to hold: polling a check, as a test of convergence needs."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")


@overload
async def assert_eventually(
    check: Callable[[], Awaitable[T | None]],
    *,
    timeout_s: float = ...,
    every_s: float = ...,
    what: str = ...,
) -> T: ...


@overload
async def assert_eventually(
    check: Callable[[], T | None],
    *,
    timeout_s: float = ...,
    every_s: float = ...,
    what: str = ...,
) -> T: ...


async def assert_eventually(
    check: Callable[[], object],
    *,
    timeout_s: float = 10.0,
    every_s: float = 0.05,
    what: str = "the condition",
) -> object:
    """Poll `check` (a function, or a coroutine function) until it returns something truthy.

    Args:
        check: what to poll; its first truthy value is returned.
        timeout_s: how long to poll.
        every_s: the pause between two checks.
        what: the condition in words, for the failure message.
    Returns:
        The check's first truthy value.
    Raises:
        AssertionError: it did not hold within `timeout_s`, or an awaited check hung that long.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = check()
        if inspect.isawaitable(value):
            # A check that hangs (an RPC with no answer) fails here, not at the test timeout.
            left = max(deadline - loop.time(), 0.5)
            try:
                value = await asyncio.wait_for(value, left)
            except TimeoutError:
                raise AssertionError(f"checking {what} hung for {left:.1f} s") from None
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout_s} s")
        await asyncio.sleep(every_s)
