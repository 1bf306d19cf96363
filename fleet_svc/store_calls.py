"""Store calls made from the fleet's event loop, run where they cannot block it.

A store whose calls may come from any thread (PostgreSQL: each is a round trip to a server)
is called on a bounded pool of threads (fewer than its connections), so a slow server
holds threads and not the loop: health checks, agents' streams and watches go on meanwhile. A
store bound to its opener's thread (SQLite: a local file, each call microseconds) is called on
the loop as before.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from fleet_svc.store.base import Store

P = ParamSpec("P")
R = TypeVar("R")

STORE_THREADS = 4
"""Threads for the API's store calls: half of PostgresStore's connections (postgres_link's
POOL_MAX), so the loop and the probes always find one free."""


class StoreCalls:
    """Runs a function of store calls off the loop when the store allows it."""

    def __init__(
        self, store: Store, *, workers: int = STORE_THREADS, name: str = "fleet-store"
    ) -> None:
        self._pool = (
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
            if store.thread_safe
            else None
        )

    @property
    def off_loop(self) -> bool:
        """Whether calls run on threads (the store is thread-safe)."""
        return self._pool is not None

    async def run(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """`fn(*args, **kwargs)` on a pool thread (with the caller's context variables), or
        on the loop for a store bound to it."""
        if self._pool is None:
            return fn(*args, **kwargs)
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def close(self) -> None:
        """Let the threads go once their calls end."""
        if self._pool is not None:
            self._pool.shutdown(wait=False)


def inline(step: Coroutine[Any, Any, R]) -> R:
    """The result of a coroutine whose store calls all run on the loop (a StoreCalls over a
    store bound to its thread never suspends it), got without a loop: for code and tests that
    drive the controller by hand over SQLite.

    Raises:
        RuntimeError: the coroutine suspended (its store is called off the loop: await it).
    """
    try:
        step.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    step.close()
    raise RuntimeError("a store called off the loop: await the coroutine instead")
