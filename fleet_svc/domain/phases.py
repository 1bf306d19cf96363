"""Replica phases and the one table of the transitions between them."""

from __future__ import annotations

import enum


class ReplicaPhase(enum.Enum):
    """Where a replica stands, as the fleet sees it."""

    PENDING = "PENDING"
    """Wanted and not placed on a node; `reason` says why."""
    STARTING = "STARTING"
    """Placed; its engine is starting and does not answer health checks yet."""
    READY = "READY"
    """Its engine answers health checks: the gateway may route to it."""
    DRAINING = "DRAINING"
    """Taken out of routing (the gateway was told) and still running, before it stops."""
    STOPPING = "STOPPING"
    """Asked to stop; its process is not gone or its cards are not free yet."""
    STOPPED = "STOPPED"
    """Gone, its cards free; the record is forgotten next."""
    CRASHED = "CRASHED"
    """Its engine exited or failed its health checks; the agent restarts it with backoff."""
    FAILED = "FAILED"
    """Will not run as it is: refused by the agent or crashing past the restart limit."""
    LOST = "LOST"
    """Its node was lost; a replacement is placed elsewhere."""


P = ReplicaPhase

# Which phase may follow which. A replica can always be asked to stop, and can always be
# found stopped or lost; the rest follows an engine's life.
TRANSITIONS: dict[ReplicaPhase, frozenset[ReplicaPhase]] = {
    P.PENDING: frozenset({P.STARTING, P.STOPPED, P.FAILED}),
    P.STARTING: frozenset({P.READY, P.CRASHED, P.FAILED, P.STOPPING, P.STOPPED, P.LOST}),
    P.READY: frozenset({P.DRAINING, P.CRASHED, P.FAILED, P.STOPPING, P.STOPPED, P.LOST}),
    P.DRAINING: frozenset({P.STOPPING, P.STOPPED, P.LOST, P.CRASHED, P.FAILED}),
    P.STOPPING: frozenset({P.STOPPED, P.LOST, P.FAILED}),
    P.STOPPED: frozenset(),
    P.CRASHED: frozenset({P.STARTING, P.READY, P.FAILED, P.STOPPING, P.STOPPED, P.LOST}),
    P.FAILED: frozenset({P.STOPPING, P.STOPPED, P.LOST}),
    P.LOST: frozenset({P.STARTING, P.READY, P.STOPPING, P.STOPPED, P.CRASHED, P.FAILED}),
}

RUNNING = frozenset({P.STARTING, P.READY, P.CRASHED, P.DRAINING})
"""Phases in which the replica's node is told to run it."""

HOLDS_CARDS = frozenset({P.STARTING, P.READY, P.CRASHED, P.DRAINING, P.STOPPING})
"""Phases in which the replica's cards are not free for another."""


class IllegalTransition(Exception):
    """A phase change the table does not allow."""


def check_transition(current: ReplicaPhase, new: ReplicaPhase) -> bool:
    """Whether `current` -> `new` changes anything, refusing what the table forbids.

    Returns:
        False when the phase stays the same (nothing to record), True for a change.
    Raises:
        IllegalTransition: the table does not allow it.
    """
    if current is new:
        return False
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(f"a replica cannot go from {current.value} to {new.value}")
    return True
