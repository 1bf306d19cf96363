"""Gangs in the control plan: placed whole, lost with any node, failed by any member, stopped
once every member is, and sent to each node in the order its engine's launch needs."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from fleet_svc.domain.catalog import ProfileWant
from fleet_svc.domain.control import (
    Assign,
    Forget,
    Hold,
    Move,
    Report,
    ReportMember,
    cards_in_use,
    plan_actions,
)
from fleet_svc.domain.gang import order_of, spans_nodes
from fleet_svc.domain.nodes import NodePhase, NodeView
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.placement import Placement, Want
from fleet_svc.domain.replicas import Member, ReplicaState, RunSpec
from fleet_svc.domain.reports import (
    Observed,
    gang_reported,
    missing_from_hello,
    refused,
    stopped_with_their_node,
)
from fleet_svc.domain.rollout_run import gang_shortfall, room_beside
from fleet_svc.nodelink.desired import desired_by_node
from llmgw.card import Card
from llmgw.rejection import Rejection

P = ReplicaPhase
H100 = "H100-80GB"


def node(name: str, cards: int = 4, phase: NodePhase = NodePhase.READY) -> NodeView:
    """A node with `cards` H100 cards."""
    return NodeView(name=name, cards=tuple(Card(i, model=H100) for i in range(cards)), phase=phase)


def gang_want(engine: str = "vllm", replicas: int = 1, nodes: int = 2) -> ProfileWant:
    """Model `m`'s profile wanting gangs of `nodes` nodes of 4 H100 cards each."""
    return ProfileWant(
        model="m",
        profile="big",
        revision=1,
        replicas=replicas,
        want=Want(gpu_class=H100, gpus=4, nodes=nodes),
        spec=RunSpec(engine=engine),
    )


def gang(
    phase: ReplicaPhase = P.STARTING,
    engine: str = "vllm",
    nodes: tuple[str, ...] = ("a", "b"),
    phases: tuple[ReplicaPhase, ...] = (),
    addresses: tuple[str, ...] = (),
) -> ReplicaState:
    """A gang replica `g` on `nodes`, four cards each."""
    members = tuple(
        Member(
            rank=i,
            node=n,
            gpus=(0, 1, 2, 3),
            phase=phases[i] if phases else P.STARTING,
            gang_address=addresses[i] if addresses else "",
        )
        for i, n in enumerate(nodes)
    )
    return ReplicaState(
        id="g",
        model="m",
        profile="big",
        revision=1,
        spec=RunSpec(engine=engine),
        phase=phase,
        node=nodes[0],
        gpus=(0, 1, 2, 3),
        members=members,
    )


def plan(
    wants: list[ProfileWant], replicas: list[ReplicaState], nodes: list[NodeView]
) -> list[object]:
    """One tick's actions."""
    ids = (f"n{i}" for i in itertools.count(1))
    return list(
        plan_actions(
            wants,
            {r.id: r for r in replicas},
            {n.name: n for n in nodes},
            0.0,
            drain_s=1.0,
            new_id=lambda: next(ids),
        )
    )


def test_a_new_gang_is_assigned_on_every_member_node_at_once() -> None:
    """A wanted gang is created and assigned with one placement per node, head first."""
    actions = plan([gang_want()], [], [node("a"), node("b"), node("c", 2)])
    assign = next(a for a in actions if isinstance(a, Assign))
    assert assign.members == (Placement("a", (0, 1, 2, 3)), Placement("b", (0, 1, 2, 3)))
    assert assign.placement == assign.members[0]


def test_a_gang_with_too_few_nodes_is_held_with_what_would_fit() -> None:
    """Short of nodes nothing is assigned; the hold says what is missing."""
    actions = plan([gang_want(nodes=3)], [], [node("a"), node("b"), node("c", 2)])
    assert not [a for a in actions if isinstance(a, Assign)]
    hold = next(a for a in actions if isinstance(a, Hold))
    assert "3 READY nodes with 4 free H100-80GB cards" in hold.reason
    assert "c: 2 free" in hold.reason and "a gang of 2 nodes would fit now" in hold.reason


def test_a_gang_holds_the_cards_of_every_member_and_beside_needs_a_whole_gang() -> None:
    """Cards held count on each member's node; room beside means room for all members."""
    g = gang(P.READY)
    used, _ = cards_in_use({"g": g})
    assert used == {"a": {0, 1, 2, 3}, "b": {0, 1, 2, 3}}
    nodes = {n.name: n for n in (node("a"), node("b"), node("c"))}
    want = Want(gpu_class=H100, gpus=4, nodes=2)
    assert room_beside(want, nodes, {"g": g}) == (False, 4)
    short = gang_shortfall(want, nodes, {"g": g})
    assert short is not None and short.fitting == ("c",)
    nodes["d"] = node("d")
    assert room_beside(want, nodes, {"g": g})[0]
    assert gang_shortfall(want, nodes, {"g": g}) is None


@pytest.mark.parametrize("lost", ["a", "b"])
def test_a_gang_is_lost_with_any_of_its_nodes(lost: str) -> None:
    """The head's node or a member's: the gang is lost and forgotten, and placed again."""
    nodes = [node("a"), node("b"), node("c"), node("d")]
    nodes = [replace(n, phase=NodePhase.LOST) if n.name == lost else n for n in nodes]
    actions = plan([gang_want()], [gang(P.READY)], nodes)
    move = next(a for a in actions if isinstance(a, Move))
    assert move.phase is P.LOST and f"node {lost} (rank" in move.reason
    assert Forget("g") in actions
    assign = next(a for a in actions if isinstance(a, Assign))
    assert lost not in {m.node for m in assign.members}


