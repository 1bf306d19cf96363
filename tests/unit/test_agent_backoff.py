"""Backoff delays and the restart limit."""

from __future__ import annotations

import pytest

from fleet_svc.agent.backoff import Backoff, RestartLimit, recent_crashes


@pytest.mark.parametrize(
    ("attempt", "delay_s"),
    [(0, 1.0), (1, 2.0), (2, 4.0), (5, 32.0), (6, 60.0), (100, 60.0), (10_000, 60.0), (-3, 1.0)],
)
def test_delay_doubles_up_to_the_cap(attempt: int, delay_s: float) -> None:
    """The n-th retry waits base * factor**n, never past the cap (nor overflowing)."""
    backoff = Backoff(base_s=1.0, factor=2.0, cap_s=60.0, jitter=0.0)
    assert backoff.delay_s(attempt) == delay_s


@pytest.mark.parametrize(("rand", "delay_s"), [(0.0, 8.0), (0.5, 7.2), (0.999, 6.4016), (7.0, 6.4)])
def test_jitter_takes_away_at_most_its_fraction(rand: float, delay_s: float) -> None:
    """Jitter shortens a delay by up to its fraction, by the random number given."""
    backoff = Backoff(base_s=1.0, factor=2.0, cap_s=60.0, jitter=0.2)
    assert backoff.delay_s(3, rand) == pytest.approx(delay_s)


@pytest.mark.parametrize(
    "kwargs",
    [{"base_s": -1.0}, {"cap_s": -1.0}, {"factor": 0.5}, {"jitter": 1.5}, {"jitter": -0.1}],
)
def test_nonsense_settings_are_refused(kwargs: dict[str, float]) -> None:
    """Negative times, a shrinking factor and a jitter outside 0..1 are refused."""
    with pytest.raises(ValueError):
        Backoff(**kwargs)


@pytest.mark.parametrize(
    ("crashes", "now_s", "exceeded"),
    [
        ([], 100.0, False),
        ([10.0, 20.0], 30.0, False),
        ([10.0, 20.0, 30.0], 30.0, True),
        ([10.0, 20.0, 30.0], 75.0, False),  # the first crash left the 60 s window
        ([10.0, 20.0, 30.0, 70.0], 75.0, True),
    ],
)
def test_restart_limit_counts_crashes_in_the_window(
    crashes: list[float], now_s: float, exceeded: bool
) -> None:
    """The limit is reached by max_crashes crashes within the window ending now."""
    assert RestartLimit(max_crashes=3, window_s=60.0).exceeded(crashes, now_s) is exceeded


def test_recent_crashes_forgets_old_ones() -> None:
    """Crashes older than the window are dropped, the rest kept in order."""
    assert recent_crashes([50.0, 5.0, 30.0], 60.0, 40.0) == [30.0, 50.0]
