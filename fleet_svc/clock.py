"""The fleet's clock: monotonic time for durations, wall time for what people read and what
outlives the process; injected, so the controller can be driven by a test's fake clock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic time for durations, wall time for timestamps."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (durations: drains, heartbeats, timeouts)."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch (timestamps shown and stored)."""
        ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        """time.monotonic()."""
        return time.monotonic()

    def wall(self) -> float:
        """time.time()."""
        return time.time()
