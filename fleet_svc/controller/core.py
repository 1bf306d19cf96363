"""The fleet's controller: the one writer of fleet state, ticking snapshot -> plan -> dispatch.

What to do is decided by pure functions (domain.control.plan_actions, domain.rollout,
domain.reports); this module keeps the state they read, ticks, persists, and tells the agents
(nodelink.desired). The actions are applied through the transition table in
fleet_svc.controller.writes; agents' events come in through fleet_svc.controller.agent_events.

A tick runs on the event loop; its store calls (the catalog's wants, adopting and saving
rollouts, the replica flush, the desired version) go through `calls`: on PostgreSQL one thread
of the controller's own, so they never block the loop and reach the store one at a time, in the
tick's order (a fenced write never overtakes an earlier one). Agents' reports go on meanwhile;
one tick is awaited to its end before the next begins. A fleet taking over as leader loads its
state through `calls` too (`reload`)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import structlog

from fleet_svc.controller.agent_events import AgentEvents
from fleet_svc.controller.writes import FleetState
from fleet_svc.domain.catalog import ProfileWant
from fleet_svc.domain.control import plan_actions
from fleet_svc.domain.nodes import Liveness, NodeView, node_phase
from fleet_svc.domain.phases import RUNNING, ReplicaPhase
from fleet_svc.domain.replicas import ReplicaState, amended
from fleet_svc.domain.reports import stopped_with_their_node
from fleet_svc.domain.rollout import Event as RolloutEvent
from fleet_svc.domain.rollout import Rollout
from fleet_svc.nodelink.desired import DesiredSets, Send, desired_by_node
from fleet_svc.nodelink.remote import RemoteNodes
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
the catalog's revisions moved (a pending rollout commits with its revision; not for a revision
this fleet committed handing nothing over), and otherwise at least this often (what another
fleet committed just before it lost its lease)."""
REMOTE_READ_S = 0.025
"""The least time between two reads of the node reports other fleets wrote for their agents
(each holder writes them at most every fleet_svc.rpc.agent_relay.FLUSH_S, 50 ms): a tick sooner
after the last read (the leader ticks for every change and every report its own agents send)
leaves them for the tick the loop then wakes for, one store round trip less a change."""
FLUSH_ROUNDS = 3
"""Flushes a tick makes at most before dispatching, while agents' reports keep changing
replicas during the writes (those changes are of stored replicas: only a tick creates or
places one)."""


@dataclass
class _Stored:
    """What a fleet loads its state from (Controller._stored)."""

    replicas: list[ReplicaRecord]
    rollouts: list[RolloutRecord]
    version: int | None = None
    """The desired sets' last version (None: not read)."""
    wants: list[ProfileWant] | None = None
    """The catalog's wants (None: not read)."""


