"""Reconciling what agents report with what the fleet keeps: from a report, the phase changes
it means (pure; the controller applies them through the transition table)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fleet_svc.domain.control import Action, Move, Report, ReportMember
from fleet_svc.domain.gang import launchable
from fleet_svc.domain.nodes import NodePhase, NodeView
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.replicas import ReplicaState, StartProgress
from llmgw.rejection import Rejection

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
    gang_address: str = ""
    """host:port a gang member listens on for its gang ("" for none)."""
    progress: StartProgress | None = None
    """While STARTING: its download or load, as the agent measured it."""


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
        r.id,
        phase,
        o.message or r.reason,
        address=o.address or r.address,
        restarts=o.restarts,
        progress=o.progress,
    )


_GONE = frozenset({P.CRASHED, P.FAILED, P.STOPPED})
"""Member phases that end a gang that was not asked to stop: torch.distributed (vLLM, SGLang)
and llama.cpp's RPC backend cannot take a rank back into a running group, so one member
gone fails the whole gang, which is placed again whole."""


def _all_gone(r: ReplicaState, gone: frozenset[int] = frozenset()) -> bool:
    """Whether no member of gang `r` runs any more (ranks in `gone` taken as gone): each
    reported stopped, crashed or failed, or was never sent to its node (its engine's launch
    still waited for a peer's address) and never reported."""
    sent = {m.rank for m in launchable(r)}
    return all(
        m.rank in gone or m.phase in _GONE or (m.phase is P.PENDING and m.rank not in sent)
        for m in r.members
    )


def gang_reported(r: ReplicaState | None, node: str, o: Observed) -> list[Action]:
    """What an agent's report of its member of a gang changes.

    The head's (rank 0) health is the gang's (it answers only once every member joined) and
    its address is the one the gateway routes to; any member that crashes, fails or stops
    unasked fails the gang; a gang asked to stop is STOPPED once every member is.
    """
    if r is None or not r.gang or r.phase is P.PENDING:
        return []
    member = r.member_on(node)
    if member is None or (o.revision != r.revision and o.phase is not P.STOPPED):
        return []
    out: list[Action] = []
    address = o.gang_address or member.gang_address
    if o.phase is not member.phase or address != member.gang_address:
        out.append(ReportMember(r.id, member.rank, o.phase, address))
    stopping = r.phase in (P.DRAINING, P.STOPPING) or r.retire
    if stopping:
        if o.phase in _GONE and _all_gone(r, frozenset({member.rank})):
            out.append(Move(r.id, P.STOPPED, "every member of the gang stopped"))
        return out
    if o.phase in _GONE:
        if r.phase in (P.FAILED, P.STOPPED, P.LOST):
            return out
        what = {P.CRASHED: "crashed", P.FAILED: "failed", P.STOPPED: "stopped"}[o.phase]
        why = f"gang member rank {member.rank} on {node} {what}"
        out.append(Move(r.id, P.FAILED, f"{why}: {o.message}" if o.message else why))
        return out
    if member.rank == 0:
        out.append(
            Report(
                r.id, o.phase, o.message or r.reason, o.address or r.address, o.restarts, o.progress
            )
        )
    return out


def missing_from_hello(
    replicas: Iterable[ReplicaState], node: str, running: frozenset[str]
) -> list[Move]:
    """Replicas the fleet placed on `node` that its agent, saying hello, does not run: one
    that was stopping is stopped; one that ran is started again (by the desired set)."""
    out = []
    for r in replicas:
        if r.gang and node in r.nodes and r.id not in running:
            member = r.member_on(node)
            assert member is not None
            if r.phase is P.STOPPING:
                if _all_gone(r, frozenset({member.rank})):
                    out.append(Move(r.id, P.STOPPED, "gone from its nodes"))
            elif r.phase in (P.READY, P.CRASHED, P.LOST) or member.phase is P.READY:
                out.append(
                    Move(
                        r.id, P.FAILED, f"gang member rank {member.rank}: {node} no longer runs it"
                    )
                )
            continue
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
        if r is not None and node in r.nodes and r.revision == rej.revision:
            out.append(Move(r.id, P.FAILED, f"{node} refused it ({rej.reason}): {rej.message}"))
    return out


def stopped_with_their_node(
    replicas: Iterable[ReplicaState], nodes: Mapping[str, NodeView]
) -> list[Move]:
    """STOPPING replicas whose node is gone for good: stopped, as far as anyone can tell."""
    out = []
    for r in replicas:
        if r.phase is not P.STOPPING:
            continue
        if r.gang:
            # Every member stopped, or its node gone: nothing of the gang holds cards.
            lost = frozenset(
                m.rank
                for m in r.members
                if (v := nodes.get(m.node)) is None or v.phase is NodePhase.LOST
            )
            if _all_gone(r, lost):
                out.append(Move(r.id, P.STOPPED, "every member stopped or its node is gone"))
            continue
        view = nodes.get(r.node)
        if view is None or view.phase is NodePhase.LOST:
            out.append(Move(r.id, P.STOPPED, "its node is gone"))
    return out
