"""The clock every process injects: monotonic time for durations (drains, heartbeats, timeouts),
wall time for what people read and what outlives the process, and sleeping; a test drives the
code under it with llmgw.testing.clock.FakeClock."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic time for intervals, wall time for reports, and sleeping."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch, for timestamps people read."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait that long."""
        ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        """time.monotonic()."""
        return time.monotonic()

    def wall(self) -> float:
        """time.time()."""
        return time.time()

    async def sleep(self, seconds: float) -> None:
        """asyncio.sleep()."""
        await asyncio.sleep(max(0.0, seconds))
