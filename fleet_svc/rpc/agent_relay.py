"""Where an agent's stream meets the fleet: the controller, while this fleet leads; the store,
while it follows.

Every fleet serves agents' streams. Leading, the relay hands each stream's events to the
controller, which sends desired sets straight down the stream. Following, it writes each
node's report to the store (fleet_svc.store.base.NodeReport: the Hello's view, the latest
report of each replica, the last acknowledgement, when the agent was last heard) and sends
the agent each desired set the leader's controller wrote for that node after the stream was
recorded; the leader reads the reports (fleet_svc/nodelink/remote.py). A change of leader
moves no stream: the relay hands its streams to the controller when this fleet is elected,
and writes them all to the store when it is deposed.

A node's row is written when its report changes (a hello, a replica's report, an
acknowledgement, the stream's end), in batches at most FLUSH_S after the event; a heartbeat's
news (its cards' use, free memory) waits for the next beat. Every heartbeat interval the
relay writes its beat (fleet_svc.store.base.NodeBeat): one row holding when each agent held
here was last heard, in place of every node's row again (the leader treats a `heard_at` that
stops moving as a silent node, and otherwise would read a thousand unchanged rows an interval
for a thousand agents). Store calls run off the loop (fleet_svc.store_calls)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from fleet_svc.controller import Controller
from fleet_svc.domain.nodes import Liveness, NodeView
from fleet_svc.domain.replicas import ReplicaState
from fleet_svc.domain.reports import Observed
from fleet_svc.nodelink.reports import report_doc
from fleet_svc.rpc.agent_stream import StreamLink, desired_message
from fleet_svc.store.base import DesiredRecord, NodeBeat, NodeReport, Store, StoreError
from fleet_svc.store_calls import StoreCalls
from llmgw.agent.v1 import agent_pb2
from llmgw.card import Card
from llmgw.clock import Clock
from llmgw.rejection import Rejection

log = structlog.get_logger(__name__)

FLUSH_S = 0.05
"""The longest an agent's report waits before it is written (while following)."""
PULL_S = 1.0
"""Besides the store's notifications, how often a follower reads desired sets written."""

FORWARDS_NAMED = 8
"""Desired sets one read forwards node by node at INFO; past this many, one line counts them
(a change of 1,000 nodes held here is 1,000 sets at once) and each node's goes to DEBUG."""

DONE_KEPT_S = 5.0
"""How long a replica reported STOPPED or FAILED stays in its node's row after the row carrying
it was written: the leader reads rows once a tick (0.5 s), and a row written again without it
sooner could replace it before the leader read it, so the leader would never hear it stop."""

MAX_OBSERVED = 1024
"""Replicas a stream's row keeps reports of: a node runs a handful; past this many, reports of
more are dropped and logged (an agent cannot grow its row without bound)."""

_DONE = frozenset({"STOPPED", "FAILED"})


def encode_desired(
    node: str, version: int, replicas: Sequence[ReplicaState], stop_traces: Mapping[str, str]
) -> bytes:
    """A node's desired set as the stored message its holder forwards as is."""
    return desired_message(node, version, replicas, stop_traces).SerializeToString()


@dataclass
class _Held:
    """One stream this fleet holds."""

    link: StreamLink
    view: NodeView
    stream: str = field(default_factory=lambda: uuid.uuid4().hex)
    observed: dict[str, Observed] = field(default_factory=dict)
    ack_version: int = 0
    rejected: tuple[Rejection, ...] = ()
    heard_at: float = 0.0
    connected: bool = True
    done_at: dict[str, float] = field(default_factory=dict)
    """Replicas reported gone: when the row carrying that was first written."""
    since_seq: int | None = None
    """Desired sets written after this seq are this stream's (None: not known yet)."""
    doc: dict[str, Any] | None = None
    """Its row's report as last written (None: changed since, to be written)."""

    def report(self) -> dict[str, Any]:
        """The row's report (built again only after a change)."""
        if self.doc is None:
            self.doc = report_doc(
                self.view, self.observed.values(), self.ack_version, self.rejected
            )
        return self.doc


