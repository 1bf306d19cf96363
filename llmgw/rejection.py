"""A rejection: a replica a node's agent refused to run, as the agent sends it and the fleet
reads it (`Ack.rejected` on the wire)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rejection:
    """One replica (by id and revision) an agent refused, why, and a message a person can
    act on.

    `reason` is UPPER_SNAKE text: the agent gives one of its `RejectReason` values
    (fleet_svc/agent/admission.py); the fleet reads it as text and only shows it, so a
    reason an agent of another version gives reads the same way.
    """

    replica_id: str
    revision: int
    reason: str
    message: str