def obs(
    phase: ReplicaPhase, message: str = "", address: str = "", gang_address: str = ""
) -> Observed:
    """An agent's report of replica g."""
    return Observed("g", 1, phase, address=address, message=message, gang_address=gang_address)


@pytest.mark.parametrize(
    ("state", "node_", "seen", "expect"),
    [
        # The head's health is the gang's; its address is the one routed to.
        (
            gang(P.STARTING),
            "a",
            obs(P.READY, address="h:1"),
            [ReportMember("g", 0, P.READY, ""), Report("g", P.READY, "", "h:1", 0)],
        ),
        # A member's health changes only its own record.
        (gang(P.STARTING), "b", obs(P.READY), [ReportMember("g", 1, P.READY, "")]),
        # A member crash fails the whole gang, saying which rank.
        (
            gang(P.READY),
            "b",
            obs(P.CRASHED, "exit 1"),
            [
                ReportMember("g", 1, P.CRASHED, ""),
                Move("g", P.FAILED, "gang member rank 1 on b crashed: exit 1"),
            ],
        ),
        # So does the head's.
        (
            gang(P.READY),
            "a",
            obs(P.STOPPED),
            [
                ReportMember("g", 0, P.STOPPED, ""),
                Move("g", P.FAILED, "gang member rank 0 on a stopped"),
            ],
        ),
        # Asked to stop: STOPPED once the last member is.
        (
            gang(P.STOPPING, phases=(P.STOPPED, P.STOPPING)),
            "b",
            obs(P.STOPPED),
            [
                ReportMember("g", 1, P.STOPPED, ""),
                Move("g", P.STOPPED, "every member of the gang stopped"),
            ],
        ),
        (gang(P.STOPPING), "b", obs(P.STOPPED), [ReportMember("g", 1, P.STOPPED, "")]),
        # The head reports where its gang meets.
        (
            gang(P.STARTING),
            "a",
            obs(P.STARTING, gang_address="a:9"),
            [ReportMember("g", 0, P.STARTING, "a:9"), Report("g", P.STARTING, "", "", 0)],
        ),
        # A node that is not the gang's is not heard.
        (gang(P.READY), "z", obs(P.CRASHED), []),
    ],
)
def test_member_reports_move_the_gang_as_one(
    state: ReplicaState, node_: str, seen: Observed, expect: list[object]
) -> None:
    """Each member's report updates its record; the gang's phase follows from all of them."""
    assert gang_reported(state, node_, seen) == expect


def test_members_gone_refused_or_on_lost_nodes_end_the_gang() -> None:
    """A member's agent not running it fails the gang; a refusal fails it; stopping ends
    once every member's node is gone."""
    running = gang(P.READY, phases=(P.READY, P.READY))
    moves = missing_from_hello([running], "b", frozenset())
    assert moves and moves[0].phase is P.FAILED and "rank 1" in moves[0].reason
    rej = refused({"g": running}, "b", [Rejection("g", 1, "ARGS_REFUSED", "no")])
    assert rej and rej[0].phase is P.FAILED
    stopping = gang(P.STOPPING, phases=(P.STOPPED, P.STOPPING))
    nodes = {"a": node("a"), "b": replace(node("b"), phase=NodePhase.LOST)}
    assert [m.phase for m in stopped_with_their_node([stopping], nodes)] == [P.STOPPED]
    assert stopped_with_their_node([stopping], {"a": node("a"), "b": node("b")}) == []


@pytest.mark.parametrize(
    ("engine", "addresses", "sent_to"),
    [
        # vLLM and SGLang meet at the head: the others wait for its rendezvous address.
        ("vllm", ("", ""), ["a"]),
        ("vllm", ("a:9", ""), ["a", "b"]),
        ("sglang", ("", ""), ["a"]),
        ("sglang", ("a:9", ""), ["a", "b"]),
        # llama.cpp's head dials its RPC workers: it waits for theirs.
        ("llamacpp", ("", ""), ["b"]),
        ("llamacpp", ("", "b:7"), ["a", "b"]),
        # No multi-node launch: sent nowhere.
        ("trtllm", ("", ""), []),
    ],
)
def test_each_member_is_sent_once_the_addresses_it_needs_are_known(
    engine: str, addresses: tuple[str, str], sent_to: list[str]
) -> None:
    """A member reaches its node's desired set in the order its engine's launch needs."""
    g = gang(P.STARTING, engine=engine, addresses=addresses)
    assert sorted(desired_by_node([g])) == sent_to
    order = order_of(g, "b")
    assert order is not None and (order.rank, order.nnodes, order.peers) == (1, 2, addresses)


def test_which_engines_span_nodes() -> None:
    """vLLM, SGLang and llama.cpp have a multi-node launch; TensorRT-LLM and one-card ones not."""
    assert [e for e in ("vllm", "sglang", "llamacpp", "trtllm", "tei") if spans_nodes(e)] == [
        "vllm",
        "sglang",
        "llamacpp",
    ]


def test_a_member_never_sent_does_not_keep_a_stopping_gang() -> None:
    """A llama.cpp head never sent (its worker never reported an address) counts as gone:
    the gang is STOPPED once the worker stops; a vLLM member that was sent does not."""
    held = gang(P.STOPPING, engine="llamacpp", phases=(P.PENDING, P.STARTING))
    assert Move("g", P.STOPPED, "every member of the gang stopped") in gang_reported(
        held, "b", obs(P.STOPPED)
    )
    sent = gang(P.STOPPING, engine="vllm", phases=(P.STARTING, P.PENDING), addresses=("a:9", ""))
    assert gang_reported(sent, "a", obs(P.STOPPED)) == [ReportMember("g", 0, P.STOPPED, "a:9")]
