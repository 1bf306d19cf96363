"""Rollouts as pure functions: each advance moves a rollout on by what its replicas' phases
allow, and cancel ends it; driven step by step with a fake clock, no timers."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

import pytest

from fleet_svc.domain.catalog import ProfileWant
from fleet_svc.domain.control import Action, Create, Retire
from fleet_svc.domain.nodes import NodePhase, NodeView
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.placement import Want
from fleet_svc.domain.replicas import ReplicaState, RunSpec
from fleet_svc.domain.rollout import (
    Event,
    Rollout,
    RolloutState,
    Stage,
    Strategy,
    plan_steps,
)
from fleet_svc.domain.rollout_run import advance, cancel
from llmgw.card import Card
from llmgw.testing.clock import FakeClock

P = ReplicaPhase
H100 = "H100-80GB"
OLD = RunSpec(engine="vllm", args=("--tensor-parallel-size", "1"))
NEW = RunSpec(engine="vllm", args=("--tensor-parallel-size", "2"))


def node(name: str, cards: int) -> NodeView:
    """A READY node of H100 cards."""
    cs = tuple(Card(i, model=H100) for i in range(cards))
    return NodeView(name=name, cards=cs, phase=NodePhase.READY)


WANT = ProfileWant("m", "gpu", revision=2, replicas=1, want=Want(H100, 1), spec=NEW)


class Run:
    """A rollout of model m from revision 1 to 2, the replicas it sees, and a clock."""

    def __init__(
        self,
        strategy: Strategy,
        old: list[ReplicaState],
        nodes: list[NodeView],
        *,
        surge: int = 1,
        wanted: int = 1,
        timeout_s: float = 60.0,
    ) -> None:
        self.clock = FakeClock()
        self.replicas = {r.id: r for r in old}
        self.nodes = {n.name: n for n in nodes}
        self.want = replace(WANT, replicas=wanted)
        counter = itertools.count(1)
        self.new_id: Callable[[], str] = lambda: f"new-{next(counter)}"
        self.ro = Rollout(
            id="ro-1",
            model="m",
            kind="gpus",
            strategy=strategy,
            from_revision=1,
            to_revision=2,
            steps=plan_steps("m", {"gpu"}, self.replicas, [self.want]),
            surge=surge,
            start_timeout_s=timeout_s,
            old_specs={"gpu": OLD},
        )
        self.events: list[Event] = []

    def advance(self) -> list[Action]:
        """One advance at the clock's time; the actions it asks for."""
        self.ro, actions, events = advance(
            self.ro,
            self.replicas,
            {("m", "gpu"): self.want},
            self.nodes,
            self.clock.monotonic(),
            new_id=self.new_id,
            logs={"new-1": ("CUDA out of memory",)},
        )
        self.events += events
        return actions

    def cancel(self, reason: str) -> list[Action]:
        """Cancel at the clock's time."""
        self.ro, actions, events = cancel(
            self.ro, reason, self.replicas, self.clock.monotonic(), new_id=self.new_id
        )
        self.events += events
        return actions

    def set(self, rid: str, phase: ReplicaPhase, **fields: object) -> None:
        """The controller moved a replica (placed it, it turned healthy ...)."""
        self.replicas[rid] = replace(self.replicas[rid], phase=phase, **fields)  # type: ignore[arg-type]

    def add(self, actions: list[Action]) -> None:
        """The controller created the replicas the actions ask for."""
        for a in actions:
            if isinstance(a, Create):
                self.replicas[a.replica.id] = a.replica

    def stages(self) -> list[Stage]:
        """Each step's stage."""
        return [s.stage for s in self.ro.steps]


def ready(rid: str, node: str = "a", gpus: tuple[int, ...] = (0,)) -> ReplicaState:
    """A READY replica of revision 1."""
    return ReplicaState(
        id=rid, model="m", profile="gpu", revision=1, spec=OLD, phase=P.READY, node=node, gpus=gpus
    )


def test_beside_starts_the_new_replica_then_retires_the_old() -> None:
    """Beside: the new replica is created first (marked with the rollout); once it is READY the
    old one is retired; once the old one is gone the step is done and the rollout succeeds."""
    run = Run(Strategy.BESIDE, [ready("old")], [node("a", 2)])
    actions = run.advance()
    assert [type(a) for a in actions] == [Create]
    created = actions[0]
    assert isinstance(created, Create)
    assert created.replica.spec == replace(NEW, rollout="ro-1")
    assert created.replica.revision == 2
    run.add(actions)
    assert run.stages() == [Stage.STARTING]
    assert run.advance() == []  # not healthy yet: the rollout waits
    run.set("new-1", P.READY, node="a", gpus=(1,))
    assert run.advance() == [Retire("old", "replaced beside by rollout ro-1")]
    assert run.stages() == [Stage.RETIRING]
    del run.replicas["old"]
    assert run.advance() == []
    assert run.stages() == [Stage.DONE]
    assert run.ro.state is RolloutState.SUCCEEDED
    assert [e.kind for e in run.events] == [
        "step_started",
        "replica_created",
        "replica_placed",
        "replica_ready",
        "replica_draining",
        "replica_stopped",
        "step_done",
        "rollout_succeeded",
    ]


