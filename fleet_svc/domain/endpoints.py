"""Endpoints: what a router needs to know of a ready replica, and why one leaves routing."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from fleet_svc.domain.nodes import NodePhase
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.replicas import ReplicaState
from llmgw.engines import registry
from llmgw.model import Model

P = ReplicaPhase

CARD_WEIGHT = 100
"""An endpoint's weight per card it runs on."""
CPU_WEIGHT = 10
"""A CPU replica's weight: a tenth of one card's. A rough order of magnitude (a CPU decodes
a model of the size a card serves several times slower), so a gateway that balances by
weight prefers cards and still uses CPU replicas."""


class EndpointReason(enum.Enum):
    """Why an endpoint left routing."""

    DRAINING = "DRAINING"
    """It is taken out before it stops: a rollout replaced it, its profile has fewer replicas,
    or it was asked to stop."""
    FAILED = "FAILED"
    """Its engine crashed, failed its health checks or was refused (the agent may restart it
    under the same replica id)."""
    NODE_NOT_READY = "NODE_NOT_READY"
    """Its node's agent missed heartbeats or disconnected; the replica may still run."""
    NODE_LOST = "NODE_LOST"
    """Its node was lost: the replica is gone and placed again elsewhere under a new id."""
    DELETED = "DELETED"
    """Its model (or its profile) is no longer in the catalog."""


@dataclass(frozen=True)
class Endpoint:
    """A routable replica as a gateway sees it.

    `context_tokens` is what one request may use (prompt and output), `max_output` the most it
    may generate (0: the model does not say), `slots` the requests served at full context at
    once; `ready_since_s` is on the wall clock.
    """

    replica_id: str
    model: str
    profile: str
    address: str
    revision: int
    node: str
    engine: str = ""
    api_dialect: str = ""
    context_tokens: int = 0
    max_output: int = 0
    slots: int = 1
    cards: int = 0
    gpus: tuple[int, ...] = ()
    gpu_class: str = ""
    weight: int = CPU_WEIGHT
    ready_since_s: float = 0.0


def routable(r: ReplicaState, node: NodePhase | None) -> bool:
    """Whether a gateway may send `r` requests: READY, with an address, on a READY node."""
    return r.phase is P.READY and bool(r.address) and node is NodePhase.READY


def endpoint_weight(cards: int) -> int:
    """The weight of an endpoint on `cards` cards (0: a CPU replica)."""
    return cards * CARD_WEIGHT if cards > 0 else CPU_WEIGHT


def endpoint_of(r: ReplicaState, *, model: Model | None, gpu_class: str) -> Endpoint:
    """The endpoint of replica `r`, its context and slots read from its arguments by its
    engine (`model`, the replica's revision of its model, fills what they do not say)."""
    engine = registry.find(r.spec.engine)
    tokens = engine.context_tokens(r.spec.args) if engine is not None else 0
    slots = engine.slots(r.spec.args) if engine is not None else 1
    if tokens <= 0 and model is not None:
        tokens = model.context_length
    cards = len(r.gpus)
    return Endpoint(
        replica_id=r.id,
        model=r.model,
        profile=r.profile,
        address=r.address,
        revision=r.revision,
        node=r.node,
        engine=r.spec.engine,
        api_dialect=engine.api_dialect if engine is not None else "",
        context_tokens=max(tokens, 0),
        max_output=model.max_output if model is not None else 0,
        slots=max(slots, 1),
        cards=cards,
        gpus=r.gpus,
        gpu_class=gpu_class if cards else "",
        weight=endpoint_weight(cards),
        ready_since_s=r.since_s,
    )


def removal_reason(
    r: ReplicaState | None, node: NodePhase | None, *, wanted: bool
) -> EndpointReason:
    """Why a routable replica stopped being routable.

    Args:
        r: the replica now (None: forgotten).
        node: its node's phase now (None: not known).
        wanted: whether the catalog still has the replica's model and profile.
    """
    if node is NodePhase.LOST or (r is not None and r.phase is P.LOST):
        return EndpointReason.NODE_LOST
    if r is not None and r.phase in (P.CRASHED, P.FAILED):
        return EndpointReason.FAILED
    if r is not None and r.phase is P.READY and node is not NodePhase.READY:
        return EndpointReason.NODE_NOT_READY
    if not wanted:
        return EndpointReason.DELETED
    return EndpointReason.DRAINING
