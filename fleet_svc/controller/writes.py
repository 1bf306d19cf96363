"""How the controller changes replicas: the one place a replica is put, moved through the
transition table, forgotten or retired, and published to WatchReplicas (fleet_svc.watch);
each change is kept for the next flush."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import EllipsisType
from typing import Protocol

import structlog

from fleet_svc.domain.catalog import ProfileWant
from fleet_svc.domain.control import (
    Action,
    Assign,
    Create,
    Forget,
    Hold,
    MarkRetiring,
    Move,
    Report,
    ReportMember,
    Retire,
    retirement,
)
from fleet_svc.domain.endpoints import EndpointReason, endpoint_of, removal_reason, routable
from fleet_svc.domain.nodes import NodePhase, NodeView
from fleet_svc.domain.phases import RUNNING, IllegalTransition, ReplicaPhase, check_transition
from fleet_svc.domain.replicas import Member, ReplicaState, StartProgress, amended
from fleet_svc.rollouts import Rollouts
from fleet_svc.watch import EndpointHub
from llmgw.clock import Clock
from llmgw.model import Model

log = structlog.get_logger(__name__)
P = ReplicaPhase

EACH_LOGGED = 8
"""Lines of one kind (a replica created, moved to one phase, or forgotten) for one model that
one batch of actions writes replica by replica at INFO; past this many, one line counts them
(with the fields they share) and each replica's goes to DEBUG. A change of 1,000 one-card
replicas wrote 2,000 lines (created, placed), about 20 ms of the loop before any agent was
told; as the desired sets' lines (fleet_svc.controller.core.SENT_NAMED)."""
_COUNTED = {
    "replica_created": "replicas_created",
    "replica_moved": "replicas_moved",
    "replica_forgotten": "replicas_forgotten",
}
"""Each replica line's counting line."""


class AgentLink(Protocol):
    """The controller's handle on one agent's stream."""

    def send_desired(
        self,
        version: int,
        replicas: Sequence[ReplicaState],
        stop_traces: Mapping[str, str],
    ) -> None:
        """Queue the node's whole desired set, with the trace context of each replica of
        the node it no longer holds (by id; only those stopped by a traced request)."""

    def close(self, reason: str) -> None:
        """End the stream (a newer connection for the node replaced it)."""


def _going(r: ReplicaState) -> bool:
    """Whether a replica is on its way out (retiring, draining or stopping)."""
    return r.retire or r.phase in (P.DRAINING, P.STOPPING)


@dataclass
class FleetState:
    """What the controller holds: replicas, nodes, the agents' links."""

    replicas: dict[str, ReplicaState] = field(default_factory=dict)
    nodes: dict[str, NodeView] = field(default_factory=dict)
    links: dict[str, AgentLink] = field(default_factory=dict)
    observed_logs: dict[str, tuple[str, ...]] = field(default_factory=dict)


def _told(r: ReplicaState) -> tuple[object, ...]:
    """What of a replica the nodes' desired sets follow (fleet_svc.nodelink.desired): where
    it runs, on which cards, whether it runs, its revision, its spec and its gang's members.
    A change of anything else (a READY report, a reason) changes no node's set."""
    return (r.node, r.gpus, r.phase in RUNNING, r.revision, r.spec, r.members)


