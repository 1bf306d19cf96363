"""What the agents tell the controller: hellos, heartbeats, replica reports and
acknowledgements. Facts, applied at once through the controller's replica changes; the loop is
woken to act on them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

import structlog

from fleet_svc.controller.writes import AgentLink, ReplicaWrites
from fleet_svc.domain.nodes import NodePhase, NodeView
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.reports import (
    Observed,
    gang_reported,
    missing_from_hello,
    refused,
    reported,
)
from fleet_svc.nodelink.desired import DesiredSets
from llmgw.card import Card
from llmgw.rejection import Rejection

log = structlog.get_logger(__name__)
P = ReplicaPhase


class AgentEvents(ReplicaWrites):
    """The controller's handling of agents' events."""

    desired: DesiredSets
    _wake: asyncio.Event
    _sets_moved: bool

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
        self._sets_moved = True
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
        self._sets_moved = True
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

    def wake(self) -> None:
        """Ask for a tick now (the catalog changed, or an agent reported)."""
        self._wake.set()
