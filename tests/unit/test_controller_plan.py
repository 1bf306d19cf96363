"""plan_actions: from the wanted profiles, the replicas and the nodes, what the controller does
this tick; pure and level-triggered, so each case is a table row with no timers."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

import pytest

from fleet_svc.domain.catalog import ProfileWant
from fleet_svc.domain.control import (
    MAX_ATTEMPTS,
    Action,
    Assign,
    Create,
    Forget,
    Hold,
    MarkRetiring,
    Move,
    Retire,
    plan_actions,
    retirement,
)
from fleet_svc.domain.nodes import NodePhase, NodeView
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.placement import Placement, Want
from fleet_svc.domain.replicas import ReplicaState, RunSpec
from llmgw.card import Card

P = ReplicaPhase
H100 = "H100-80GB"
NOW = 1000.0
DRAIN_S = 2.0


def node(name: str, cards: int = 8, phase: NodePhase = NodePhase.READY) -> NodeView:
    """A node with `cards` H100 cards."""
    return NodeView(name=name, cards=tuple(Card(i, model=H100) for i in range(cards)), phase=phase)


def want(replicas: int = 1, gpus: int = 1, revision: int = 1, profile: str = "gpu") -> ProfileWant:
    """Model `m`'s profile wanting `replicas` replicas of `gpus` H100 cards."""
    return ProfileWant(
        model="m",
        profile=profile,
        revision=revision,
        replicas=replicas,
        want=Want(gpu_class=H100, gpus=gpus),
        spec=RunSpec(engine="vllm", args=("--tensor-parallel-size", str(gpus))),
    )


def replica(
    rid: str,
    phase: ReplicaPhase,
    *,
    node: str = "a",
    gpus: tuple[int, ...] = (0,),
    revision: int = 1,
    entered_s: float = NOW - 60,
    **fields: object,
) -> ReplicaState:
    """A replica of m/gpu in `phase` (on node `node` unless PENDING)."""
    placed = phase is not P.PENDING
    r = ReplicaState(
        id=rid,
        model="m",
        profile="gpu",
        revision=revision,
        spec=RunSpec(engine="vllm"),
        phase=phase,
        node=node if placed else "",
        gpus=gpus if placed else (),
        entered_s=entered_s,
    )
    return replace(r, **fields)  # type: ignore[arg-type]


def ids() -> Callable[[], str]:
    """Fresh replica ids: new-1, new-2 ..."""
    counter = itertools.count(1)
    return lambda: f"new-{next(counter)}"


def plan(
    wants: list[ProfileWant],
    replicas: list[ReplicaState],
    nodes: list[NodeView],
    managed: frozenset[tuple[str, str]] = frozenset(),
) -> list[Action]:
    """plan_actions at NOW over these lists."""
    return plan_actions(
        wants,
        {r.id: r for r in replicas},
        {n.name: n for n in nodes},
        NOW,
        drain_s=DRAIN_S,
        new_id=ids(),
        managed=managed,
    )


def kinds(actions: list[Action]) -> list[str]:
    """The actions as short strings, for tables."""
    out = []
    for a in actions:
        if isinstance(a, Create):
            out.append(f"create {a.replica.id}")
        elif isinstance(a, Assign):
            out.append(f"assign {a.replica_id} {a.placement.node}{list(a.placement.gpus)}")
        elif isinstance(a, Hold):
            out.append(f"hold {a.replica_id}")
        elif isinstance(a, Move):
            out.append(f"move {a.replica_id} {a.phase.value}")
        elif isinstance(a, Retire):
            out.append(f"retire {a.replica_id}")
        elif isinstance(a, Forget):
            out.append(f"forget {a.replica_id}")
        else:
            out.append(type(a).__name__)
    return out


@pytest.mark.parametrize(
    ("wants", "replicas", "nodes", "expected"),
    [
        pytest.param(
            [want(replicas=2, gpus=2)],
            [],
            [node("a", 8)],
            ["create new-1", "create new-2", "assign new-1 a[0, 1]", "assign new-2 a[2, 3]"],
            id="missing-replicas-are-created-and-placed",
        ),
        pytest.param(
            [want(replicas=1)],
            [replica("r1", P.READY)],
            [node("a")],
            [],
            id="as-wanted-nothing-to-do",
        ),
        pytest.param(
            [want(replicas=1)],
            [replica("old", P.READY, entered_s=NOW - 90), replica("young", P.READY, gpus=(1,))],
            [node("a")],
            ["retire young"],
            id="surplus-retires-the-newest-ready",
        ),
        pytest.param(
            [want(replicas=1)],
            [replica("r1", P.READY), replica("p1", P.PENDING)],
            [node("a")],
            ["retire p1"],
            id="surplus-retires-a-pending-one-before-a-ready-one",
        ),
        pytest.param(
            [],
            [replica("r1", P.READY)],
            [node("a")],
            ["retire r1"],
            id="a-model-no-longer-in-the-catalog-is-retired",
        ),
        pytest.param(
            [want(replicas=0)],
            [replica("d1", P.DRAINING, entered_s=NOW - DRAIN_S)],
            [node("a")],
            ["move d1 STOPPING"],
            id="drained-once-the-delay-has-passed",
        ),
        pytest.param(
            [want(replicas=0)],
            [replica("d1", P.DRAINING, entered_s=NOW - DRAIN_S + 0.1)],
            [node("a")],
            [],
            id="still-draining-before-the-delay",
        ),
        pytest.param(
            [want(replicas=0)],
            [replica("s1", P.STOPPED)],
            [node("a")],
            ["forget s1"],
            id="a-stopped-replica-is-forgotten",
        ),
        pytest.param(
            [want(replicas=1)],
            [replica("r1", P.READY, node="gone")],
            [node("gone", phase=NodePhase.LOST), node("b")],
            ["move r1 LOST", "forget r1", "create new-1", "assign new-1 b[0]"],
            id="a-lost-node-s-replica-is-replaced-elsewhere",
        ),
        pytest.param(
            [want(replicas=1, gpus=8)],
            [],
            [node("a", 4)],
            ["create new-1", "hold new-1"],
            id="held-when-no-node-has-room",
        ),
        pytest.param(
            [want(replicas=1)],
            [],
            [node("a", phase=NodePhase.NOT_READY)],
            ["create new-1", "hold new-1"],
            id="held-while-no-node-is-ready",
        ),
        pytest.param(
            [want(replicas=1)],
            [replica("f1", P.FAILED, reason="bad flag")],
            [node("a")],
            ["retire f1", "create new-1", "assign new-1 a[0]"],
            id="a-failed-replica-is-placed-again",
        ),
    ],
)
def test_plan_actions(
    wants: list[ProfileWant],
    replicas: list[ReplicaState],
    nodes: list[NodeView],
    expected: list[str],
) -> None:
    """Each row: the catalog, the replicas and nodes in; the actions out, in order."""
    assert kinds(plan(wants, replicas, nodes)) == expected


