"""The fleet's controller: the one writer of fleet state, ticking snapshot -> plan -> dispatch."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import structlog

from fleet_svc.domain.catalog import ProfileWant
from fleet_svc.domain.control import (
    Assign,
    Create,
    Forget,
    Hold,
    Move,
    Retire,
    plan_actions,
)
from fleet_svc.domain.nodes import Card, Liveness, NodePhase, NodeView, node_phase
from fleet_svc.domain.phases import RUNNING, IllegalTransition, ReplicaPhase, check_transition
from fleet_svc.domain.replicas import ReplicaState
from fleet_svc.domain.rollout import Event, Rollout
from fleet_svc.domain.rollout import advance as advance_rollout
from fleet_svc.domain.rollout import cancel as cancel_rollout
from fleet_svc.store.base import Store
from fleet_svc.store.rows import load_rollout, replica_of, replica_record, rollout_record
from fleet_svc.watch import EndpointEvent, EndpointHub

log = structlog.get_logger(__name__)
P = ReplicaPhase

RESEND_S = 5.0
"""A desired set not acknowledged within this long is sent again (it is idempotent)."""

MAX_BURST = 20
"""Ticks in a row a controller runs without waiting while each changes something."""


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


class AgentLink(Protocol):
    """The controller's handle on one agent's stream."""

    def send_desired(self, version: int, replicas: Sequence[ReplicaState]) -> None:
        """Queue the node's whole desired set."""

    def close(self, reason: str) -> None:
        """End the stream (a newer connection for the node replaced it)."""


@dataclass
class _Pushed:
    """The last desired set sent to a node and whether it was acknowledged."""

    version: int = 0
    key: tuple[tuple[str, int], ...] = ()
    sent_s: float = 0.0
    acked: bool = True


@dataclass
class FleetState:
    """What the controller holds: replicas, nodes, the agents' links."""

    replicas: dict[str, ReplicaState] = field(default_factory=dict)
    nodes: dict[str, NodeView] = field(default_factory=dict)
    links: dict[str, AgentLink] = field(default_factory=dict)
    pushed: dict[str, _Pushed] = field(default_factory=dict)
    observed_logs: dict[str, tuple[str, ...]] = field(default_factory=dict)


