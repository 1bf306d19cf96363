"""Reconciling what agents report with what the fleet keeps: from a report, the phase changes
it means (pure; the controller applies them through the transition table)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fleet_svc.domain.control import Move, Report
from fleet_svc.domain.nodes import NodePhase, NodeView
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.replicas import ReplicaState

P = ReplicaPhase


@dataclass(frozen=True)
class Observed:
    """A replica as an agent reports it."""

    replica_id: str
    revision: int
    phase: ReplicaPhase
    address: str = ""
    restarts: int = 0
    message: str = ""
    log_tail: tuple[str, ...] = ()
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class Rejection:
    """A replica an agent refused to run."""

    replica_id: str
    revision: int
    reason: str
    message: str


def reported(r: ReplicaState | None, node: str, o: Observed) -> Report | None:
    """What an agent's report of one replica changes; None when it is no news.

    Ignored: a replica the fleet does not keep on that node (not in the node's desired set, so
    its agent stops it), an older run of it (the desired set replaces it), anything but the
    end of one going away, and a replica not placed yet. A replica found STOPPED that was not
    asked to stop CRASHED.
    """
    if r is None or r.node != node:
        return None
    if o.revision != r.revision and o.phase is not P.STOPPED:
        return None
    if r.phase in (P.DRAINING, P.STOPPING) and o.phase not in (P.STOPPED, P.FAILED):
        return None
    if r.phase is P.PENDING:
        return None
    phase = o.phase
    if phase is P.STOPPED and r.phase not in (P.STOPPING, P.DRAINING):
        phase = P.CRASHED
    return Report(
        r.id, phase, o.message or r.reason, address=o.address or r.address, restarts=o.restarts
    )


def missing_from_hello(
    replicas: Iterable[ReplicaState], node: str, running: frozenset[str]
) -> list[Move]:
    """Replicas the fleet placed on `node` that its agent, saying hello, does not run: one
    that was stopping is stopped; one that ran is started again (by the desired set)."""
    out = []
    for r in replicas:
        if r.node != node or r.id in running:
            continue
        if r.phase in (P.STOPPING, P.STOPPED):
            out.append(Move(r.id, P.STOPPED, "gone from its node"))
        elif r.phase in (P.READY, P.CRASHED, P.LOST):
            out.append(Move(r.id, P.STARTING, "its node does not run it: starting it again"))
    return out


def refused(
    replicas: Mapping[str, ReplicaState], node: str, rejected: Sequence[Rejection]
) -> list[Move]:
    """Replicas (of the revision refused) an agent will not run: FAILED, saying why. Only
    its own node's: an agent cannot fail a replica placed elsewhere."""
    out = []
    for rej in rejected:
        r = replicas.get(rej.replica_id)
        if r is not None and r.node == node and r.revision == rej.revision:
            out.append(Move(r.id, P.FAILED, f"{node} refused it ({rej.reason}): {rej.message}"))
    return out


def stopped_with_their_node(
    replicas: Iterable[ReplicaState], nodes: Mapping[str, NodeView]
) -> list[Move]:
    """STOPPING replicas whose node is gone for good: stopped, as far as anyone can tell."""
    out = []
    for r in replicas:
        view = nodes.get(r.node)
        if r.phase is P.STOPPING and (view is None or view.phase is NodePhase.LOST):
            out.append(Move(r.id, P.STOPPED, "its node is gone"))
    return out
