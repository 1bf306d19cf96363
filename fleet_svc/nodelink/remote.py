"""The leader's side of agents whose streams other fleets hold: their nodes' reports read from
the store, their desired sets written to it. The store is the only hand-off; no fleet calls
another.

Each tick the leader reads the holders' beats and the node reports written since the last it
read (by seq) and turns them into the same events a stream on the leader gives its controller:
a report of a stream not seen before is a hello (the node's full desired set is sent again), a
later one of the same stream carries replica reports and acknowledgements. A node's desired set
goes to the store as a row the holding fleet forwards.

Freshness: every heartbeat interval each holder writes its beat, when each agent it holds last
spoke (`heard_at`); a node's row is written again only when its report changes. Only a
`heard_at` that moved is a heartbeat. One that stops moving (its holder died, or its agent is
silent) is a node gone silent: the controller's liveness marks it NOT_READY after the grace and
LOST later, exactly as for a silent stream here, while the agent reconnects to another fleet (a
new stream: a hello). Nodes whose agent was last heard (by row or by its holder's last beat)
longer ago than the grace are not taken for connected nodes when the leader loads them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import structlog

from fleet_svc.domain.nodes import Liveness, NodeView
from fleet_svc.domain.replicas import ReplicaState
from fleet_svc.domain.reports import Observed
from fleet_svc.nodelink.reports import NodeNews, news_of
from fleet_svc.store.base import DesiredRecord, NodeBeat, NodeReport, Store
from llmgw.card import Card
from llmgw.rejection import Rejection

log = structlog.get_logger(__name__)

Encode = Callable[[str, int, Sequence[ReplicaState], Mapping[str, str]], bytes]
"""A node's desired set (node, version, replicas, stop traces) as the message its agent is sent."""
T = TypeVar("T")


class Offload(Protocol):
    """Runs a function of store calls where it cannot block the loop (fleet_svc.store_calls)."""

    def __call__(self, fn: Callable[[], T], /) -> Awaitable[T]:
        """`fn()`, awaited."""
        ...


async def _on_the_loop(fn: Callable[[], T]) -> T:
    return fn()


class AgentEvents(Protocol):
    """What the controller hears of agents (fleet_svc.controller.Controller)."""

    def agent_connected(
        self, view: NodeView, observed: Iterable[Observed], link: StoredLink
    ) -> None:
        """A hello."""

    def agent_disconnected(self, node: str, link: StoredLink) -> None:
        """A stream ended."""

    def heartbeat(self, node: str, cards: Sequence[Card], memory_free_bytes: int) -> None:
        """A heartbeat."""

    def observe(self, node: str, o: Observed) -> None:
        """A replica report."""

    def acknowledged(self, node: str, version: int, rejected: Sequence[Rejection]) -> None:
        """An acknowledgement."""


class StoredLink:
    """The controller's link to an agent another fleet holds: desired sets go to the store."""

    def __init__(self, node: str, holder: str, stream: str, remote: RemoteNodes) -> None:
        self.node = node
        self.holder = holder
        self.stream = stream
        self.closed = False
        self._remote = remote

    def send_desired(
        self, version: int, replicas: Sequence[ReplicaState], stop_traces: Mapping[str, str]
    ) -> None:
        """Queue the set for the store (written after the tick's dispatch)."""
        if not self.closed:
            self._remote.queue(self.node, version, replicas, stop_traces)

    def close(self, reason: str) -> None:
        """The controller let this stream go (a newer one from the node replaced it): later
        reports of this stream are no longer news."""
        self.closed = True


@dataclass
class _Heard:
    """What was last applied of a node's stream."""

    link: StoredLink
    news: NodeNews
    heard_at: float
    doc: Mapping[str, Any]
    """The report `news` was decoded from."""