class NodeRelay:
    """The agents' streams this fleet holds (see the module docstring)."""

    def __init__(
        self, store: Store, clock: Clock, holder: str, liveness: Liveness, calls: StoreCalls
    ) -> None:
        self._store = store
        self._clock = clock
        self.holder = holder
        self.liveness = liveness
        self._calls = calls
        self._held: dict[str, _Held] = {}
        self._gone: list[_Held] = []
        self._dirty: set[str] = set()
        self._leader: Controller | None = None
        self._seen: int | None = None
        """The last desired seq read (None: not read since this fleet began following)."""
        self._pulled_at = 0.0
        self._beat_at = 0.0
        """When the last beat was written (its wall clock; 0: one is due)."""
        self._wake = asyncio.Event()
        self._pull = asyncio.Event()
        self._failing = ""

    @property
    def held(self) -> int:
        """How many agents' streams this fleet holds."""
        return len(self._held)

    @property
    def leading(self) -> bool:
        """Whether events go to this fleet's controller."""
        return self._leader is not None

    def close_streams(self) -> None:
        """End every stream held here (the fleet stops)."""
        for held in list(self._held.values()):
            held.link.close("")

    # -- leadership ----------------------------------------------------------------------

    def lead(self, controller: Controller) -> None:
        """This fleet leads: its controller hears every stream held here, each as a hello."""
        self._leader = controller
        for held in self._held.values():
            controller.agent_connected(held.view, list(held.observed.values()), held.link)
            if held.ack_version:
                controller.acknowledged(held.view.name, held.ack_version, held.rejected)

    def follow(self) -> None:
        """This fleet follows: every stream held here is written to the store, and only
        desired sets written from now on are forwarded."""
        self._leader = None
        self._seen = None
        self._beat_at = 0.0
        for node, held in self._held.items():
            held.since_seq = None
            held.doc = None  # its view was the controller's to change while this fleet led
            self._dirty.add(node)
        self._pull.set()
        self._wake.set()

    def notified(self) -> None:
        """The store said the leader wrote: read the desired sets."""
        self._pull.set()
        self._wake.set()

    # -- a stream's events ---------------------------------------------------------------

    def agent_connected(
        self, view: NodeView, observed: Iterable[Observed], link: StreamLink
    ) -> None:
        """A hello on a stream here (a newer one from the same node replaces the older)."""
        old = self._held.get(view.name)
        if old is not None and old.link is not link:
            old.link.close("replaced by a newer connection from the same node")
        reported = list(observed)
        seen = {o.replica_id: o for o in itertools.islice(reported, MAX_OBSERVED)}
        held = _Held(link, view, observed=seen, heard_at=self._clock.wall(), since_seq=self._seen)
        self._held[view.name] = held
        if self._leader is not None:
            self._leader.agent_connected(view, reported, link)
        else:
            self._changed(view.name)

    def agent_disconnected(self, node: str, link: StreamLink) -> None:
        """A stream here ended."""
        held = self._held.get(node)
        if held is None or held.link is not link:
            return
        del self._held[node]
        if self._leader is not None:
            self._leader.agent_disconnected(node, link)
            return
        held.connected = False
        held.heard_at = self._clock.wall()
        self._dirty.discard(node)
        self._gone.append(held)
        self._wake.set()

    def heartbeat(self, node: str, cards: Sequence[Card], memory_free_bytes: int) -> None:
        """A heartbeat: its time goes in the next beat, its news (cards, free memory) in the
        node's row written with that beat."""
        held = self._held.get(node)
        if held is None:
            return
        held.heard_at = self._clock.wall()
        if cards and tuple(cards) != held.view.cards:
            held.view.cards = tuple(cards)
            held.doc = None
        if memory_free_bytes != held.view.memory_free_bytes:
            held.view.memory_free_bytes = memory_free_bytes
            held.doc = None
        if self._leader is not None:
            self._leader.heartbeat(node, cards, memory_free_bytes)

    def observe(self, node: str, o: Observed) -> None:
        """A report of one replica."""
        held = self._held.get(node)
        if held is None:
            return
        held.heard_at = self._clock.wall()
        if o.replica_id not in held.observed and len(held.observed) >= MAX_OBSERVED:
            log.warning("replica_report_dropped", node=node, replica_id=o.replica_id[:64])
        else:
            held.observed[o.replica_id] = o
            held.done_at.pop(o.replica_id, None)
            held.doc = None
        if self._leader is not None:
            self._leader.observe(node, o)
        else:
            self._changed(node)

    def acknowledged(self, node: str, version: int, rejected: Sequence[Rejection]) -> None:
        """An acknowledgement of a desired set."""
        held = self._held.get(node)
        if held is None:
            return
        held.heard_at = self._clock.wall()
        held.ack_version, held.rejected = version, tuple(rejected)
        held.doc = None
        if self._leader is not None:
            self._leader.acknowledged(node, version, rejected)
        else:
            self._changed(node)

    def _changed(self, node: str) -> None:
        self._dirty.add(node)
        self._wake.set()

    # -- the store, while following ------------------------------------------------------

    async def run(self) -> None:
        """Write reports and forward desired sets while following, until cancelled."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._next_wait_s())
            self._wake.clear()
            try:
                if self._leader is None and self._pull.is_set():
                    await self._forward()  # the agents wait on these: before any write
                await asyncio.sleep(FLUSH_S)  # gather what else comes in the meantime
                if self._leader is not None:
                    self._gone.clear()
                    self._dirty.clear()
                    continue
                await self._write()
                await self._forward()
                if self._failing:
                    log.info("relay_recovered")
                    self._failing = ""
            except StoreError as exc:
                if exc.problem != self._failing:
                    log.warning("relay_failed", problem=exc.problem)
                    self._failing = exc.problem
                self._wake.set()
                await asyncio.sleep(PULL_S)

    def _next_wait_s(self) -> float:
        if self._leader is not None or not self._held:
            return PULL_S
        due_s = self._beat_at + self.liveness.interval_s - self._clock.wall()
        return max(min(due_s, PULL_S), 0.0)

    async def _write(self) -> None:
        """Write the rows of the nodes whose report changed (and of the streams that ended),
        and the beat when one is due (an interval after the last), in one transaction."""
        now = self._clock.wall()
        beat_due = bool(self._held) and now - self._beat_at >= self.liveness.interval_s
        if beat_due:
            changed = [h for node, h in self._held.items() if node in self._dirty or h.doc is None]
        else:
            changed = [h for node in self._dirty if (h := self._held.get(node)) is not None]
        batch = [*self._gone, *changed]
        beat = (
            NodeBeat(self.holder, {node: h.heard_at for node, h in self._held.items()}, now)
            if beat_due
            else None
        )
        if not batch and beat is None:
            return
        rows = [self._row(h) for h in batch]
        dirty = set(self._dirty)
        await self._calls.run(self._store.put_node_reports, rows, beat)
        self._gone = [h for h in self._gone if h not in batch]
        self._dirty -= dirty
        if beat is not None:
            self._beat_at = now
        for h in changed:
            for rid, o in h.observed.items():
                if o.phase.value in _DONE:
                    h.done_at.setdefault(rid, now)
        if beat is not None:
            for h in self._held.values():
                # A replica reported gone is no news once the leader had DONE_KEPT_S to read it.
                for rid in [rid for rid, at in h.done_at.items() if now - at >= DONE_KEPT_S]:
                    del h.done_at[rid]
                    h.observed.pop(rid, None)
                    h.doc = None

    def _row(self, h: _Held) -> NodeReport:
        return NodeReport(
            node=h.view.name,
            holder=self.holder,
            stream=h.stream,
            connected=h.connected,
            heard_at=h.heard_at,
            report=h.report(),
        )

    async def _forward(self) -> None:
        now = self._clock.monotonic()
        if not self._pull.is_set() and self._seen is not None and now - self._pulled_at < PULL_S:
            return
        self._pull.clear()
        self._pulled_at = now
        records = await self._calls.run(self._store.list_desired, self._seen or 0)
        top = max((r.seq for r in records), default=self._seen or 0)
        if self._seen is None:
            # The first read since following began: what was written before is not for the
            # streams held now (the leader sends each its full set once it reads their rows).
            self._seen = top
            for held in self._held.values():
                if held.since_seq is None:
                    held.since_seq = top
            return
        self._seen = top
        forwarded: list[DesiredRecord] = []
        for r in records:
            at = self._held.get(r.node)
            if at is None or at.since_seq is None or r.seq <= at.since_seq:
                continue
            msg = agent_pb2.ConnectResponse()
            try:
                msg.ParseFromString(r.body)
            except Exception:
                log.warning("desired_set_unreadable", node=r.node, seq=r.seq)
                continue
            at.link.queue.put_nowait(msg)
            forwarded.append(r)
        _log_forwarded(forwarded)


def _log_forwarded(forwarded: Sequence[DesiredRecord]) -> None:
    """The desired sets one read forwarded: a line each when few, else one line counting
    them (each node's at DEBUG)."""
    named = len(forwarded) <= FORWARDS_NAMED
    for r in forwarded:
        (log.info if named else log.debug)("desired_forwarded", node=r.node, version=r.version)
    if not named:
        log.info(
            "desired_sets_forwarded",
            nodes=len(forwarded),
            versions=f"{min(r.version for r in forwarded)}-{max(r.version for r in forwarded)}",
        )
