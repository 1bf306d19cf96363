"""The fleet's controller: the one writer of fleet state, ticking snapshot -> plan -> dispatch.

What to do is decided by pure functions (domain.control.plan_actions, domain.rollout,
domain.reports); this module keeps the state they read, applies the actions they return
through the transition table, persists, and tells the agents (agents.desired).

A tick runs on the event loop; its store calls (adopting and saving rollouts, the replica
flush, the desired version) go through `calls`: on PostgreSQL one thread of the controller's
own, so they never block the loop and reach the store one at a time, in the tick's order (a
fenced write never overtakes an earlier one). Agents' reports go on meanwhile; one tick is
awaited to its end before the next begins."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import EllipsisType
from typing import Protocol

import structlog

from fleet_svc.agents.desired import DesiredSets, desired_by_node
from fleet_svc.agents.remote import RemoteNodes
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
    plan_actions,
    retirement,
)
from fleet_svc.domain.endpoints import EndpointReason, endpoint_of, removal_reason, routable
from fleet_svc.domain.nodes import Card, Liveness, NodePhase, NodeView, node_phase
from fleet_svc.domain.phases import RUNNING, IllegalTransition, ReplicaPhase, check_transition
from fleet_svc.domain.replicas import Member, ReplicaState, StartProgress
from fleet_svc.domain.reports import (
    Observed,
    Rejection,
    gang_reported,
    missing_from_hello,
    refused,
    reported,
    stopped_with_their_node,
)
from fleet_svc.domain.rollout import Event as RolloutEvent
from fleet_svc.domain.rollout import Rollout
from fleet_svc.rollouts import Rollouts
from fleet_svc.store.base import NotLeader, ReplicaRecord, RolloutRecord, Store, StoreError
from fleet_svc.store.rows import replica_of, replica_record
from fleet_svc.store_calls import StoreCalls, inline
from fleet_svc.watch import EndpointHub
from llmgw.clock import Clock
from llmgw.model import Model

log = structlog.get_logger(__name__)
P = ReplicaPhase

MAX_BURST = 20
"""Ticks in a row a controller runs without waiting while each changes something."""
ADOPT_POLL_S = 2.0
"""A tick reads the store for pending rollouts and requests when a change was announced, when
the catalog's revisions moved (a pending rollout commits with its revision), and otherwise at
least this often (what another fleet committed just before it lost its lease)."""
FLUSH_ROUNDS = 3
"""Flushes a tick makes at most before dispatching, while agents' reports keep changing
replicas during the writes (those changes are of stored replicas: only a tick creates or
places one)."""


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


class Controller:
    """Runs the fleet toward what the catalog wants, from what the agents report.

    Durations (heartbeats, drains, start timeouts, resends) are measured on `clock.monotonic`;
    `clock.wall` only stamps what people read and what the store keeps.
    """

    def __init__(
        self,
        store: Store,
        wants: Callable[[], list[ProfileWant]],
        *,
        clock: Clock,
        hub: EndpointHub | None = None,
        liveness: Liveness | None = None,
        drain_s: float = 2.0,
        tick_s: float = 0.5,
        new_id: Callable[[], str] | None = None,
        start_timeout_s: float = 600.0,
        model_at: Callable[[str, int], Model | None] | None = None,
    ) -> None:
        self._store = store
        self._wants = wants
        self.hub = hub or EndpointHub(clock.wall)
        self._model_at = model_at or (lambda name, revision: None)
        """A model as one of its revisions was (for an endpoint's context and max output)."""
        self.liveness = liveness or Liveness()
        self._drain_s = drain_s
        self.start_timeout_s = start_timeout_s
        """How long a rollout's new replica may take to turn healthy."""
        self._tick_s = tick_s
        self._clock = clock
        self._new_id = new_id or (lambda: "r-" + uuid.uuid4().hex[:10])
        self.state = FleetState()
        self.calls = StoreCalls(store, workers=1, name="fleet-controller")
        """Where the controller's store calls run: one thread, so they keep their order."""
        self.desired = DesiredSets(store)
        self._changes = 0
        """Counts writes of fleet state; a tick that moved it is followed by another."""
        self._unsaved: dict[str, ReplicaState | None] = {}
        """Replicas changed (None: forgotten) since the last flush to the store."""
        self._wake = asyncio.Event()
        self._rollouts = Rollouts(store, self.calls, clock, self._new_id)
        self.hub.weigh = self._rollouts.weights  # a canary's step splits its model's weight
        self._asked = 0
        """Counts changes the API side committed and announced (`changed`)."""
        self._adopted = 0
        """The last of those the controller has taken up from the store."""
        self._adopted_at: tuple[float, tuple[tuple[str, int], ...]] | None = None
        """When the store was last read for pending rollouts, and the catalog's revisions
        then (None: not yet since this fleet loaded its state)."""
        self._adoption = asyncio.Event()
        """Set (and replaced) whenever the controller took up what was committed."""
        self._running = False
        """Whether `run` is looping (a controller ticked by hand adopts when ticked)."""
        self.leading: Callable[[], bool] = lambda: True
        """Whether this fleet leads now (fleet_svc.leadership); a tick does nothing while not."""
        self.on_fenced: Callable[[NotLeader], None] = lambda exc: None
        """Called when a write met the store's fence: another fleet leads."""
        self._failing = ""
        """The store problem the last tick failed with ("" when it did not)."""
        self._reloaded_s = self._clock.monotonic()
        """When this fleet last loaded its state from the store (started or took over)."""
        self._trusting = True
        """Whether replicas on nodes not heard from are still routed (see _unknown_node_phase)."""
        self.remote: RemoteNodes | None = None
        """Agents other fleets hold, heard through the store (fleets sharing one store)."""
        self._load()

    def wall_of(self, monotonic_s: float) -> float:
        """A monotonic reading as wall-clock time (for a timestamp people read)."""
        return self._clock.wall() - (self._clock.monotonic() - monotonic_s)

    # -- persistence ---------------------------------------------------------------------

    def _load(self) -> None:
        """Replicas the fleet accepted before a restart; their nodes are unknown until their
        agents say hello (and are lost if they never do). Durations go on from the stored
        wall-clock times."""
        now, wall = self._clock.monotonic(), self._clock.wall()
        for rec in self._store.list_replicas():
            r = replica_of(rec)
            r = replace(r, entered_s=now - max(wall - r.since_s, 0.0))
            self.state.replicas[r.id] = r
            for name in r.nodes:  # a gang's members' nodes too: each is lost if it never returns
                if name not in self.state.nodes:
                    self.state.nodes[name] = NodeView(name=name, last_heard_s=now)
        self._rollouts.load()
        log.info(
            "fleet_state_loaded", replicas=len(self.state.replicas), rollouts=len(self.rollouts)
        )

    def reload(self) -> None:
        """Forget what is held in memory and load it again from the store: a fleet elected
        leader takes over the state its predecessor left (its agents say hello to it next).
        Endpoints the store holds READY stay routable meanwhile: they were the last leader's
        word, and the gateway should not lose them for a change of leader."""
        self.state = FleetState()
        self._unsaved = {}
        self._failing = ""
        self.desired = DesiredSets(self._store)
        self._reloaded_s = self._clock.monotonic()
        self._trusting = True
        self._adopted_at = None
        if self.remote is not None:
            self.remote.reset()
        self._load()
        self._publish_all()

    def followed(self) -> tuple[list[ReplicaRecord], list[RolloutRecord]]:
        """The rows `follow` reads (store calls only: a follower runs this off the loop)."""
        return self._store.list_replicas(), self._store.list_rollouts()

    def follow(self, rows: tuple[list[ReplicaRecord], list[RolloutRecord]] | None = None) -> None:
        """Refresh replicas and running rollouts from the store (or from the `followed` rows
        given), for a fleet that does not lead: its reads (ListReplicas, GetRollout) and
        watches (WatchReplicas, WatchRollout) then answer what the leader wrote."""
        stored, rollouts = rows if rows is not None else self.followed()
        now, wall = self._clock.monotonic(), self._clock.wall()
        replicas = {}
        for rec in stored:
            r = replica_of(rec)
            replicas[r.id] = replace(r, entered_s=now - max(wall - r.since_s, 0.0))
        self.state.replicas = replicas
        self._publish_all()
        self._rollouts.follow(rollouts)
        self._settle_weights()

    def _publish_all(self) -> None:
        for rid in set(self.hub.ready) - set(self.state.replicas):
            self.hub.remove(rid, EndpointReason.DRAINING)
        for r in self.state.replicas.values():
            self._publish(r)

    async def flush(self) -> None:
        """Write every replica changed since the last flush, in one transaction (and again,
        up to FLUSH_ROUNDS, for what agents changed while it was written).

        Called at the end of each tick before any desired set is sent (so an agent never runs
        a replica the store does not hold). An observation not yet flushed when the fleet dies
        is lost, and told again by its agent.
        """
        for _ in range(FLUSH_ROUNDS):
            if not self._unsaved:
                return
            batch, self._unsaved = self._unsaved, {}
            puts = [replica_record(r) for r in batch.values() if r is not None]
            deletes = [rid for rid, r in batch.items() if r is None]
            try:
                await self.calls.run(self._store.write_replicas, puts, deletes)
            except BaseException:
                # A store that is down keeps the changes for the next flush (the tick fails
                # before dispatch, so no agent is told of a replica not stored); what changed
                # meanwhile is newer.
                self._unsaved = {**batch, **self._unsaved}
                raise

    # -- the one place replicas change -----------------------------------------------------

    def _put(self, r: ReplicaState) -> None:
        old = self.state.replicas.get(r.id)
        if old is None or (_going(r) and not _going(old)):
            # A new command for the agent (start it, or stop it): the request behind the
            # model's running rollout, if any.
            ro = self._rollouts.of_model(r.model)
            r = replace(r, trace=ro.trace if ro is not None else "")
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
        return any(w.model == model and w.profile == profile for w in self._wants())

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
        new = replace(
            r,
            phase=phase,
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
            new = replace(new, since_s=self._clock.wall(), entered_s=self._clock.monotonic())
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
            log.info("replica_forgotten", replica=replica_id, model=r.model, phase=r.phase.value)

    def _apply(self, action: Action) -> None:
        """Carry out one action a planning function returned."""
        if isinstance(action, Create):
            new = replace(action.replica, since_s=self._clock.wall())
            self._put(new)
            log.info("replica_created", replica=new.id, model=new.model, profile=new.profile)
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
                self._put(replace(r, reason=action.reason))
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
                self._put(replace(r, retire=True))
        elif isinstance(action, Retire):
            self.retire(action.replica_id, action.reason)
        elif isinstance(action, Forget):
            self._forget(action.replica_id)

    def _apply_all(self, actions: Iterable[Action]) -> None:
        for action in actions:
            self._apply(action)

    def retire(self, replica_id: str, reason: str) -> None:
        """Take a replica out: drain a READY one first, drop a PENDING one, stop the rest."""
        r = self.state.replicas.get(replica_id)
        if r is not None:
            self._apply_all(retirement(r, reason))

    # -- events from agents (facts; applied at once, the loop is woken) -------------------

    def _heard(self, node: str) -> NodeView | None:
        view = self.state.nodes.get(node)
        if view is not None:
            view.last_heard_s = self._clock.monotonic()
        return view

    def agent_connected(
        self, view: NodeView, observed: Iterable[Observed], link: AgentLink
    ) -> None:
        """An agent said hello: its node's cards and the replicas it runs.

        One connection per node: a newer one replaces the older, which is closed.
        """
        old_link = self.state.links.get(view.name)
        if old_link is not None and old_link is not link:
            old_link.close("replaced by a newer connection from the same node")
            log.warning("agent_replaced", node=view.name)
        self.state.links[view.name] = link
        view.connected = True
        view.last_heard_s = self._clock.monotonic()
        view.phase = NodePhase.READY
        self.state.nodes[view.name] = view
        self.desired.reconnected(view.name)
        seen = set()
        for o in observed:
            seen.add(o.replica_id)
            self.observe(view.name, o)
        self._apply_all(
            missing_from_hello(list(self.state.replicas.values()), view.name, frozenset(seen))
        )
        self._publish_node(view.name)  # READY again: its running replicas are routable again
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
        view = self._heard(node)
        if view is None:
            return
        if cards:
            view.cards = tuple(cards)
        view.memory_free_bytes = memory_free_bytes

    def observe(self, node: str, o: Observed) -> None:
        """An agent's report of one replica."""
        self._heard(node)
        r = self.state.replicas.get(o.replica_id)
        if r is not None and r.gang and node in r.nodes:
            # A gang member's report: the gang's phase follows from all of them.
            if o.log_tail:
                self.state.observed_logs[r.id] = o.log_tail
            gang = gang_reported(r, node, o)
            self._apply_all(gang)
            now = self.state.replicas.get(r.id)
            if now is not None and now.phase is P.READY and now.id not in self.hub.ready:
                self._publish(now)
            if gang:
                self.wake()
            return
        if r is not None and r.node != node:
            # A node reports only its own replicas (as Kubernetes' node authorizer limits a
            # kubelet to its pods): one placed elsewhere is not this agent's to describe.
            log.warning(
                "replica_report_dropped",
                node=node,
                replica_id=o.replica_id,
                placed_on=r.node,
                phase=o.phase.value,
            )
            return
        if r is not None and r.node == node and o.log_tail:
            self.state.observed_logs[r.id] = o.log_tail
        change = reported(r, node, o)
        if change is None:
            return
        self._apply(change)
        now = self.state.replicas.get(change.replica_id)
        if now is not None and now.phase is P.READY and now.id not in self.hub:
            # READY since before a fleet restart: routable again only once its agent says so.
            self._publish(now)
        self.wake()

    def acknowledged(self, node: str, version: int, rejected: Sequence[Rejection]) -> None:
        """An agent acknowledged a desired version, refusing some replicas."""
        self.desired.acknowledged(node, version)
        self._apply_all(refused(self.state.replicas, node, rejected))
        if rejected:
            self.wake()

    # -- rollouts ------------------------------------------------------------------------

    @property
    def rollouts(self) -> dict[str, Rollout]:
        """Running rollouts by id."""
        return self._rollouts.running

    @property
    def rollout_listeners(self) -> list[Callable[[Rollout], None]]:
        """Called with each rollout as it ends (fleet_svc.rollouts.Rollouts.on_end)."""
        return self._rollouts.on_end

    @property
    def rollout_event_listeners(self) -> list[Callable[[Rollout, RolloutEvent], None]]:
        """Called with each event a rollout records (fleet_svc.rollouts.Rollouts.on_event)."""
        return self._rollouts.on_event

    @property
    def rollout_signal(self) -> asyncio.Event:
        """Set (and replaced) whenever a rollout records events."""
        return self._rollouts.signal

    @property
    def managed(self) -> frozenset[tuple[str, str]]:
        """(model, profile) pairs a running rollout is changing: their counts are its own."""
        return self._rollouts.managed

    def running_rollout(self, model: str) -> Rollout | None:
        """The rollout changing `model` now, if any."""
        return self._rollouts.of_model(model)

    def changed(self) -> int:
        """The API side committed a change (a pending rollout, a request, a revision): wake
        the loop to take it up from the store.

        Returns:
            A ticket `adopted` waits for.
        """
        self._asked += 1
        self.wake()
        return self._asked

    async def adopted(self, ticket: int, timeout_s: float) -> bool:
        """Wait until a tick took up everything committed before `ticket` was given, at most
        `timeout_s`; False at once when no loop runs here (a follower, or a controller ticked
        by hand) and after the timeout (the store is failing: the next tick takes it up)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._adopted < ticket:
            left = deadline - asyncio.get_running_loop().time()
            if not self._running or not self.leading() or left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._adoption.wait(), left)
        return True

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
        self._running = True
        try:
            await self._loop()
        finally:
            self._running = False

    async def _loop(self) -> None:
        burst = 0
        while True:
            if not self._wake.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self._next_wait_s())
            self._wake.clear()
            before = self._changes + self._rollouts.saves
            try:
                if self.leading():
                    if self.remote is not None:
                        await self.remote.fetch()
                    await self.step()
                    if self.remote is not None:
                        await self.remote.push()
                    self._tick_passed()
            except StoreError as exc:
                self._tick_failed(exc)
            except Exception:
                log.exception("tick_failed")
            burst = burst + 1 if self._changes + self._rollouts.saves != before else 0
            if 0 < burst < MAX_BURST:
                self._wake.set()
            await asyncio.sleep(0)  # let the streams and RPCs run between ticks

    def _tick_failed(self, exc: StoreError) -> None:
        """One log line per change of store problem, not a traceback every tick (the store
        is down for as long as it is; store_health says so too)."""
        if isinstance(exc, NotLeader):
            log.warning("tick_fenced", problem=exc.problem)
            self.on_fenced(exc)
            return
        if exc.problem != self._failing:
            log.error("tick_failed", store=exc.where, problem=exc.problem)
            self._failing = exc.problem

    def _tick_passed(self) -> None:
        if self._failing:
            log.info("tick_recovered", problem_was=self._failing)
            self._failing = ""

    def _next_wait_s(self) -> float:
        """Until the next tick: the interval, or sooner when a drain delay ends."""
        now = self._clock.monotonic()
        wait = self._tick_s
        for r in self.state.replicas.values():
            if r.phase is P.DRAINING:
                wait = min(wait, max(r.entered_s + self._drain_s - now, 0.0) + 0.001)
        return wait

    def tick(self) -> None:
        """One tick run at once, for a store called on the loop (SQLite; tests drive the
        controller so). On PostgreSQL `step` is awaited instead."""
        inline(self.step())

    async def step(self) -> None:
        """Snapshot -> plan -> dispatch."""
        if self.remote is not None:
            self.remote.apply_fetched(self, self._clock.wall())
        now = self._clock.monotonic()
        if self._trusting and now - self._reloaded_s >= self.liveness.grace_s:
            self._trusting = False  # nodes still silent now leave routing
            self._publish_all()
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
                self._publish_node(view.name)
        wants = self._wants()
        await self._adopt(wants, now)
        self._apply_all(
            await self._rollouts.advance(
                now, wants, self.state.replicas, self.state.nodes, self.state.observed_logs
            )
        )
        self._apply_all(
            plan_actions(
                wants,
                self.state.replicas,
                self.state.nodes,
                now,
                drain_s=self._drain_s,
                new_id=self._new_id,
                managed=self.managed,
            )
        )
        self._settle_weights()
        await self.flush()
        await self._dispatch(now)

    def _settle_weights(self) -> None:
        """Publish the weights of the models whose canary moved (domain.canary)."""
        while self._rollouts.settle:
            self.hub.reweigh(self._rollouts.settle.pop())

    async def _adopt(self, wants: list[ProfileWant], now: float) -> None:
        """Take up what the API side committed (Rollouts.adopt), when something may be
        waiting: a change was announced, the catalog's revisions moved, or ADOPT_POLL_S
        passed."""
        revisions = tuple(sorted({(w.model, w.revision) for w in wants}))
        last = self._adopted_at
        if (
            self._adopted == self._asked
            and last is not None
            and last[1] == revisions
            and now - last[0] < ADOPT_POLL_S
        ):
            return
        asked = self._asked
        self._apply_all(await self._rollouts.adopt(wants, self.state.replicas))
        self._adopted, self._adopted_at = asked, (now, revisions)
        adoption, self._adoption = self._adoption, asyncio.Event()
        adoption.set()

    async def _dispatch(self, now: float) -> None:
        """Send each connected node its desired set when it changed (or was not acked), once
        the newest version is stored."""
        desired = desired_by_node(self.state.replicas.values())
        sends = self.desired.due(desired, list(self.state.links), now)
        if sends:
            await self.calls.run(self.desired.remember, sends)
        # The traced stops by node, gathered once (not once a node: a change of 1,000
        # replicas is 1,000 sends).
        stopping: dict[str, dict[str, str]] = {}
        if sends:
            for r in self.state.replicas.values():
                if r.trace and r.phase not in RUNNING:
                    for name in r.nodes:
                        stopping.setdefault(name, {})[r.id] = r.trace
        for send in sends:
            link = self.state.links.get(send.node)
            if link is None:  # its agent left while the version was stored
                continue
            link.send_desired(send.version, send.replicas, stopping.get(send.node, {}))
            log.info(
                "desired_sent", node=send.node, version=send.version, replicas=len(send.replicas)
            )
        self._apply_all(
            stopped_with_their_node(list(self.state.replicas.values()), self.state.nodes)
        )
