"""Room for a change: whether its new replicas can start beside the old ones, or, in place,
whether they could ever be placed once the old ones stop; checked before anything starts or
stops."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from fleet_svc.domain import errors
from fleet_svc.domain.catalog import want_of
from fleet_svc.domain.control import cards_in_use
from fleet_svc.domain.nodes import NodePhase, NodeView
from fleet_svc.domain.placement import Want, same_class
from fleet_svc.domain.replicas import ReplicaState
from fleet_svc.domain.rollout import Strategy
from fleet_svc.domain.rollout_run import gang_shortfall, room_beside
from llmgw.model import Model


@dataclass(frozen=True)
class InPlaceRoom:
    """The most cards of a class any node could free for one new replica of a profile once
    that profile's replicas (and the replicas already retiring) are stopped; `node` has them,
    `cards` is its count of the class, `held` the cards other replicas keep there. Nodes READY
    or NOT_READY count (one whose agent reconnects comes back with its cards); LOST ones do
    not."""

    most: int
    node: str = ""
    cards: int = 0
    held: int = 0
    nodes_with_room: int = 0
    """Nodes where that many cards could be free (a gang needs `Want.nodes` of them)."""
    known: int = 0
    """Nodes of the class counted (0: the fleet knows none yet, and cannot judge)."""


def room_in_place(
    want: Want,
    model: str,
    profile: str,
    nodes: Mapping[str, NodeView],
    replicas: Mapping[str, ReplicaState],
) -> InPlaceRoom:
    """How much room an in-place change of `profile` could ever get: per node of the class
    not LOST, its cards less those held by replicas that stay (other models' and profiles',
    not retiring). Optimistic by design: it counts every replica of the profile as stopped,
    so a change refused on it cannot fit whatever order the steps take."""
    skip = frozenset(
        r.id for r in replicas.values() if r.retire or (r.model == model and r.profile == profile)
    )
    used_cards, _ = cards_in_use(replicas, skip)
    best = InPlaceRoom(most=0)
    fitting = known = 0
    for node in sorted(nodes.values(), key=lambda n: n.name):
        if node.phase is NodePhase.LOST or not same_class(node.gpu_class, want.gpu_class):
            continue
        known += 1
        indices = {c.index for c in node.cards}
        held = len(indices & set(used_cards.get(node.name, ())))
        could = len(indices) - held
        if could >= want.gpus:
            fitting += 1
        if could > best.most or not best.node:
            best = InPlaceRoom(most=could, node=node.name, cards=len(indices), held=held)
    return replace(best, nodes_with_room=fitting, known=known)


def check_room(
    old: Model,
    new: Model,
    changed: set[str],
    strategy: Strategy,
    nodes: Mapping[str, NodeView],
    replicas: Mapping[str, ReplicaState],
) -> None:
    """Refuse a change its strategy cannot carry out, before anything starts or stops: beside,
    no node has room for one new replica of a changed profile that has replicas serving; in
    place (or auto, which goes in place where there is no room beside), no node could ever
    take one, even with that profile's old replicas stopped.

    Raises:
        NoRoomBeside: beside, and no room for a new replica now.
        NoRoomInPlace: in place or auto, and no node could free the cards a new one needs.
    """
    for p in new.profiles:
        if p.name not in changed or p.on_cpu:
            continue
        serving = [
            r
            for r in replicas.values()
            if r.model == old.name and r.profile == p.name and not r.retire
        ]
        if not serving:
            continue
        want = want_of(p)
        if strategy in (Strategy.BESIDE, Strategy.CANARY):
            _check_beside(old.name, p.name, p.gpu_class, want, nodes, replicas)
            continue
        if strategy is Strategy.AUTO and room_beside(want, nodes, replicas)[0]:
            continue
        room = room_in_place(want, old.name, p.name, nodes, replicas)
        if room.nodes_with_room >= want.nodes or room.known == 0:
            # No node of the class known (a fleet started again before its agents said
            # hello): nothing to judge by, and the replicas wait for nodes either way.
            continue
        cards = f"card{'s' if want.gpus != 1 else ''}"
        where = (
            f"the most any node could free is {room.most} ({room.node} has {room.cards} "
            f"{p.gpu_class} cards, other replicas keep {room.held})"
            if room.node
            else f"no node has {p.gpu_class} cards"
        )
        span = f" on each of {want.nodes} nodes" if want.nodes > 1 else ""
        raise errors.NoRoomInPlace(
            f"no node could ever take a new {p.name} replica of {want.gpus} {p.gpu_class} "
            f"{cards}{span} in place: {where}; nothing was stopped. Ask for at most "
            f"{room.most} cards, or free cards on {room.node or 'a node of the class'} first",
            name=old.name,
            profile=p.name,
            gpu_class=p.gpu_class,
            need_gpus=want.gpus,
            most_gpus=room.most,
            node=room.node,
            need_nodes=want.nodes,
        )


def _check_beside(
    model: str,
    profile: str,
    gpu_class: str,
    want: Want,
    nodes: Mapping[str, NodeView],
    replicas: Mapping[str, ReplicaState],
) -> None:
    room, most = room_beside(want, nodes, replicas)
    short = gang_shortfall(want, nodes, replicas) if want.gang else None
    if short is not None:
        raise errors.NoRoomBeside(
            f"no room to start a new {profile} replica beside the old one: "
            f"{short.message}; --in-place stops each replica first and starts the "
            "new gang on the nodes it frees",
            name=model,
            profile=profile,
            gpu_class=gpu_class,
            need_gpus=want.gpus,
            most_free=most,
            need_nodes=want.nodes,
            nodes_with_room=len(short.fitting),
        )
    if not room:
        raise errors.NoRoomBeside(
            f"no node has {want.gpus} free {gpu_class} card"
            f"{'s' if want.gpus != 1 else ''} to start a new {profile} replica beside "
            f"an old one (the most free on a node is {most}): --in-place stops each "
            "replica first",
            name=model,
            profile=profile,
            gpu_class=gpu_class,
            need_gpus=want.gpus,
            most_free=most,
        )
