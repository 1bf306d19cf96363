"""Nodes: their cards, and their phase by their agents' heartbeats."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from llmgw.card import Card


class NodePhase(enum.Enum):
    """A node's phase, by its agent's heartbeats."""

    READY = "READY"
    """Its agent is connected and its last heartbeat is within the grace period."""
    NOT_READY = "NOT_READY"
    """Its agent missed heartbeats for the grace period or disconnected, not yet for long."""
    LOST = "LOST"
    """Not heard from for the lost timeout: its replicas are placed elsewhere."""


@dataclass(frozen=True)
class Liveness:
    """How long silence may last: heartbeats every `interval_s`; NOT_READY after
    `grace_heartbeats` missed ones; LOST after `lost_after_s` of silence."""

    interval_s: float = 2.0
    grace_heartbeats: int = 3
    lost_after_s: float = 30.0

    @property
    def grace_s(self) -> float:
        """Silence after which a node is NOT_READY."""
        return self.interval_s * self.grace_heartbeats


@dataclass
class NodeView:
    """What the fleet knows of a node: its identity and cards from Hello, its last heartbeat."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    cards: tuple[Card, ...] = ()
    engines: tuple[str, ...] = ()
    engine_versions: dict[str, str] = field(default_factory=dict)
    """Engine name -> the version the node runs, as its agent reported it."""
    memory_bytes: int = 0
    memory_free_bytes: int = 0
    connected: bool = False
    last_heard_s: float = 0.0
    phase: NodePhase = NodePhase.NOT_READY
    reason: str = ""

    @property
    def gpu_class(self) -> str:
        """The class of the node's cards (the first card's model; "" for a CPU node)."""
        return self.cards[0].model if self.cards else ""


def node_phase(view: NodeView, now_s: float, liveness: Liveness) -> tuple[NodePhase, str]:
    """A node's phase at `now_s` and why, from its connection and its last heartbeat."""
    silent = now_s - view.last_heard_s
    if silent >= liveness.lost_after_s:
        return NodePhase.LOST, f"not heard from for {silent:.0f} s"
    if not view.connected:
        return NodePhase.NOT_READY, "its agent is not connected"
    if silent >= liveness.grace_s:
        return NodePhase.NOT_READY, f"no heartbeat for {silent:.1f} s"
    return NodePhase.READY, ""
