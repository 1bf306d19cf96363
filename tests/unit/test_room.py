"""Room for a change before anything starts or stops: beside needs free cards now, in place
needs a node that could free enough once the profile's old replicas stop."""

from __future__ import annotations

import pytest

from fleet_svc.domain import errors
from fleet_svc.domain.nodes import NodePhase, NodeView
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.placement import Want
from fleet_svc.domain.replicas import ReplicaState, RunSpec
from fleet_svc.domain.rollout import Strategy
from fleet_svc.domain.room import check_room, room_in_place
from llmgw.card import Card
from llmgw.model import Model, Profile

H100 = "H100-80GB"


def node(name: str, cards: int, phase: NodePhase = NodePhase.READY) -> NodeView:
    """A node of H100 cards."""
    return NodeView(name=name, cards=tuple(Card(i, model=H100) for i in range(cards)), phase=phase)


def replica(
    rid: str, model: str, node: str, gpus: tuple[int, ...], retire: bool = False
) -> ReplicaState:
    """A READY replica holding `gpus` of `node`."""
    return ReplicaState(
        id=rid,
        model=model,
        profile="gpu",
        revision=1,
        spec=RunSpec(engine="vllm"),
        phase=ReplicaPhase.READY,
        node=node,
        gpus=gpus,
        retire=retire,
    )


def model(gpus: int) -> Model:
    """Model m with one vLLM profile of `gpus` cards."""
    return Model(
        name="m", profiles=(Profile("gpu", "vllm", gpu_class=H100, gpus_per_node=gpus, replicas=1),)
    )


@pytest.mark.parametrize(
    ("nodes", "others", "need", "most"),
    [
        # One 4-card node, another model keeps a card: at most 3 once m's replica stops.
        ([node("a", 4)], [replica("o", "other", "a", (1,))], 4, 3),
        # The other replica is retiring: its card is counted free.
        ([node("a", 4)], [replica("o", "other", "a", (1,), retire=True)], 4, 4),
        # A LOST node counts for nothing; a NOT_READY one comes back with its cards.
        ([node("a", 2), node("b", 8, NodePhase.LOST)], [], 4, 2),
        ([node("a", 2), node("b", 8, NodePhase.NOT_READY)], [], 4, 8),
        # The best node is another one than m's.
        ([node("a", 2), node("b", 4)], [replica("o", "other", "b", (0,))], 4, 3),
    ],
)
def test_room_in_place_counts_what_other_replicas_keep(
    nodes: list[NodeView], others: list[ReplicaState], need: int, most: int
) -> None:
    """The most cards any READY node could free for a new replica of m's profile."""
    replicas = {r.id: r for r in [replica("m1", "m", "a", (0,)), *others]}
    room = room_in_place(Want(H100, need), "m", "gpu", {n.name: n for n in nodes}, replicas)
    assert room.most == most
    assert (room.nodes_with_room >= 1) is (most >= need)


@pytest.mark.parametrize("strategy", [Strategy.IN_PLACE, Strategy.AUTO])
def test_an_in_place_or_auto_change_that_can_never_fit_is_refused(strategy: Strategy) -> None:
    """In place, and auto with no room beside, refuse 4 cards where at most 3 could be free."""
    nodes = {"a": node("a", 4)}
    replicas = {
        "m1": replica("m1", "m", "a", (0,)),
        "o": replica("o", "other", "a", (1,)),
    }
    with pytest.raises(errors.NoRoomInPlace) as caught:
        check_room(model(1), model(4), {"gpu"}, strategy, nodes, replicas)
    assert caught.value.metadata()["most_gpus"] == "3"
    assert "nothing was stopped" in caught.value.message
    check_room(model(1), model(3), {"gpu"}, strategy, nodes, replicas)


def test_with_no_node_of_the_class_known_nothing_is_refused() -> None:
    """A fleet that knows no node of the class yet (its agents not back after a restart)
    cannot judge, and lets the change go on: its replicas wait for nodes either way."""
    replicas = {"m1": replica("m1", "m", "a", (0,))}
    check_room(model(1), model(4), {"gpu"}, Strategy.IN_PLACE, {}, replicas)
    lost = {"a": node("a", 8, NodePhase.LOST)}
    check_room(model(1), model(4), {"gpu"}, Strategy.IN_PLACE, lost, replicas)
