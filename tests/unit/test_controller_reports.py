"""Reconciling agent reports: what a report, a hello or a refusal means for the replicas the
fleet keeps (pure functions returning the moves)."""

from __future__ import annotations

import pytest

from fleet_svc.domain.control import Move, Report
from fleet_svc.domain.nodes import NodePhase, NodeView
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.replicas import ReplicaState, RunSpec
from fleet_svc.domain.reports import (
    Observed,
    missing_from_hello,
    refused,
    reported,
    stopped_with_their_node,
)
from llmgw.rejection import Rejection

P = ReplicaPhase


def kept(phase: ReplicaPhase, node: str = "a", revision: int = 2) -> ReplicaState:
    """A replica r1 the fleet keeps on `node`."""
    return ReplicaState(
        id="r1",
        model="m",
        profile="gpu",
        revision=revision,
        spec=RunSpec("vllm"),
        phase=phase,
        node=node,
        reason="placed on a",
        address="10.0.0.1:8000",
    )


@pytest.mark.parametrize(
    ("phase", "seen", "revision", "expected"),
    [
        (P.STARTING, P.READY, 2, P.READY),
        (P.READY, P.CRASHED, 2, P.CRASHED),
        (P.READY, P.STOPPED, 2, P.CRASHED),  # stopped without being asked: it crashed
        (P.STOPPING, P.STOPPED, 2, P.STOPPED),
        (P.DRAINING, P.STOPPED, 2, P.STOPPED),
        (P.DRAINING, P.READY, 2, None),  # going away: only its end is news
        (P.STOPPING, P.FAILED, 2, P.FAILED),
        (P.PENDING, P.READY, 2, None),  # not placed: a stale report
        (P.READY, P.STARTING, 1, None),  # an older run of it
        (P.STOPPING, P.STOPPED, 1, P.STOPPED),  # an older run ending is still its end
    ],
)
def test_a_report_of_one_replica(
    phase: ReplicaPhase, seen: ReplicaPhase, revision: int, expected: ReplicaPhase | None
) -> None:
    """Each row: the phase the fleet keeps, what the agent saw (of which revision), and the
    phase the report moves the replica to (None: no news)."""
    change = reported(kept(phase), "a", Observed("r1", revision, seen, restarts=3))
    assert (change.phase if change else None) is expected


def test_a_report_carries_its_address_restarts_and_message() -> None:
    """The report's message becomes the reason, its address and restarts are kept; a report
    without them keeps what the fleet had."""
    o = Observed("r1", 2, P.READY, address="10.0.0.9:8001", restarts=1, message="healthy")
    assert reported(kept(P.STARTING), "a", o) == Report(
        "r1", P.READY, "healthy", "10.0.0.9:8001", 1
    )
    bare = reported(kept(P.STARTING), "a", Observed("r1", 2, P.READY))
    assert bare == Report("r1", P.READY, "placed on a", "10.0.0.1:8000", 0)


def test_a_report_from_another_node_or_of_an_unknown_replica_is_ignored() -> None:
    """Only the node the replica is placed on speaks for it."""
    assert reported(kept(P.STARTING, node="b"), "a", Observed("r1", 2, P.READY)) is None
    assert reported(None, "a", Observed("r1", 2, P.READY)) is None


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        (P.STOPPING, Move("r1", P.STOPPED, "gone from its node")),
        (P.READY, Move("r1", P.STARTING, "its node does not run it: starting it again")),
        (P.CRASHED, Move("r1", P.STARTING, "its node does not run it: starting it again")),
        (P.STARTING, None),  # its desired set starts it
        (P.PENDING, None),
    ],
)
def test_a_hello_without_a_replica(phase: ReplicaPhase, expected: Move | None) -> None:
    """A node saying hello without a replica the fleet placed there: a stopping one is
    stopped, a running one is started again."""
    moves = missing_from_hello([kept(phase)], "a", frozenset())
    assert moves == ([] if expected is None else [expected])
    assert missing_from_hello([kept(phase)], "a", frozenset({"r1"})) == []


def test_a_refusal_fails_the_revision_refused() -> None:
    """A replica its agent refused is FAILED with the agent's reason; a refusal of another
    revision is old news."""
    replicas = {"r1": kept(P.STARTING)}
    moves = refused(replicas, "a", [Rejection("r1", 2, "NO_ENGINE", "sglang is not installed")])
    assert moves == [Move("r1", P.FAILED, "a refused it (NO_ENGINE): sglang is not installed")]
    assert refused(replicas, "a", [Rejection("r1", 1, "NO_ENGINE", "old")]) == []


def test_a_stopping_replica_on_a_lost_node_is_stopped() -> None:
    """A replica asked to stop whose node is lost (or gone) is stopped; on a live node it
    waits for its agent."""
    lost = {"a": NodeView(name="a", phase=NodePhase.LOST)}
    live = {"a": NodeView(name="a", phase=NodePhase.READY)}
    assert stopped_with_their_node([kept(P.STOPPING)], lost) == [
        Move("r1", P.STOPPED, "its node is gone")
    ]
    assert stopped_with_their_node([kept(P.STOPPING)], {}) != []
    assert stopped_with_their_node([kept(P.STOPPING)], live) == []
    assert stopped_with_their_node([kept(P.READY)], lost) == []
