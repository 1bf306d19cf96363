"""Replica, rollout and rollout event rows: each loads into typed values and is written back
unchanged, and a key a row lacks reads as its field's default."""

from __future__ import annotations

from typing import Any

import pytest

from fleet_svc.domain.canary import CanaryRun, Verdict
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.placement import Want
from fleet_svc.domain.replicas import Member, ReplicaState, RunSpec
from fleet_svc.domain.rollout import (
    Event,
    EventKind,
    Mode,
    Rollout,
    RolloutEvent,
    RolloutState,
    Stage,
    Step,
    Strategy,
)
from fleet_svc.store.base import EventRecord, ReplicaRecord, RolloutRecord
from fleet_svc.store.rows import (
    event_doc,
    load_event,
    load_rollout,
    replica_of,
    replica_record,
    rollout_record,
)

# A replica row as the fleet writes it: what the agent is told, the
# rollout's hints, and the fleet's own bookkeeping under "_fleet".
REPLICA_SPEC: dict[str, Any] = {
    "model": "qwen",
    "profile": "gpu",
    "engine": "vllm",
    "args": ["--max-model-len", "8192"],
    "source": "hf://Qwen/Qwen2.5-0.5B-Instruct",
    "rollout": "ro-1a2b3c4d5e",
    "prefer_node": "node-b",
    "_fleet": {"attempt": 2, "ram_bytes": 0, "retire": True},
}


def test_a_replica_row_loads_typed_and_writes_back_the_same() -> None:
    """Every key of a row lands in a typed field and the row written back is equal."""
    record = ReplicaRecord(
        id="r-1",
        model="qwen",
        profile="gpu",
        revision=3,
        node="node-b",
        gpus=(0, 1),
        phase="DRAINING",
        reason="replaced beside by rollout ro-1a2b3c4d5e",
        address="10.0.0.2:8000",
        restarts=1,
        since=1_764_000_000.5,
        spec=REPLICA_SPEC,
    )
    r = replica_of(record)
    assert r.spec == RunSpec(
        engine="vllm",
        args=("--max-model-len", "8192"),
        source="hf://Qwen/Qwen2.5-0.5B-Instruct",
        prefer_node="node-b",
        rollout="ro-1a2b3c4d5e",
        attempt=2,
    )
    assert (r.phase, r.retire, r.gpus, r.since_s) == (
        ReplicaPhase.DRAINING,
        True,
        (0, 1),
        1_764_000_000.5,
    )
    assert replica_record(r) == record


def test_a_row_without_hints_or_bookkeeping_reads_with_defaults() -> None:
    """A bare row (no rollout, no preferred node, no _fleet) is a first attempt, wanted, and
    an unknown phase reads as PENDING."""
    r = replica_of(ReplicaRecord(id="r-2", model="m", profile="p", revision=1, phase="?", spec={}))
    assert r.spec == RunSpec(engine="")
    assert (r.phase, r.retire, r.attempt) == (ReplicaPhase.PENDING, False, 1)


def test_a_rollout_row_round_trips() -> None:
    """A stored rollout loads with its steps and the old revision's specs, and is written
    back as it was read."""
    spec: dict[str, Any] = {
        "kind": "gpus",
        "strategy": "in_place",
        "from_revision": 2,
        "to_revision": 3,
        "surge": 1,
        "reason": "",
        "log_tail": [],
        "by": "alice",
        "undo_of": "",
        "start_timeout_s": 600.0,
        "old_specs": {
            "gpu": {
                "model": "qwen",
                "profile": "gpu",
                "engine": "vllm",
                "args": ["--tensor-parallel-size", "1"],
                "source": "hf://Qwen/Qwen2.5-0.5B-Instruct",
            }
        },
        "trace": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "steps": [
            {
                "profile": "gpu",
                "old_id": "r-1",
                "new_id": "",
                "mode": "in_place",
                "stage": "retiring",
                "node": "",
                "gpus": [],
                "old_node": "node-b",
                "started_s": 12.5,
                "message": "",
            }
        ],
    }
    record = RolloutRecord("ro-1", "qwen", "RUNNING", spec, 1_764_000_000.0, 1_764_000_100.0)
    ro = load_rollout(record)
    assert (ro.strategy, ro.state, ro.steps[0].stage) == (
        Strategy.IN_PLACE,
        RolloutState.RUNNING,
        Stage.RETIRING,
    )
    assert ro.old_specs["gpu"].args == ("--tensor-parallel-size", "1")
    assert ro.trace.startswith("00-4bf92f35")
    assert rollout_record(ro) == record


