"""Node liveness: a node's phase from its connection and the silence since its last heartbeat,
measured on the fake monotonic clock (no sleeps)."""

from __future__ import annotations

import pytest

from fleet_svc.domain.nodes import Liveness, NodePhase, NodeView, node_phase
from llmgw.testing.clock import FakeClock

LIVENESS = Liveness(interval_s=2.0, grace_heartbeats=3, lost_after_s=30.0)
"""Heartbeats every 2 s: NOT_READY after 6 s of silence, LOST after 30 s."""


@pytest.mark.parametrize(
    ("connected", "silent_s", "phase", "why"),
    [
        (True, 0.0, NodePhase.READY, ""),
        (True, 5.9, NodePhase.READY, ""),
        (True, 6.0, NodePhase.NOT_READY, "no heartbeat for 6.0 s"),
        (True, 29.9, NodePhase.NOT_READY, "no heartbeat for 29.9 s"),
        (True, 30.0, NodePhase.LOST, "not heard from for 30 s"),
        (False, 0.0, NodePhase.NOT_READY, "its agent is not connected"),
        (False, 12.0, NodePhase.NOT_READY, "its agent is not connected"),
        (False, 45.0, NodePhase.LOST, "not heard from for 45 s"),
    ],
)
def test_a_node_s_phase_follows_its_silence(
    connected: bool, silent_s: float, phase: NodePhase, why: str
) -> None:
    """READY while heard within the grace, NOT_READY past it or when disconnected, LOST once
    silent for the lost timeout whatever its connection; the reason says how long."""
    clock = FakeClock()
    view = NodeView(name="n1", connected=connected, last_heard_s=clock.monotonic())
    clock.advance(silent_s)
    assert node_phase(view, clock.monotonic(), LIVENESS) == (phase, why)


def test_a_heartbeat_brings_a_quiet_node_back() -> None:
    """A node NOT_READY for silence is READY again as soon as it is heard from."""
    clock = FakeClock()
    view = NodeView(name="n1", connected=True, last_heard_s=clock.monotonic())
    clock.advance(10.0)
    assert node_phase(view, clock.monotonic(), LIVENESS)[0] is NodePhase.NOT_READY
    view.last_heard_s = clock.monotonic()
    assert node_phase(view, clock.monotonic(), LIVENESS)[0] is NodePhase.READY


def test_the_grace_is_the_missed_heartbeats() -> None:
    """The grace period is the heartbeat interval times the heartbeats that may be missed."""
    assert Liveness(interval_s=0.2, grace_heartbeats=3).grace_s == pytest.approx(0.6)


def test_the_fake_clock_moves_only_when_told() -> None:
    """The fake clock stands still, moves both readings together, refuses to go back, and
    a wall step leaves the monotonic reading alone."""
    clock = FakeClock(monotonic_s=5.0, wall_s=100.0)
    assert (clock.monotonic(), clock.wall()) == (5.0, 100.0)
    clock.advance(2.5)
    assert (clock.monotonic(), clock.wall()) == (7.5, 102.5)
    clock.set_wall(50.0)
    assert (clock.monotonic(), clock.wall()) == (7.5, 50.0)
    with pytest.raises(ValueError, match="does not go back"):
        clock.advance(-1.0)


async def test_the_fake_clock_sleeps_by_moving() -> None:
    """sleep() returns at once, having moved the clock by the time asked (none for negative)."""
    clock = FakeClock(monotonic_s=0.0)
    await clock.sleep(3.0)
    await clock.sleep(-1.0)
    assert clock.monotonic() == 3.0
    assert clock.slept == [3.0, 0.0]