class Controller(AgentEvents):
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
        kept_wants: Callable[[], list[ProfileWant] | None] | None = None,
    ) -> None:
        self._store = store
        self._wants = wants
        self._wants_read: list[ProfileWant] | None = None
        """The wants as the last tick (or state load) read them."""
        self._kept_wants = kept_wants or (lambda: None)
        """The wants when `wants` would answer them without a store call (else None): a
        tick then needs no hop to the controller's thread for them."""
        self.hub = hub or EndpointHub(clock.wall)
        self._model_at = model_at or (lambda name, revision: None)
        """A model as one of its revisions was (for an endpoint's context and max output)."""
        self.liveness = liveness or Liveness()
        self._drain_s = drain_s
        self.start_timeout_s = start_timeout_s
        """How long a rollout's new replica may take to turn healthy."""
        self._tick_s = tick_s
        self._clock = clock
        # 40 random bits, as the first ten hex digits of a uuid4 are, without making one.
        self._new_id = new_id or (lambda: "r-" + secrets.token_hex(5))
        self.state = FleetState()
        self.calls = StoreCalls(store, workers=1, name="fleet-controller")
        """Where the controller's store calls run: one thread, so they keep their order."""
        self.desired = DesiredSets(store)
        self._changes = 0
        """Counts writes of fleet state; a tick that moved it is followed by another."""
        self._unsaved: dict[str, ReplicaState | None] = {}
        """Replicas changed (None: forgotten) since the last flush to the store."""
        self._sets_moved = True
        """Whether a node's desired set may have changed since the last dispatch (a replica
        placed, started, stopped or forgotten, an agent come or gone, the state loaded)."""
        self._wake = asyncio.Event()
        self._rollouts = Rollouts(store, self.calls, clock, self._new_id)
        self.hub.weigh = self._rollouts.weights  # a canary's step splits its model's weight
        self._asked = 0
        """Counts changes the API side committed and announced (`changed`)."""
        self._adopted = 0
        """The last of those the controller has taken up from the store."""
        self._adopted_at: tuple[float, tuple[tuple[str, int], ...]] | None = None
        """When the store was last read for pending rollouts, and the catalog's revisions
        since (None: not yet since this fleet loaded its state)."""
        self._plain: set[tuple[str, int]] = set()
        """(model, revision)s the API side committed with nothing for the controller
        (`handed_nothing`): their moving the revisions is no reason to read the store."""
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
        self._remote_read_s = float("-inf")
        """When `remote` last read the store (monotonic)."""
        self._remote_owed = False
        """Whether a tick left the read of `remote` for later (REMOTE_READ_S)."""
        self._load()

    def wall_of(self, monotonic_s: float) -> float:
        """A monotonic reading as wall-clock time (for a timestamp people read)."""
        return self._clock.wall() - (self._clock.monotonic() - monotonic_s)

    # -- persistence ---------------------------------------------------------------------

    def _load(self) -> None:
        """Replicas the fleet accepted before a restart (read as it starts, before it
        serves)."""
        self._loaded(self._stored())

    def _stored(self) -> _Stored:
        """The rows a fleet loads its state from (store calls only)."""
        return _Stored(self._store.list_replicas(), self._store.list_rollouts())

    def _stored_for_takeover(self) -> _Stored:
        """The rows a fleet taking over loads, its desired sets' last version, the wants, and
        the models of the replicas' revisions (so publishing their endpoints makes no store
        call): store calls only, run off the loop on PostgreSQL."""
        stored = self._stored()
        stored.version = DesiredSets.stored_version(self._store)
        stored.wants = self._wants()
        for key in sorted({(rec.model, rec.revision) for rec in stored.replicas}):
            self._model_at(*key)
        return stored

    def _loaded(self, stored: _Stored) -> None:
        """Take the state from the stored rows: the nodes of replicas are unknown until their
        agents say hello (and are lost if they never do). Durations go on from the stored
        wall-clock times."""
        now, wall = self._clock.monotonic(), self._clock.wall()
        self._sets_moved = True
        for rec in stored.replicas:
            r = replica_of(rec)
            r = amended(r, entered_s=now - max(wall - r.since_s, 0.0))
            self.state.replicas[r.id] = r
            for name in r.nodes:  # a gang's members' nodes too: each is lost if it never returns
                if name not in self.state.nodes:
                    self.state.nodes[name] = NodeView(name=name, last_heard_s=now)
        self._rollouts.load(stored.rollouts)
        log.info(
            "fleet_state_loaded", replicas=len(self.state.replicas), rollouts=len(self.rollouts)
        )

    async def reload(self) -> None:
        """Forget what is held in memory and load it again from the store: a fleet elected
        leader takes over the state its predecessor left (its agents say hello to it next).
        The rows are read off the loop (on PostgreSQL), and only then is the state replaced,
        at once: until then reads answer from the state followed so far. Endpoints the store
        holds READY stay routable meanwhile: they were the last leader's word, and the gateway
        should not lose them for a change of leader."""
        stored = await self.calls.run(self._stored_for_takeover)
        self.state = FleetState()
        self._unsaved = {}
        self._failing = ""
        self.desired = DesiredSets(self._store, version=stored.version)
        self._wants_read = stored.wants
        self._reloaded_s = self._clock.monotonic()
        self._trusting = True
        self._adopted_at = None
        self._plain = set()
        if self.remote is not None:
            self.remote.reset()
        self._remote_read_s, self._remote_owed = float("-inf"), False
        self._loaded(stored)
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
            replicas[r.id] = amended(r, entered_s=now - max(wall - r.since_s, 0.0))
        self.state.replicas = replicas
        self._sets_moved = True
        self._publish_all()
        self._rollouts.follow(rollouts)
        self._settle_weights()

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

    def handed_nothing(self, revisions: Iterable[tuple[str, int]]) -> None:
        """The API side committed these (model, revision)s with no rollout or request for the
        controller: wake the loop for the wants, with no need to look in the store for
        pending work because they moved (nothing can wait there for a revision whose
        transaction wrote none)."""
        self._plain.update(revisions)
        self.wake()

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
                    if self.remote is not None and self._remote_due():
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

    def _remote_due(self) -> bool:
        """Whether this tick reads the node reports other fleets wrote (REMOTE_READ_S since
        the last read), else owes that read to a tick the loop wakes for."""
        now = self._clock.monotonic()
        self._remote_owed = now - self._remote_read_s < REMOTE_READ_S
        if not self._remote_owed:
            self._remote_read_s = now
        return not self._remote_owed

    def _next_wait_s(self) -> float:
        """Until the next tick: the interval, or sooner when a drain delay ends or a read of
        the other fleets' node reports was put off."""
        now = self._clock.monotonic()
        wait = self._tick_s
        if self._remote_owed:
            wait = min(wait, max(self._remote_read_s + REMOTE_READ_S - now, 0.0) + 0.001)
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
        # A store call when the catalog changed: off the loop on PostgreSQL.
        wants = self._kept_wants()
        if wants is None:
            wants = await self.calls.run(self._wants)
        self._wants_read = wants
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
        if self._adopted == self._asked and last is not None and now - last[0] < ADOPT_POLL_S:
            moved = set(revisions) - set(last[1])
            gone = {model for model, _ in set(last[1]) - set(revisions)}
            if moved <= self._plain and gone <= {model for model, _ in self._plain}:
                # Nothing moved but to revisions this fleet committed handing nothing over.
                self._plain -= moved
                self._adopted_at = (last[0], revisions)
                return
        asked = self._asked
        self._apply_all(await self._rollouts.adopt(wants, self.state.replicas))
        self._plain = set()  # a read of the store explains every revision up to now
        self._adopted, self._adopted_at = asked, (now, revisions)
        adoption, self._adoption = self._adoption, asyncio.Event()
        adoption.set()

    async def _dispatch(self, now: float) -> None:
        """Send each connected node its desired set when it changed (or was not acked), once
        the newest version is stored."""
        sends: list[Send] = []
        if self._sets_moved or self.desired.resend_due(now):
            # Otherwise no set changed and none waits to be sent again: `due` would send
            # nothing, and working that out reads every replica and node (a tick for each
            # of 1,000 agents' reports during a change).
            self._sets_moved = False
            desired = desired_by_node(self.state.replicas.values())
            sends = self.desired.due(desired, list(self.state.links), now)
        if self.desired.store_due(sends):
            await self.calls.run(self.desired.remember, sends)
        # The traced stops by node, gathered once (not once a node: a change of 1,000
        # replicas is 1,000 sends).
        stopping: dict[str, dict[str, str]] = {}
        if sends:
            for r in self.state.replicas.values():
                if r.trace and r.phase not in RUNNING:
                    for name in r.nodes:
                        stopping.setdefault(name, {})[r.id] = r.trace
        sent: list[Send] = []
        for send in sends:
            link = self.state.links.get(send.node)
            if link is None:  # its agent left while the version was stored
                continue
            link.send_desired(send.version, send.replicas, stopping.get(send.node, {}))
            sent.append(send)
        _log_sent(sent)
        self._apply_all(
            stopped_with_their_node(list(self.state.replicas.values()), self.state.nodes)
        )


SENT_NAMED = 8
"""Desired sets a dispatch names node by node at INFO; past this many, one line counts them and
each node's goes to DEBUG (a change of 1,000 one-card replicas wrote 1,000 lines, about 10 ms
of the loop's time before any agent's write could start)."""


def _log_sent(sent: Sequence[Send]) -> None:
    """The desired sets one dispatch sent: a line each when few, else one line with the count,
    the versions' span and the replicas in all (each node's line at DEBUG)."""
    if len(sent) <= SENT_NAMED:
        for send in sent:
            log.info(
                "desired_sent", node=send.node, version=send.version, replicas=len(send.replicas)
            )
        return
    for send in sent:
        log.debug("desired_sent", node=send.node, version=send.version, replicas=len(send.replicas))
    log.info(
        "desired_sets_sent",
        nodes=len(sent),
        versions=f"{min(s.version for s in sent)}-{max(s.version for s in sent)}",
        replicas=sum(len(s.replicas) for s in sent),
    )
