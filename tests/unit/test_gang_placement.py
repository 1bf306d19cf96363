"""Gang placement: a replica spanning several nodes goes on that many nodes of its class, all
or none, and says what is missing and what would fit."""

from __future__ import annotations

import pytest

from fleet_svc.domain.catalog import check_profiles, gang_nodes, node_cards, want_of
from fleet_svc.domain.errors import InvalidModel
from fleet_svc.domain.nodes import NodePhase, NodeView
from fleet_svc.domain.placement import GangShortfall, Placement, Want, nodes_with_room, place_gang
from llmgw.card import Card
from llmgw.model import Model, Profile

H100 = "H100-80GB"


def node(name: str, cls: str, cards: int, phase: NodePhase = NodePhase.READY) -> NodeView:
    """A node of `cards` cards of `cls`."""
    return NodeView(name=name, cards=tuple(Card(i, model=cls) for i in range(cards)), phase=phase)


CLUSTER = [
    node("a", H100, 8),
    node("b", H100, 4),
    node("c", H100, 8),
    node("d", "L4-24GB", 8),
    node("e", H100, 8, NodePhase.NOT_READY),
]


@pytest.mark.parametrize(
    ("want", "used", "placed"),
    [
        # Two nodes of four: the tightest fits first (b has exactly 4), then the name.
        (Want(H100, 4, nodes=2), {}, (Placement("b", (0, 1, 2, 3)), Placement("a", (0, 1, 2, 3)))),
        # Eight on each: b is too small, d is another class, e is not READY.
        (
            Want(H100, 8, nodes=2),
            {},
            (Placement("a", tuple(range(8))), Placement("c", tuple(range(8)))),
        ),
        # Cards in use count: a has 2 free, so c and b take the gang.
        (
            Want(H100, 2, nodes=2),
            {"a": set(range(6)), "c": set(range(6))},
            (Placement("a", (6, 7)), Placement("c", (6, 7))),
        ),
        # The preferred node is the head (an in-place replacement goes back where it ran).
        (
            Want(H100, 4, nodes=2, prefer="c"),
            {},
            (Placement("c", (0, 1, 2, 3)), Placement("b", (0, 1, 2, 3))),
        ),
        # An avoided node is used only when nothing else makes up the gang.
        (
            Want(H100, 8, nodes=2, avoid=frozenset({"a"})),
            {},
            (Placement("c", tuple(range(8))), Placement("a", tuple(range(8)))),
        ),
        # Three nodes of four: a, b and c each have room.
        (
            Want(H100, 4, nodes=3),
            {},
            (
                Placement("b", (0, 1, 2, 3)),
                Placement("a", (0, 1, 2, 3)),
                Placement("c", (0, 1, 2, 3)),
            ),
        ),
    ],
)
def test_a_gang_goes_on_distinct_nodes_of_its_class(
    want: Want, used: dict[str, set[int]], placed: tuple[Placement, ...]
) -> None:
    """Each member lands on its own READY node of the class, the head first."""
    got = place_gang(want, CLUSTER, used, {})
    assert got == placed
    assert len({p.node for p in got}) == want.nodes


@pytest.mark.parametrize(
    ("want", "used", "fitting", "words"),
    [
        (
            Want(H100, 8, nodes=3),
            {},
            ("a", "c"),
            [
                "3 READY nodes with 8 free H100-80GB cards",
                "b: 4 free",
                "e is NOT_READY",
                "a gang of 2 nodes would fit now",
            ],
        ),
        (
            Want(H100, 8, nodes=2),
            {"c": {0}},
            ("a",),
            ["c: 7 free", "no gang of two or more nodes fits now"],
        ),
        (Want("A100-40GB", 1, nodes=2), {}, (), ["no node has A100-40GB cards"]),
    ],
)
def test_no_room_for_the_whole_gang_places_none_and_says_what_fits(
    want: Want, used: dict[str, set[int]], fitting: tuple[str, ...], words: list[str]
) -> None:
    """Short of nodes, no member is placed; the reason names what each node lacks and what fits."""
    got = place_gang(want, CLUSTER, used, {})
    assert isinstance(got, GangShortfall)
    assert got.fitting == fitting
    for w in words:
        assert w in got.message
    assert nodes_with_room(want, CLUSTER, used, {}) == len(fitting)


@pytest.mark.parametrize(
    ("profile", "nodes", "cards"),
    [
        (Profile("p", "vllm", gpu_class=H100, gpus_per_node=8, tp=8, pp=2, nodes=2), 2, 8),
        (Profile("p", "vllm", gpu_class=H100, tp=8, nodes=2), 2, 4),
        (Profile("p", "vllm", gpu_class=H100, tp=8, pp=2), 2, 8),
        (Profile("p", "llamacpp", gpu_class=H100, gpus_per_node=2, pp=2, nodes=1), 1, 2),
        (Profile("p", "vllm", gpu_class=H100, tp=4), 1, 4),
        # tp across both nodes (as PlanGPUs leaves it): each node takes its cards, not tp.
        (Profile("p", "vllm", gpu_class=H100, gpus_per_node=1, tp=2, pp=1, nodes=2), 2, 1),
        # two stages a node: tp below the cards of a node.
        (Profile("p", "vllm", gpu_class=H100, gpus_per_node=8, tp=4, pp=4, nodes=2), 2, 8),
    ],
)
def test_a_profile_spans_its_nodes_with_its_cards_shared(
    profile: Profile, nodes: int, cards: int
) -> None:
    """`nodes` (else pipeline stages) sets the gang's size; each node takes its share of cards."""
    assert gang_nodes(profile) == nodes
    assert node_cards(profile) == cards
    want = want_of(profile)
    assert (want.nodes, want.gpus, want.gang) == (nodes, cards, nodes > 1)


@pytest.mark.parametrize(
    ("profile", "words"),
    [
        (Profile("p", "trtllm", gpu_class=H100, nodes=2), "has no multi-node launch"),
        (Profile("p", "tei", gpu_class=H100, pp=2), "has no multi-node launch"),
        (Profile("p", "vllm", gpu_class=H100, nodes=65), "spans at most 64"),
        (Profile("p", "vllm", gpu_class=H100, nodes=2), ""),
        (Profile("p", "trtllm", gpu_class=H100, nodes=1, pp=2), ""),
    ],
)
def test_the_catalog_refuses_a_gang_its_engine_cannot_launch(profile: Profile, words: str) -> None:
    """A profile spanning nodes needs an engine with a multi-node launch and at most 64 nodes."""
    model = Model("m", profiles=(profile,))
    if not words:
        check_profiles(model)
        return
    with pytest.raises(InvalidModel) as err:
        check_profiles(model)
    assert words in err.value.message and err.value.field == "model.profiles[0].nodes"