def test_a_gang_row_keeps_every_member_and_a_row_without_members_has_none() -> None:
    """A gang's members (rank, node, cards, phase, gang address) survive the row; a row
    without members reads as a replica on one node."""
    g = ReplicaState(
        id="g",
        model="m",
        profile="big",
        revision=3,
        spec=RunSpec(engine="vllm"),
        phase=ReplicaPhase.READY,
        node="a",
        gpus=(0, 1),
        members=(
            Member(0, "a", (0, 1), ReplicaPhase.READY, "10.0.0.1:29501"),
            Member(1, "b", (2, 3), ReplicaPhase.STARTING, ""),
        ),
    )
    record = replica_record(g)
    assert record.members[1] == {
        "rank": 1,
        "node": "b",
        "gpus": [2, 3],
        "phase": "STARTING",
        "gang_address": "",
    }
    back = replica_of(record)
    assert back.members == g.members and back.gang and back.nodes == ("a", "b")
    old = replica_of(ReplicaRecord(id="r", model="m", profile="p", revision=1, node="a"))
    assert (old.members, old.gang, old.nodes) == ((), False, ("a",))


def test_a_restored_replica_and_a_rollouts_old_specs_keep_their_own_cards() -> None:
    """The old revision's card count a restored replica is placed by survives its row and
    the rollout's row, so a fleet restarted mid-rollout does not place it as the new one."""
    old = Want(gpu_class="H100-80GB", gpus=1)
    spec = RunSpec(engine="vllm", args=("--max-model-len", "8192"), want=old)
    r = ReplicaState(id="r-9", model="qwen", profile="gpu", revision=1, spec=spec)
    assert replica_of(replica_record(r)).spec.want == old
    ro = Rollout(
        id="ro-1",
        model="qwen",
        kind="gpus",
        strategy=Strategy.IN_PLACE,
        from_revision=1,
        to_revision=2,
        steps=(Step(profile="gpu", old_id="r-1"),),
        old_specs={"gpu": spec},
    )
    assert load_rollout(rollout_record(ro)).old_specs["gpu"].want == old


@pytest.mark.parametrize("kind", [k for k in EventKind if k is not EventKind.UNKNOWN])
def test_a_rollout_event_row_reads_back_as_the_typed_event_it_was(kind: EventKind) -> None:
    """Every kind of event, with every field set (a canary's figures too) and the rollout's
    state after it, is the same typed value after its row is written and read."""
    event = Event(
        kind,
        profile="gpu",
        replica_id="r-1",
        node="node-b",
        gpus=(0, 3),
        mode=Mode.IN_PLACE,
        message="é ✓",
        canary=CanaryRun(step=1, step_started_s=12.5, verdict=Verdict.HOLD, findings=("ok",)),
    )
    doc = event_doc(event, RolloutState.FAILED)
    assert load_event(EventRecord("ro-1", 4, 20.25, doc)) == RolloutEvent(
        "ro-1", 4, 20.25, event, RolloutState.FAILED
    )


def test_an_event_row_of_a_newer_fleet_reads_as_unknown_and_is_never_written() -> None:
    """A kind, mode or state this fleet does not know reads as UNKNOWN, undecided and RUNNING
    (so a watcher is sent it unspecified); writing an UNKNOWN event is refused."""
    read = load_event(
        EventRecord("ro-1", 1, 1.0, {"kind": "teleported", "mode": "sideways", "state": "HALF"})
    )
    assert (read.event.kind, read.event.mode, read.state) == (
        EventKind.UNKNOWN,
        Mode.UNDECIDED,
        RolloutState.RUNNING,
    )
    with pytest.raises(ValueError, match="unknown kind"):
        event_doc(read.event, RolloutState.RUNNING)


def test_amended_is_replace_and_refuses_a_field_the_replica_lacks() -> None:
    """`amended` makes the same replica `dataclasses.replace` would (equal, same hash, the
    original untouched), and a change of a field ReplicaState has not is a TypeError."""
    from dataclasses import replace

    from fleet_svc.domain.replicas import amended

    r = ReplicaState(id="r1", model="m", profile="p", revision=2, spec=RunSpec("vllm", ("-x",)))
    new = amended(r, phase=ReplicaPhase.STARTING, node="n1", gpus=(0,))
    assert new == replace(r, phase=ReplicaPhase.STARTING, node="n1", gpus=(0,))
    assert hash(new) == hash(replace(r, phase=ReplicaPhase.STARTING, node="n1", gpus=(0,)))
    assert (r.phase, r.node) == (ReplicaPhase.PENDING, "")
    with pytest.raises(TypeError):
        amended(r, nodes=("n1",))


def test_replicas_of_one_profile_share_their_row_spec_and_it_reads_back_as_each() -> None:
    """Two replicas of one profile's spec get one spec dict (a store dumps it once); a
    replica retired, or of another profile, gets its own; each reads back as its replica."""
    spec = RunSpec("vllm", ("--max-model-len", "8192"), source="hf://org/m")
    a = ReplicaState(id="a", model="m", profile="p", revision=1, spec=spec)
    b = ReplicaState(id="b", model="m", profile="p", revision=1, spec=spec)
    c = ReplicaState(id="c", model="m", profile="p", revision=1, spec=spec, retire=True)
    ra, rb, rc = (replica_record(x) for x in (a, b, c))
    assert ra.spec is rb.spec and rc.spec is not ra.spec
    assert rc.spec["_fleet"]["retire"] is True and ra.spec["_fleet"]["retire"] is False
    for record, replica in ((ra, a), (rb, b), (rc, c)):
        assert replica_of(record) == replica