def test_a_profile_a_rollout_manages_is_left_to_it() -> None:
    """The counts of a profile a rollout is changing are the rollout's: nothing is created or
    retired for it, though its stopped replicas are still forgotten."""
    replicas = [replica("r1", P.READY), replica("r2", P.READY, gpus=(1,)), replica("s", P.STOPPED)]
    managed = frozenset({("m", "gpu")})
    assert kinds(plan([want(replicas=5)], replicas, [node("a")], managed)) == ["forget s"]
    assert kinds(plan([want(replicas=0)], replicas, [node("a")], managed)) == ["forget s"]


def test_a_hold_says_why_nothing_fits() -> None:
    """A replica that fits nowhere is held with the placement's reason, naming the nodes."""
    actions = plan([want(replicas=1, gpus=8)], [], [node("a", 4)])
    hold = next(a for a in actions if isinstance(a, Hold))
    assert hold.reason == "no READY node has 8 free H100-80GB cards (a: 4 free)"


def test_a_replacement_counts_its_attempts_and_gives_up() -> None:
    """Each placement after a FAILED one of the same revision is the next attempt; at
    MAX_ATTEMPTS the fleet stops trying and holds the last one, saying so."""
    again = plan([want()], [replica("f1", P.FAILED, reason="boom", spec=RunSpec("vllm"))], [])
    created = next(a for a in again if isinstance(a, Create))
    assert created.replica.spec.attempt == 2
    assert created.replica.entered_s == NOW
    last = replica("f3", P.FAILED, reason="boom", spec=RunSpec("vllm", attempt=MAX_ATTEMPTS))
    actions = plan([want()], [last], [node("a")])
    assert actions == [Hold("f3", f"gave up after {MAX_ATTEMPTS} attempts: boom")]


def test_a_failed_replica_of_an_older_revision_is_always_replaced() -> None:
    """Giving up counts only the current revision's failures: after a change it tries again."""
    old = replica("f3", P.FAILED, revision=1, spec=RunSpec("vllm", attempt=MAX_ATTEMPTS))
    actions = plan([want(revision=2)], [old], [node("a")])
    assert kinds(actions) == ["retire f3", "create new-1", "assign new-1 a[0]"]
    created = next(a for a in actions if isinstance(a, Create))
    assert (created.replica.revision, created.replica.spec.attempt) == (2, 1)


def test_a_replica_preferring_a_node_goes_there_when_it_has_room() -> None:
    """A pending replica whose spec prefers a node is placed there, not on the best fit."""
    pending = replica("p1", P.PENDING, spec=RunSpec("vllm", prefer_node="big"))
    actions = plan([want()], [pending], [node("big", 8), node("small", 1)])
    assert actions == [Assign("p1", Placement("big", (0,)))]
    assert plan(
        [want()], [replace(pending, spec=RunSpec("vllm"))], [node("big", 8), node("small", 1)]
    ) == [Assign("p1", Placement("small", (0,)))]


def test_cards_held_by_running_replicas_are_not_given_again() -> None:
    """A new replica goes on the cards no running replica holds."""
    actions = plan(
        [want(replicas=2, gpus=2)], [replica("r1", P.READY, gpus=(0, 1))], [node("a", 4)]
    )
    assert kinds(actions) == ["create new-1", "assign new-1 a[2, 3]"]


@pytest.mark.parametrize(
    ("phase", "moved_to"),
    [
        (P.READY, P.DRAINING),
        (P.PENDING, P.STOPPED),
        (P.STARTING, P.STOPPING),
        (P.CRASHED, P.STOPPING),
        (P.LOST, P.STOPPING),
        (P.FAILED, P.STOPPED),
        (P.DRAINING, None),
        (P.STOPPING, None),
    ],
)
def test_retiring_a_replica(phase: ReplicaPhase, moved_to: ReplicaPhase | None) -> None:
    """Retiring marks a replica wanted gone and moves it toward STOPPED: a READY one drains
    first; one on its way out already is left on its way."""
    actions = retirement(replica("r1", phase), "no longer wanted")
    expected: list[Action] = [MarkRetiring("r1")]
    if moved_to is not None:
        expected.append(Move("r1", moved_to, "no longer wanted"))
    assert actions == expected
    marked = replica("r1", phase, retire=True)
    assert retirement(marked, "no longer wanted") == expected[1:]
