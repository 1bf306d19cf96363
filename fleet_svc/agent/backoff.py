"""Backoff: how long to wait before trying again, and when to stop trying."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with a cap and jitter.

    The n-th retry (n counts from 0) waits `min(cap_s, base_s * factor**n)`, then the jitter
    takes away up to that fraction of it at random so that many agents cut off at once by one
    fleet restart do not all come back in the same instant ("full jitter" would spread more but
    lets a retry come immediately, which hammers a fleet that is still starting).
    """

    base_s: float = 0.5
    factor: float = 2.0
    cap_s: float = 30.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.cap_s < 0:
            raise ValueError("backoff times must not be negative")
        if self.factor < 1:
            raise ValueError("backoff factor must be at least 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("backoff jitter is a fraction between 0 and 1")

    def delay_s(self, attempt: int, rand: float = 0.0) -> float:
        """Seconds to wait before retry number `attempt`.

        Args:
            attempt: how many retries came before this one (0 for the first).
            rand: a number in [0, 1) from the caller's random source (0 = no jitter), so this
                stays a pure function a test can pin.
        Returns:
            The delay, never above `cap_s` and never negative.
        """
        attempt = max(0, attempt)
        # Past ~64 doublings the float overflows; the cap has long been reached by then.
        raw = self.cap_s if attempt > 64 else self.base_s * self.factor**attempt
        capped = min(self.cap_s, raw)
        return max(0.0, capped * (1.0 - self.jitter * min(max(rand, 0.0), 1.0)))


@dataclass(frozen=True)
class RestartLimit:
    """Crashes tolerated within a sliding window before a replica is given up on (FAILED).

    An engine that crashes once a day is restarted for ever; one that crashes `max_crashes`
    times within `window_s` is broken (bad weights, bad args, a bad card) and restarting it
    only hides that from the fleet, which can place it elsewhere.
    """

    max_crashes: int = 5
    window_s: float = 300.0

    def exceeded(self, crash_times_s: Sequence[float], now_s: float) -> bool:
        """Whether the crashes at `crash_times_s` (clock seconds) within the window ending at
        `now_s` reach the limit."""
        recent = [t for t in crash_times_s if now_s - t <= self.window_s]
        return len(recent) >= self.max_crashes


def recent_crashes(crash_times_s: Sequence[float], now_s: float, window_s: float) -> list[float]:
    """The crash times still inside the window ending at `now_s`, oldest first: what a
    supervisor keeps so its memory of crashes does not grow for ever."""
    return sorted(t for t in crash_times_s if now_s - t <= window_s)