class ReplicaWrites:
    """The controller's replica changes (fleet_svc.controller.core.Controller holds the
    state they change)."""

    state: FleetState
    hub: EndpointHub
    leading: Callable[[], bool]
    _rollouts: Rollouts
    _clock: Clock
    _wants: Callable[[], list[ProfileWant]]
    _wants_read: list[ProfileWant] | None
    _model_at: Callable[[str, int], Model | None]
    _changes: int
    _unsaved: dict[str, ReplicaState | None]
    _trusting: bool
    _sets_moved: bool
    _lines: list[tuple[str, dict[str, object]]] | None = None
    """The replica lines the batch of actions being applied wrote (None: none is)."""

    def _say(self, event: str, **fields: object) -> None:
        """One replica's line: at once, or with its batch's (`_apply_all`)."""
        if self._lines is None:
            log.info(event, **fields)
        else:
            self._lines.append((event, fields))

    def _publish_all(self) -> None:
        for rid in set(self.hub.ready) - set(self.state.replicas):
            self.hub.remove(rid, EndpointReason.DRAINING)
        for r in self.state.replicas.values():
            self._publish(r)

    def _put(self, r: ReplicaState) -> None:
        old = self.state.replicas.get(r.id)
        if old is None or (_going(r) and not _going(old)):
            # A new command for the agent (start it, or stop it): the request behind the
            # model's running rollout, if any.
            ro = self._rollouts.of_model(r.model)
            trace = ro.trace if ro is not None else ""
            if r.trace != trace:
                r = amended(r, trace=trace)
        if old is None or _told(old) != _told(r):
            self._sets_moved = True
        self._changes += 1
        self.state.replicas[r.id] = r
        self._unsaved[r.id] = r
        self._publish(r)

    def _publish(self, r: ReplicaState) -> None:
        """Tell WatchReplicas: a READY replica with an address on a READY node is routable,
        any other is not (domain.endpoints says why it left)."""
        view = self.state.nodes.get(r.node)
        node = view.phase if view is not None else self._unknown_node_phase()
        if routable(r, node):
            model = self._model_at(r.model, r.revision)
            gpu_class = view.gpu_class if view is not None else ""
            self.hub.put(endpoint_of(r, model=model, gpu_class=gpu_class))
        elif r.id in self.hub:
            self.hub.remove(r.id, removal_reason(r, node, wanted=self._wanted(r.model, r.profile)))

    def _unknown_node_phase(self) -> NodePhase | None:
        """The phase to route by for a node whose agent this fleet has not heard from.

        A follower hears from no agent: it routes the replicas the leader wrote READY. A
        fleet that just took over (reload) trusts them too until its agents had the grace of
        a few missed heartbeats to say hello; after that an unknown node is not routed to."""
        if not self.leading():
            return NodePhase.READY
        return NodePhase.READY if self._trusting else None

    def _wanted(self, model: str, profile: str) -> bool:
        # The wants the last tick read (off the loop on PostgreSQL), not a store call here:
        # this runs on the loop, for agents' events too.
        wants = self._wants_read if self._wants_read is not None else self._wants()
        return any(w.model == model and w.profile == profile for w in wants)

    def _publish_node(self, node: str) -> None:
        """A node's phase changed: its replicas leave routing or come back."""
        for r in list(self.state.replicas.values()):
            if r.node == node:
                self._publish(r)

    def transition(
        self,
        replica_id: str,
        phase: ReplicaPhase,
        reason: str = "",
        *,
        node: str | None = None,
        gpus: tuple[int, ...] | None = None,
        address: str | None = None,
        restarts: int | None = None,
        members: tuple[Member, ...] | None = None,
        progress: StartProgress | EllipsisType | None = ...,
    ) -> bool:
        """Move a replica to `phase` through the transition table, saving and logging it
        (with the placement or the report that came with the move; `progress` given only
        by a report, else kept while the replica stays STARTING).

        Returns:
            Whether anything changed.
        """
        r = self.state.replicas.get(replica_id)
        if r is None:
            return False
        try:
            moved = check_transition(r.phase, phase)
        except IllegalTransition as exc:
            log.warning("transition_refused", replica=replica_id, error=str(exc))
            return False
        new = amended(
            r,
            phase=phase,
            # Entering a phase stamps it (one copy of the replica either way).
            since_s=self._clock.wall() if moved else r.since_s,
            entered_s=self._clock.monotonic() if moved else r.entered_s,
            reason=reason if moved else r.reason,
            node=r.node if node is None else node,
            gpus=r.gpus if gpus is None else gpus,
            address=r.address if address is None else address,
            restarts=r.restarts if restarts is None else restarts,
            members=r.members if members is None else members,
            # Progress belongs to a replica starting on its node: an agent's report replaces
            # it (`...`: not a report, kept), and it goes with the phase (placed again, ready,
            # crashed).
            progress=(
                None
                if phase is not P.STARTING
                else (r.progress if not moved else None)
                if progress is ...
                else progress
            ),
        )
        if moved:
            self._say(
                "replica_moved",
                replica=r.id,
                model=r.model,
                node=r.node,
                phase_from=r.phase.value,
                phase=phase.value,
                reason=reason,
            )
        if new != r:
            self._put(new)
        return moved or new != r

    def _forget(self, replica_id: str) -> None:
        self._changes += 1
        self._sets_moved = True
        r = self.state.replicas.pop(replica_id, None)
        if r is not None:
            if replica_id in self.hub:
                view = self.state.nodes.get(r.node)
                self.hub.remove(
                    replica_id,
                    removal_reason(
                        None,
                        view.phase if view is not None else None,
                        wanted=self._wanted(r.model, r.profile),
                    ),
                )
            self._unsaved[replica_id] = None
            self._say("replica_forgotten", replica=replica_id, model=r.model, phase=r.phase.value)

    def _apply(self, action: Action) -> None:
        """Carry out one action a planning function returned."""
        if isinstance(action, Create):
            new = amended(action.replica, since_s=self._clock.wall())
            self._put(new)
            self._say("replica_created", replica=new.id, model=new.model, profile=new.profile)
        elif isinstance(action, Assign):
            members = tuple(
                Member(rank=i, node=p.node, gpus=p.gpus) for i, p in enumerate(action.members)
            )
            where = ", ".join(m.node for m in members) or action.placement.node
            self.transition(
                action.replica_id,
                P.STARTING,
                f"placed on {where}" + (f" (a gang of {len(members)})" if members else ""),
                node=action.placement.node,
                gpus=action.placement.gpus,
                members=members,
            )
        elif isinstance(action, ReportMember):
            gang = self.state.replicas.get(action.replica_id)
            if gang is not None and 0 <= action.rank < len(gang.members):
                was = gang.members[action.rank]
                now = replace(was, phase=action.phase, gang_address=action.gang_address)
                if now != was:
                    self._put(gang.with_member(now))
        elif isinstance(action, Hold):
            r = self.state.replicas.get(action.replica_id)
            if r is not None and r.reason != action.reason:
                self._put(amended(r, reason=action.reason))
        elif isinstance(action, Move):
            self.transition(action.replica_id, action.phase, action.reason)
        elif isinstance(action, Report):
            self.transition(
                action.replica_id,
                action.phase,
                action.reason,
                address=action.address,
                restarts=action.restarts,
                progress=action.progress,
            )
        elif isinstance(action, MarkRetiring):
            r = self.state.replicas.get(action.replica_id)
            if r is not None and not r.retire:
                self._put(amended(r, retire=True))
        elif isinstance(action, Retire):
            self.retire(action.replica_id, action.reason)
        elif isinstance(action, Forget):
            self._forget(action.replica_id)

    def _apply_all(self, actions: Iterable[Action]) -> None:
        """Carry out a batch of actions; their replica lines are written at its end, counted
        where there are many of a kind (EACH_LOGGED)."""
        if self._lines is not None:  # inside a batch (a retirement's actions): its lines
            for action in actions:
                self._apply(action)
            return
        self._lines = []
        try:
            for action in actions:
                self._apply(action)
        finally:
            lines, self._lines = self._lines, None
            _write_lines(lines)

    def retire(self, replica_id: str, reason: str) -> None:
        """Take a replica out: drain a READY one first, drop a PENDING one, stop the rest."""
        r = self.state.replicas.get(replica_id)
        if r is not None:
            self._apply_all(retirement(r, reason))


def _write_lines(lines: Sequence[tuple[str, dict[str, object]]]) -> None:
    """A batch's replica lines: one by one for a kind and model that has few, else one
    counting line (with the fields all of them share) and each at DEBUG."""
    groups: dict[tuple[str, object, object], list[dict[str, object]]] = {}
    for event, fields in lines:
        groups.setdefault((event, fields.get("model"), fields.get("phase")), []).append(fields)
    for (event, _, _), group in groups.items():
        if len(group) <= EACH_LOGGED:
            for fields in group:
                log.info(event, **fields)
            continue
        for fields in group:
            log.debug(event, **fields)
        first = group[0]
        shared = {
            key: value
            for key, value in first.items()
            if key != "replica" and all(f.get(key) == value for f in group)
        }
        log.info(_COUNTED.get(event, event), replicas=len(group), **shared)
