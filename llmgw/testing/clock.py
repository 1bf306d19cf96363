"""A fake clock for tests: monotonic and wall time that move only when the test moves them, and
a sleep that moves them instead of waiting. It has the shape of the fleet's and the agent's
clocks (`monotonic()`, `wall()`, `sleep()`), so code that measures durations is driven without
real timers."""

from __future__ import annotations

import asyncio

DEFAULT_WALL_S = 1_764_000_000.0
"""Where the wall clock starts by default (2025-11-24, a plausible 'now')."""


class FakeClock:
    """Time that stands still until `advance` (or `sleep`) moves it.

    The monotonic and the wall reading move together; `set_wall` moves the wall alone (an NTP
    step), which code measuring durations on the monotonic clock must not notice.
    """

    def __init__(self, monotonic_s: float = 1000.0, wall_s: float = DEFAULT_WALL_S) -> None:
        self._monotonic_s = monotonic_s
        self._wall_s = wall_s
        self.slept: list[float] = []
        """Every duration `sleep` was asked for, in order."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""
        return self._monotonic_s

    def wall(self) -> float:
        """Seconds since the epoch."""
        return self._wall_s

    def advance(self, seconds: float) -> None:
        """Move both readings on by `seconds`.

        Raises:
            ValueError: `seconds` is negative (a monotonic clock does not go back).
        """
        if seconds < 0:
            raise ValueError(f"a monotonic clock does not go back ({seconds} s)")
        self._monotonic_s += seconds
        self._wall_s += seconds

    def set_wall(self, wall_s: float) -> None:
        """Step the wall clock to `wall_s`, leaving the monotonic one where it is."""
        self._wall_s = wall_s

    async def sleep(self, seconds: float) -> None:
        """Move time on by `seconds` (negative counts as 0) and let other tasks run once."""
        seconds = max(0.0, seconds)
        self.slept.append(seconds)
        self.advance(seconds)
        await asyncio.sleep(0)
