"""Placement: the node a replica goes on, and the indexed fast path agreeing with the scan."""

from __future__ import annotations

import random

import pytest

from fleet_svc.domain.control import _FreeCards
from fleet_svc.domain.nodes import NodePhase, NodeView
from fleet_svc.domain.placement import Placement, Want, place
from llmgw.card import Card


def node(name: str, cls: str, cards: int, phase: NodePhase = NodePhase.READY) -> NodeView:
    """A node of `cards` cards of `cls`."""
    return NodeView(name=name, cards=tuple(Card(i, model=cls) for i in range(cards)), phase=phase)


def test_fewest_left_wins_then_name_and_reasons_say_why() -> None:
    """The node left with the fewest free cards wins; with no room the reason names each node."""
    nodes = [node("a", "H100-80GB", 8), node("b", "H100-80GB", 4), node("c", "L4-24GB", 4)]
    used = {"a": {0, 1}}
    assert place(Want("h100-80gb", 2), nodes, used, {}) == Placement("b", (0, 1))
    assert place(Want("H100-80GB", 6), nodes, used, {}) == Placement("a", (2, 3, 4, 5, 6, 7))
    why = place(Want("H100-80GB", 8), nodes, used, {})
    assert why == "no READY node has 8 free H100-80GB cards (a: 6 free; b: 4 free)"
    lost = [node("a", "H100-80GB", 8, NodePhase.LOST)]
    assert "a is LOST" in str(place(Want("H100-80GB", 1), lost, {}, {}))


@pytest.mark.parametrize("seed", range(25))
def test_indexed_placement_chooses_as_the_scan_does(seed: int) -> None:
    """Placing a random run of replicas with the index gives the scan's choices, one by one."""
    rng = random.Random(seed)
    classes = ["H100-80GB", "L4-24GB"]
    nodes = sorted(
        (
            node(
                f"n{i:02d}",
                rng.choice(classes),
                rng.choice([1, 2, 4, 8]),
                rng.choice([NodePhase.READY] * 4 + [NodePhase.NOT_READY]),
            )
            for i in range(rng.randint(1, 12))
        ),
        key=lambda n: n.name,
    )
    used: dict[str, set[int]] = {}
    for n in nodes:
        taken = {c.index for c in n.cards if rng.random() < 0.3}
        if taken:
            used[n.name] = taken
    free = _FreeCards(nodes, used)
    for _ in range(15):
        want = Want(
            gpu_class=rng.choice(classes),
            gpus=rng.choice([1, 2, 4]),
            prefer=rng.choice(["", "", nodes[0].name, nodes[-1].name]),
            avoid=frozenset(rng.sample([n.name for n in nodes], k=min(2, len(nodes))))
            if rng.random() < 0.3
            else frozenset(),
        )
        scanned = place(want, nodes, used, {}, presorted=True)
        indexed = free.take(want)
        assert indexed == (scanned if isinstance(scanned, Placement) else None), want
        if indexed is not None:
            used.setdefault(indexed.node, set()).update(indexed.gpus)