class Controller:
    """Runs the fleet toward what the catalog wants, from what the agents report."""

    def __init__(
        self,
        store: Store,
        wants: Callable[[], list[ProfileWant]],
        *,
        hub: EndpointHub | None = None,
        liveness: Liveness | None = None,
        drain_s: float = 2.0,
        tick_s: float = 0.5,
        clock: Callable[[], float],
        new_id: Callable[[], str] | None = None,
        start_timeout_s: float = 600.0,
    ) -> None:
        self._store = store
        self._wants = wants
        self.hub = hub or EndpointHub()
        self.liveness = liveness or Liveness()
        self._drain_s = drain_s
        self.start_timeout_s = start_timeout_s
        """How long a rollout's new replica may take to turn healthy."""
        self._tick_s = tick_s
        self._clock = clock
        self._new_id = new_id or (lambda: "r-" + uuid.uuid4().hex[:10])
        self.state = FleetState()
        self._changes = 0
        """Counts writes of fleet state; a tick that moved it is followed by another."""
        self._unsaved: dict[str, ReplicaState | None] = {}
        """Replicas changed (None: forgotten) since the last flush to the store."""
        self._wake = asyncio.Event()
        self._started_s = clock()
        self._version = itertools.count(int(store.get_value("desired_version") or 0) + 1)
        self.rollouts: dict[str, Rollout] = {}
        """Running rollouts by id."""
        self.rollout_signal = asyncio.Event()
        """Set (and replaced) whenever a rollout records events."""
        self._load()

    # -- persistence ---------------------------------------------------------------------

    def _load(self) -> None:
        """Replicas the fleet accepted before a restart; their nodes are unknown until their
        agents say hello (and are lost if they never do)."""
        for rec in self._store.list_replicas():
            self.state.replicas[rec.id] = replica_of(rec)
            if rec.node and rec.node not in self.state.nodes:
                self.state.nodes[rec.node] = NodeView(name=rec.node, last_heard_s=self._started_s)
        for stored in self._store.list_rollouts():
            if stored.state == "RUNNING":
                self.rollouts[stored.id] = load_rollout(stored)
        log.info(
            "fleet_state_loaded", replicas=len(self.state.replicas), rollouts=len(self.rollouts)
        )

    def _save(self, r: ReplicaState) -> None:
        """Mark a replica to be written at the next flush."""
        self._unsaved[r.id] = r

    def flush(self) -> None:
        """Write every replica changed since the last flush, in one transaction.

        Called at the end of each tick before any desired set is sent (so an agent never runs
        a replica the store does not hold), and when a rollout starts or is cancelled. An
        observation not yet flushed when the fleet dies is lost, and told again by its agent.
        """
        if not self._unsaved:
            return
        puts = [replica_record(r) for r in self._unsaved.values() if r is not None]
        deletes = [rid for rid, r in self._unsaved.items() if r is None]
        self._unsaved = {}
        self._store.write_replicas(puts, deletes)

    # -- the one place replicas change -----------------------------------------------------

    def _put(self, r: ReplicaState) -> None:
        self._changes += 1
        self.state.replicas[r.id] = r
        self._save(r)
        self._publish(r)

    def _publish(self, r: ReplicaState) -> None:
        """Tell WatchReplicas: a READY replica with an address is routable, any other is not."""
        if r.phase is P.READY and r.address:
            self.hub.add(
                EndpointEvent(
                    True, r.id, r.model, r.profile, r.address, r.revision, r.node, r.phase.value
                )
            )
        else:
            self.hub.remove(r.id)

    def transition(
        self, replica_id: str, phase: ReplicaPhase, reason: str = "", **changes: Any
    ) -> bool:
        """Move a replica to `phase` through the transition table, saving and logging it.

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
        new = replace(r, phase=phase, reason=reason if moved else r.reason, **changes)
        if moved:
            new = replace(new, since_s=self._clock())
            log.info(
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
        r = self.state.replicas.pop(replica_id, None)
        if r is not None:
            self.hub.remove(replica_id)
            self._unsaved[replica_id] = None
            log.info("replica_forgotten", replica=replica_id, model=r.model, phase=r.phase.value)

    # -- events from agents (facts; applied at once, the loop is woken) -------------------

    def agent_connected(
        self, view: NodeView, observed: Iterable[Observed], link: AgentLink
    ) -> None:
        """An agent said hello: its node's cards and the replicas it runs.

        One connection per node: a newer one replaces the older, which is closed.
        """
        now = self._clock()
        old_link = self.state.links.get(view.name)
        if old_link is not None and old_link is not link:
            old_link.close("replaced by a newer connection from the same node")
            log.warning("agent_replaced", node=view.name)
        self.state.links[view.name] = link
        view.connected = True
        view.last_heard_s = now
        view.phase = NodePhase.READY
        self.state.nodes[view.name] = view
        self.state.pushed[view.name] = _Pushed()  # resend the desired set in full
        seen = set()
        for o in observed:
            seen.add(o.replica_id)
            self.observe(view.name, o)
        # Replicas the fleet placed there that the agent does not run: started by Desired.
        for r in list(self.state.replicas.values()):
            if r.node == view.name and r.id not in seen:
                if r.phase in (P.STOPPING, P.STOPPED):
                    self.transition(r.id, P.STOPPED, "gone from its node")
                elif r.phase in (P.READY, P.CRASHED, P.LOST):
                    self.transition(r.id, P.STARTING, "its node does not run it: starting it again")
        log.info("agent_connected", node=view.name, cards=len(view.cards), replicas=len(seen))
        self.wake()

    def agent_disconnected(self, node: str, link: AgentLink) -> None:
        """An agent's stream ended; the node is NOT_READY until it says hello again."""
        if self.state.links.get(node) is not link:
            return
        del self.state.links[node]
        view = self.state.nodes.get(node)
        if view is not None:
            view.connected = False
        log.info("agent_disconnected", node=node)
        self.wake()

    def heartbeat(self, node: str, cards: Sequence[Card], memory_free_bytes: int) -> None:
        """An agent's heartbeat: its node is alive, its cards' use as reported."""
        view = self.state.nodes.get(node)
        if view is None:
            return
        view.last_heard_s = self._clock()
        if cards:
            view.cards = tuple(cards)
        view.memory_free_bytes = memory_free_bytes

    def observe(self, node: str, o: Observed) -> None:
        """An agent's report of one replica."""
        view = self.state.nodes.get(node)
        if view is not None:
            view.last_heard_s = self._clock()
        r = self.state.replicas.get(o.replica_id)
        if r is None or r.node != node:
            return  # unknown here: not in the node's desired set, so its agent stops it
        if o.log_tail:
            self.state.observed_logs[r.id] = o.log_tail
        if o.revision != r.revision and o.phase is not P.STOPPED:
            return  # an older run of this replica; the desired set replaces it
        if r.phase in (P.DRAINING, P.STOPPING) and o.phase not in (P.STOPPED, P.FAILED):
            return  # going away: only its end is news
        phase = o.phase
        if r.phase is P.PENDING:
            return
        if phase is P.STOPPED and r.phase not in (P.STOPPING, P.DRAINING):
            phase = P.CRASHED
        reason = o.message or r.reason
        self.transition(r.id, phase, reason, address=o.address or r.address, restarts=o.restarts)
        now = self.state.replicas.get(r.id)
        if now is not None and now.phase is P.READY and now.id not in self.hub.ready:
            # READY since before a fleet restart: routable again only once its agent says so.
            self._publish(now)
        self.wake()

    def acknowledged(self, node: str, version: int, rejected: Sequence[Rejection]) -> None:
        """An agent acknowledged a desired version, refusing some replicas."""
        pushed = self.state.pushed.get(node)
        if pushed is not None and pushed.version == version:
            pushed.acked = True
        for rej in rejected:
            r = self.state.replicas.get(rej.replica_id)
            if r is not None and r.revision == rej.revision:
                self.transition(r.id, P.FAILED, f"{node} refused it ({rej.reason}): {rej.message}")
        if rejected:
            self.wake()

    # -- the loop -----------------------------------------------------------------------

    def wake(self) -> None:
        """Ask for a tick now (the catalog changed, or an agent reported)."""
        self._wake.set()

    async def run(self) -> None:
        """Tick until cancelled; a tick that raises is logged and the loop goes on.

        A tick that changed something is followed at once by another (a stop leads to a
        forget, a forget to the next rollout step), up to MAX_BURST in a row; otherwise the
        loop sleeps until woken, the next drain deadline, or the tick interval.
        """
        burst = 0
        while True:
            if not self._wake.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self._next_wait_s())
            self._wake.clear()
            before = self._changes
            try:
                self.tick()
            except Exception:
                log.exception("tick_failed")
            burst = burst + 1 if self._changes != before else 0
            if 0 < burst < MAX_BURST:
                self._wake.set()
            await asyncio.sleep(0)  # let the streams and RPCs run between ticks

    def _next_wait_s(self) -> float:
        """Until the next tick: the interval, or sooner when a drain delay ends."""
        now = self._clock()
        wait = self._tick_s
        for r in self.state.replicas.values():
            if r.phase is P.DRAINING:
                wait = min(wait, max(r.since_s + self._drain_s - now, 0.0) + 0.001)
        return wait

    @property
    def managed(self) -> frozenset[tuple[str, str]]:
        """(model, profile) pairs a running rollout is changing: their counts are its own."""
        return frozenset((ro.model, s.profile) for ro in self.rollouts.values() for s in ro.steps)

    def running_rollout(self, model: str) -> Rollout | None:
        """The rollout changing `model` now, if any."""
        return next((ro for ro in self.rollouts.values() if ro.model == model), None)

    def start_rollout(self, ro: Rollout) -> None:
        """Persist a new rollout and start it on the next tick."""
        self._save_rollout(
            ro, [Event("rollout_started", message=f"{ro.kind}: {ro.strategy.value}")]
        )
        self.rollouts[ro.id] = ro
        self.flush()
        log.info("rollout_started", rollout_id=ro.id, model=ro.model, steps=len(ro.steps))
        self.wake()

    def cancel(self, rollout_id: str, reason: str) -> Rollout | None:
        """End a running rollout now (its in-flight replica is stopped); None when not running."""
        ro = self.rollouts.get(rollout_id)
        if ro is None:
            return None
        ended, actions, events = cancel_rollout(
            ro, reason, self.state.replicas, self._clock(), new_id=self._new_id
        )
        self._save_rollout(ended, events)
        del self.rollouts[rollout_id]
        for action in actions:
            self._apply(action)
        self.flush()
        log.info("rollout_cancelled", rollout_id=rollout_id, reason=reason)
        self.wake()
        return ended

    def _save_rollout(self, ro: Rollout, events: list[Event]) -> None:
        self._changes += 1
        now = self._clock()
        self._store.put_rollout(rollout_record(ro))
        for e in events:
            self._store.append_event(
                ro.id,
                now,
                {
                    "kind": e.kind,
                    "profile": e.profile,
                    "replica_id": e.replica_id,
                    "node": e.node,
                    "gpus": list(e.gpus),
                    "mode": e.mode,
                    "message": e.message,
                    "state": ro.state.value,
                },
            )
        if events:
            signal, self.rollout_signal = self.rollout_signal, asyncio.Event()
            signal.set()

    def _advance_rollouts(self, now: float, wants: list[ProfileWant]) -> None:
        by_key = {(w.model, w.profile): w for w in wants}
        for ro in list(self.rollouts.values()):
            current = next((w.revision for w in wants if w.model == ro.model), 0)
            if current != ro.to_revision:
                # The catalog does not hold the revision this rollout carries out (the fleet
                # died between the two writes, or the model was deleted): end it, say so.
                ended, actions, events = cancel_rollout(
                    ro,
                    f"the catalog holds revision {current} of {ro.model}, not {ro.to_revision}",
                    self.state.replicas,
                    now,
                    new_id=self._new_id,
                )
            else:
                ended, actions, events = advance_rollout(
                    ro,
                    self.state.replicas,
                    by_key,
                    self.state.nodes,
                    now,
                    new_id=self._new_id,
                    logs=self.state.observed_logs,
                )
            if events or replace(ended, updated_s=ro.updated_s) != ro:
                self._save_rollout(ended, events)
            for action in actions:
                self._apply(action)
            if ended.done:
                del self.rollouts[ro.id]
                log.info(
                    "rollout_ended", rollout_id=ro.id, state=ended.state.value, reason=ended.reason
                )
            else:
                self.rollouts[ro.id] = ended

    def tick(self) -> None:
        """Snapshot -> plan -> dispatch."""
        now = self._clock()
        for view in self.state.nodes.values():
            phase, why = node_phase(view, now, self.liveness)
            if phase is not view.phase:
                log.info(
                    "node_moved",
                    node=view.name,
                    phase_from=view.phase.value,
                    phase=phase.value,
                    reason=why,
                )
                view.phase, view.reason = phase, why
        wants = self._wants()
        self._advance_rollouts(now, wants)
        actions = plan_actions(
            wants,
            self.state.replicas,
            self.state.nodes,
            now,
            drain_s=self._drain_s,
            new_id=self._new_id,
            managed=self.managed,
        )
        for action in actions:
            self._apply(action)
        self.flush()
        self._dispatch(now)

    def _apply(self, action: Any) -> None:
        if isinstance(action, Create):
            self._put(action.replica)
            log.info(
                "replica_created",
                replica=action.replica.id,
                model=action.replica.model,
                profile=action.replica.profile,
            )
        elif isinstance(action, Assign):
            self.transition(
                action.replica_id,
                P.STARTING,
                f"placed on {action.placement.node}",
                node=action.placement.node,
                gpus=action.placement.gpus,
            )
        elif isinstance(action, Hold):
            r = self.state.replicas.get(action.replica_id)
            if r is not None and r.reason != action.reason:
                self._put(replace(r, reason=action.reason))
        elif isinstance(action, Move):
            self.transition(action.replica_id, action.phase, action.reason)
        elif isinstance(action, Retire):
            self.retire(action.replica_id, action.reason)
        elif isinstance(action, Forget):
            self._forget(action.replica_id)

    def retire(self, replica_id: str, reason: str) -> None:
        """Take a replica out: drain a READY one first, drop a PENDING one, stop the rest."""
        r = self.state.replicas.get(replica_id)
        if r is None:
            return
        if not r.retire:
            r = replace(r, retire=True)
            self._put(r)
        if r.phase is P.READY:
            self.transition(r.id, P.DRAINING, reason)
        elif r.phase is P.PENDING:
            self.transition(r.id, P.STOPPED, reason)
        elif r.phase in (P.STARTING, P.CRASHED, P.LOST):
            self.transition(r.id, P.STOPPING, reason)
        elif r.phase is P.FAILED:
            self.transition(r.id, P.STOPPED, reason)

    def desired_for(self, node: str) -> list[ReplicaState]:
        """The replicas a node is told to run."""
        return self._desired_by_node().get(node, [])

    def _desired_by_node(self) -> dict[str, list[ReplicaState]]:
        """Every node's desired replicas, in one pass over the replicas."""
        out: dict[str, list[ReplicaState]] = {}
        for r in self.state.replicas.values():
            if r.node and r.phase in RUNNING:
                out.setdefault(r.node, []).append(r)
        for group in out.values():
            group.sort(key=lambda r: r.id)
        return out

    def _dispatch(self, now: float) -> None:
        """Send each connected node its desired set when it changed (or was not acked)."""
        desired = self._desired_by_node()
        newest = 0
        for node, link in self.state.links.items():
            want = desired.get(node, [])
            key = tuple((r.id, r.revision) for r in want)
            pushed = self.state.pushed.setdefault(node, _Pushed())
            if (
                pushed.version
                and key == pushed.key
                and (pushed.acked or now - pushed.sent_s < RESEND_S)
            ):
                continue
            version = (
                pushed.version if key == pushed.key and pushed.version else next(self._version)
            )
            newest = max(newest, version)
            link.send_desired(version, want)
            self.state.pushed[node] = _Pushed(version=version, key=key, sent_s=now, acked=False)
            log.info("desired_sent", node=node, version=version, replicas=len(want))
        if newest:
            # Versions only grow, across restarts too: keep the newest handed out this tick.
            self._store.put_value("desired_version", str(newest))
        # A stopping replica whose node is gone for good is stopped as far as anyone can tell.
        for r in list(self.state.replicas.values()):
            view = self.state.nodes.get(r.node)
            if r.phase is P.STOPPING and (view is None or view.phase is NodePhase.LOST):
                self.transition(r.id, P.STOPPED, "its node is gone")