class RemoteNodes:
    """Nodes whose agents another fleet holds, for the leader's controller (see the module
    docstring). `holder` names this fleet: rows it wrote itself are its own streams, which
    its controller hears directly."""

    def __init__(
        self,
        store: Store,
        holder: str,
        encode: Encode,
        liveness: Liveness,
        offload: Offload | None = None,
    ) -> None:
        self._store = store
        self.holder = holder
        self._encode = encode
        self._liveness = liveness
        self._offload = offload or _on_the_loop
        self._seq = 0
        self._beat_seq = 0
        self._heard: dict[str, _Heard] = {}
        self._pending: dict[str, DesiredRecord] = {}
        self._fetched: list[NodeReport] = []
        self._fetched_beats: list[NodeBeat] = []

    def reset(self) -> None:
        """Forget everything (the controller reloaded its state): the next read is a full one."""
        self._seq = 0
        self._beat_seq = 0
        self._heard = {}
        self._pending = {}
        self._fetched = []
        self._fetched_beats = []

    async def fetch(self) -> None:
        """Read the beats and rows written since the last read, off the loop where the store
        allows it (the next tick applies them: `apply_fetched`). The beats are read first: a
        beat's transaction wrote the rows of every node it names, so those rows are read too."""
        seq, beat_seq = self._seq, self._beat_seq

        def read() -> tuple[list[NodeBeat], list[NodeReport]]:
            beats = self._store.list_node_beats(beat_seq)
            return beats, self._store.list_node_reports(seq)

        beats, rows = await self._offload(read)
        if (seq, beat_seq) == (self._seq, self._beat_seq):  # not reset meanwhile
            self._fetched.extend(rows)
            self._fetched_beats.extend(beats)

    def apply_fetched(self, events: AgentEvents, wall_now: float) -> None:
        """Apply what `fetch` read (the tick calls it first)."""
        rows, self._fetched = self._fetched, []
        beats, self._fetched_beats = self._fetched_beats, []
        self.apply(rows, events, wall_now, beats)

    def queue(
        self, node: str, version: int, replicas: Sequence[ReplicaState], stop: Mapping[str, str]
    ) -> None:
        """A desired set to write at the next `push`."""
        self._pending[node] = DesiredRecord(
            node, version, self._encode(node, version, replicas, stop)
        )

    def apply(
        self,
        rows: Sequence[NodeReport],
        events: AgentEvents,
        wall_now: float,
        beats: Sequence[NodeBeat] = (),
    ) -> None:
        """Turn rows and beats read into the controller's events: the rows first (a beat
        names only nodes whose rows were written before it), then each beat's heartbeats."""
        first = self._seq == 0
        # On the first read a row's own heard_at may be old (rows change only with their
        # report): the last beat of its holder says when its agent was last heard.
        latest = {b.holder: b for b in beats} if first else {}
        for row in rows:
            self._seq = max(self._seq, row.seq)
            if row.holder == self.holder:
                continue
            beat = latest.get(row.holder)
            heard_at = max(row.heard_at, beat.heard.get(row.node, 0.0) if beat else 0.0)
            try:
                self._apply(row, events, wall_now, first, heard_at)
            except Exception:  # one node's odd row must not cost the others
                log.exception("node_report_not_applied", node=row.node, holder=row.holder)
        for beat in beats:
            self._beat_seq = max(self._beat_seq, beat.seq)
            if beat.holder != self.holder:
                self._beat(beat, events)

    def _beat(self, beat: NodeBeat, events: AgentEvents) -> None:
        """A holder's beat: a heartbeat for each node whose stream it holds (as this fleet
        last read) and whose agent it heard since the last beat or row."""
        for node, heard_at in beat.heard.items():
            heard = self._heard.get(node)
            if heard is None or heard.link.holder != beat.holder or heard.link.closed:
                continue  # a stream another fleet holds now, or one the controller let go
            self._heard_at(node, heard, heard.news, heard_at, events)

    def _apply(
        self, row: NodeReport, events: AgentEvents, wall_now: float, first: bool, heard_at: float
    ) -> None:
        heard = self._heard.get(row.node)
        same = heard is not None and heard.link.stream == row.stream
        if not row.connected:
            if same and heard is not None:
                events.agent_disconnected(row.node, heard.link)
                del self._heard[row.node]
            return
        if same and heard is not None:
            if heard.link.closed:
                return  # replaced since by a newer stream (here, or through another row)
            if row.report is heard.doc:
                # The store read the same report as last time (a row written again with the
                # same report): only its heard_at can be news.
                self._heard_at(row.node, heard, heard.news, heard_at, events)
                return
            self._news(row.node, heard, news_of(row.node, row.report), heard_at, events)
            heard.doc = row.report
            return
        if first and wall_now - heard_at >= self._liveness.grace_s:
            return  # a stream its holder stopped beating for before this fleet loaded it
        news = news_of(row.node, row.report)
        link = StoredLink(row.node, row.holder, row.stream, self)
        self._heard[row.node] = _Heard(link, news, heard_at, row.report)
        events.agent_connected(news.view, list(news.observed.values()), link)
        if news.ack_version:
            events.acknowledged(row.node, news.ack_version, news.rejected)
        log.debug("agent_held_elsewhere", node=row.node, holder=row.holder)

    def _news(
        self, node: str, heard: _Heard, news: NodeNews, heard_at: float, events: AgentEvents
    ) -> None:
        old = heard.news
        self._heard_at(node, heard, news, heard_at, events)
        for rid, o in news.observed.items():
            if old.observed.get(rid) != o:
                events.observe(node, o)
        if (news.ack_version, news.rejected) != (old.ack_version, old.rejected):
            events.acknowledged(node, news.ack_version, news.rejected)
        heard.news = news

    @staticmethod
    def _heard_at(
        node: str, heard: _Heard, news: NodeNews, heard_at: float, events: AgentEvents
    ) -> None:
        if heard_at > heard.heard_at:
            # The agent spoke since the last row (a row refreshed over a silent stream is
            # not a heartbeat: the node goes NOT_READY as a silent one here would).
            events.heartbeat(node, news.view.cards, news.view.memory_free_bytes)
            heard.heard_at = heard_at

    async def push(self) -> None:
        """Write the desired sets queued since the last push, off the loop where the store
        allows it (kept for the next push when the store refuses)."""
        if not self._pending:
            return
        records = list(self._pending.values())
        await self._offload(lambda: self._store.put_desired(records))
        for r in records:
            if self._pending.get(r.node) is r:
                del self._pending[r.node]
