"""Where a plan runs: on the event loop when a plan like it was seen to be cheap, else on the
planning thread.

Handing a plan to the worker thread and back (a future chained across threads, the loop's
self-pipe woken, the GIL passed twice) costs more CPU than a small plan itself: a sizing of a
cached shape takes about 100 µs, the hop about 170 µs more. A plan is run on the loop only when
the last plan of the same request sub-messages (the very same decoded model, shape and
inventory values, and the same small numbers beside them) took less than INLINE_PLAN_S of
CPU; every plan's CPU is measured where it ran, so a plan that grew past the budget goes back
to the thread on its next call. A plan never seen before, or of a message too large to keep
(`decoded.KEPT_MESSAGE_BYTES`), always runs on the thread. The answer is the same either way:
only the thread it is computed on changes.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")

INLINE_PLAN_S = 0.0005
"""A plan whose like last took less CPU than this (500 µs, a few health checks' worth) runs
on the event loop."""

KEPT_COSTS = 256
"""Plans whose cost is remembered, at most (the least recently used go first)."""


class PlanCosts:
    """A bounded memory of what plans cost, keyed by the identities of the values they read.

    An entry holds those values, so an identity in its key cannot be reused by another object
    while the entry lives (as the answer memory holds its shape)."""

    def __init__(self, budget_s: float = INLINE_PLAN_S, limit: int = KEPT_COSTS) -> None:
        self._budget_s = budget_s
        self._limit = limit
        self._kept: OrderedDict[tuple[Hashable, ...], tuple[float, tuple[object, ...]]] = (
            OrderedDict()
        )

    def __len__(self) -> int:
        """How many plans' costs are remembered."""
        return len(self._kept)

    @staticmethod
    def key(values: tuple[object, ...], extras: tuple[Hashable, ...]) -> tuple[Hashable, ...]:
        """The key of a plan reading `values` (by identity) and `extras` (by value)."""
        return (*(id(v) for v in values), *extras)

    def cheap(self, key: tuple[Hashable, ...] | None) -> bool:
        """Whether the last plan under `key` took less than the budget."""
        if key is None:
            return False
        seen = self._kept.get(key)
        if seen is None:
            return False
        self._kept.move_to_end(key)
        return seen[0] < self._budget_s

    def note(
        self, key: tuple[Hashable, ...] | None, cpu_s: float, values: tuple[object, ...]
    ) -> None:
        """Remember that the plan under `key` (reading `values`) took `cpu_s`."""
        if key is None:
            return
        self._kept[key] = (cpu_s, values)
        self._kept.move_to_end(key)
        while len(self._kept) > self._limit:
            self._kept.popitem(last=False)


def timed(plan: Callable[[], T], spent: list[float]) -> Callable[[], T]:
    """`plan`, appending the CPU its thread spent on it to `spent` (raised or not)."""

    def run() -> T:
        start = time.thread_time()
        try:
            return plan()
        finally:
            spent.append(time.thread_time() - start)

    return run