def test_in_place_stops_the_old_replica_first_and_starts_on_its_node() -> None:
    """In place: the old replica is retired first; once gone, the new one is created preferring
    the node the old one freed."""
    run = Run(Strategy.IN_PLACE, [ready("old", node="a")], [node("a", 1)])
    assert run.advance() == [Retire("old", "replaced in place by rollout ro-1")]
    assert run.stages() == [Stage.RETIRING]
    assert run.advance() == []  # still there
    del run.replicas["old"]
    actions = run.advance()
    assert len(actions) == 1 and isinstance(actions[0], Create)
    assert actions[0].replica.spec.prefer_node == "a"
    assert run.stages() == [Stage.STARTING]


@pytest.mark.parametrize(
    ("free_cards", "mode"), [(2, "beside"), (1, "in_place")], ids=["room", "no-room"]
)
def test_auto_goes_beside_where_a_node_has_room(free_cards: int, mode: str) -> None:
    """Auto decides per step: beside when a node has a free card for the new replica, in
    place when none has, and records the choice."""
    run = Run(Strategy.AUTO, [ready("old")], [node("a", free_cards)])
    run.advance()
    chosen = [e for e in run.events if e.kind == "mode_chosen"]
    assert [e.mode for e in chosen] == [mode]
    assert run.ro.steps[0].mode == mode


def test_surge_bounds_the_steps_in_flight() -> None:
    """With surge 1, the second replica's step waits until the first one's is done."""
    old = [ready("o1", gpus=(0,)), ready("o2", gpus=(1,))]
    run = Run(Strategy.BESIDE, old, [node("a", 4)], wanted=2)
    run.add(run.advance())
    assert run.stages() == [Stage.STARTING, Stage.WAITING]
    run = Run(Strategy.BESIDE, old, [node("a", 4)], wanted=2, surge=2)
    run.add(run.advance())
    assert run.stages() == [Stage.STARTING, Stage.STARTING]


def test_a_new_replica_not_healthy_in_time_fails_the_rollout() -> None:
    """Past the start timeout the rollout FAILS, says which replica on which node, stops it and
    keeps its last log lines; the old replica keeps serving."""
    run = Run(Strategy.BESIDE, [ready("old")], [node("a", 2)], timeout_s=60.0)
    run.add(run.advance())
    run.set("new-1", P.STARTING, node="a", gpus=(1,), reason="loading")
    run.clock.advance(60.0)
    assert run.advance() == []  # exactly the timeout: not yet
    run.clock.advance(0.5)
    actions = run.advance()
    assert run.ro.state is RolloutState.FAILED
    assert run.ro.reason == ("replica new-1 on a was not healthy within 60 s (STARTING: loading)")
    assert run.ro.log_tail == ("CUDA out of memory",)
    assert [a.replica_id for a in actions if isinstance(a, Retire)] == ["new-1"]
    assert "old" in run.replicas and run.stages() == [Stage.FAILED]


def test_a_crashed_new_replica_fails_the_rollout_at_once() -> None:
    """A new replica that crashes fails the rollout without waiting for the timeout."""
    run = Run(Strategy.BESIDE, [ready("old")], [node("a", 2)])
    run.add(run.advance())
    run.set("new-1", P.CRASHED, node="a", reason="exit code 1")
    run.advance()
    assert run.ro.state is RolloutState.FAILED
    assert run.ro.reason == "replica new-1 on a did not become healthy: exit code 1"


def test_cancel_stops_the_new_replica_and_keeps_the_old() -> None:
    """Cancelling stops the new replica in flight; the old one is not touched."""
    run = Run(Strategy.BESIDE, [ready("old")], [node("a", 2)])
    run.add(run.advance())
    actions = run.cancel("cancelled by alice")
    assert run.ro.state is RolloutState.CANCELLED and run.ro.reason == "cancelled by alice"
    assert actions == [Retire("new-1", "rollout ro-1 cancelled: cancelled by alice")]
    assert run.events[-1].kind == "rollout_cancelled"
    assert run.cancel("again") == []  # an ended rollout stays as it ended


def test_cancel_in_place_starts_the_old_revision_again() -> None:
    """Cancelling an in-place step whose old replica is gone starts the old revision again,
    with the old spec, on the node it ran on."""
    run = Run(Strategy.IN_PLACE, [ready("old", node="a")], [node("a", 1)])
    run.advance()
    del run.replicas["old"]
    actions = run.cancel("superseded")
    restored = [a.replica for a in actions if isinstance(a, Create)]
    assert len(restored) == 1
    assert restored[0].revision == 1
    assert restored[0].spec == replace(OLD, prefer_node="a")


def test_a_removed_profile_cancels_its_steps() -> None:
    """A step whose profile is no longer in the catalog is cancelled, not carried out."""
    run = Run(Strategy.BESIDE, [ready("old")], [node("a", 2)])
    ro, actions, _ = advance(run.ro, run.replicas, {}, run.nodes, 0.0, new_id=run.new_id, logs={})
    assert actions == [] and [s.stage for s in ro.steps] == [Stage.CANCELLED]
    assert ro.steps[0].message == "the profile was removed"
