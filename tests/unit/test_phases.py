"""The replica phase table: which phase may follow which, and what counts as running."""

from __future__ import annotations

import itertools

import pytest

from fleet_svc.domain.phases import (
    HOLDS_CARDS,
    RUNNING,
    TRANSITIONS,
    IllegalTransition,
    ReplicaPhase,
    check_transition,
)

P = ReplicaPhase


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (P.PENDING, P.STARTING),  # placed
        (P.STARTING, P.READY),  # healthy
        (P.READY, P.DRAINING),  # retired: out of routing first
        (P.DRAINING, P.STOPPING),  # the drain delay passed
        (P.STOPPING, P.STOPPED),  # its process is gone
        (P.READY, P.CRASHED),  # its engine exited
        (P.CRASHED, P.READY),  # the agent restarted it
        (P.CRASHED, P.FAILED),  # past the restart limit
        (P.STARTING, P.LOST),  # its node was lost
        (P.LOST, P.READY),  # its node came back with it running
        (P.PENDING, P.STOPPED),  # retired before it was placed
        (P.FAILED, P.STOPPED),  # a failed replica is dropped
    ],
)
def test_a_replica_follows_its_engine_s_life(current: ReplicaPhase, new: ReplicaPhase) -> None:
    """The moves a replica makes in its life are allowed, and are changes."""
    assert check_transition(current, new) is True


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (P.PENDING, P.READY),  # never placed, so nothing can answer health checks
        (P.READY, P.STARTING),  # a running replica is not started again in place
        (P.DRAINING, P.READY),  # once out of routing, never back in
        (P.STOPPING, P.READY),
        (P.STOPPED, P.STARTING),  # stopped is the end: a new replica replaces it
        (P.FAILED, P.READY),  # failed stays failed until replaced
        (P.PENDING, P.LOST),  # nowhere to be lost from
    ],
)
def test_moves_the_table_forbids_are_refused(current: ReplicaPhase, new: ReplicaPhase) -> None:
    """A move the table does not list raises, naming both phases."""
    with pytest.raises(IllegalTransition, match=f"from {current.value} to {new.value}"):
        check_transition(current, new)


@pytest.mark.parametrize("phase", list(P))
def test_staying_in_a_phase_is_no_change(phase: ReplicaPhase) -> None:
    """The same phase again is allowed and changes nothing (nothing is logged or saved)."""
    assert check_transition(phase, phase) is False


@pytest.mark.parametrize("phase", [p for p in P if p is not P.STOPPED])
def test_every_replica_can_end_stopped(phase: ReplicaPhase) -> None:
    """Whatever its phase, a replica can be found stopped (and STOPPED leads nowhere)."""
    assert check_transition(phase, P.STOPPED) is True
    assert TRANSITIONS[P.STOPPED] == frozenset()


def test_the_table_agrees_with_check_transition_everywhere() -> None:
    """For every pair of phases, check_transition allows exactly what the table lists."""
    for current, new in itertools.product(P, P):
        if current is new:
            continue
        if new in TRANSITIONS[current]:
            assert check_transition(current, new)
        else:
            with pytest.raises(IllegalTransition):
                check_transition(current, new)


def test_a_running_replica_holds_its_cards() -> None:
    """Every phase a node is told to run a replica in keeps its cards taken, and so does
    STOPPING (its process may not be gone); pending, stopped, failed and lost ones hold none."""
    assert RUNNING <= HOLDS_CARDS
    only_holding = HOLDS_CARDS - RUNNING
    assert only_holding == {P.STOPPING}
    assert not HOLDS_CARDS & {P.PENDING, P.STOPPED, P.FAILED, P.LOST}
