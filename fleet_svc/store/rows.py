"""Replicas and rollouts to and from the store's rows (JSON-able data).

A replica row's `spec` keeps what its agent is told (`model`, `profile`, `engine`, `args`,
`source`), the fleet's hints (`rollout`, `prefer_node`, `want` when a replica needs other
cards than its profile's: the old revision started again) and, under `_fleet`, what only the
fleet reads (`attempt`, `ram_bytes`, `retire`); a rollout row keeps its whole state. A key a row
lacks reads as its field's default.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping
from typing import Any, TypeVar

from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.placement import Want
from fleet_svc.domain.replicas import Member, ReplicaState, RunSpec, StartProgress
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
from fleet_svc.store.canary_rows import canary_doc, canary_of_doc

P = ReplicaPhase
E = TypeVar("E", bound=enum.Enum)


def spec_doc(model: str, profile: str, spec: RunSpec) -> dict[str, Any]:
    """A replica's run spec as a row keeps it."""
    doc: dict[str, Any] = {
        "model": model,
        "profile": profile,
        "engine": spec.engine,
        "args": list(spec.args),
        "source": spec.source,
    }
    if spec.rollout:
        doc["rollout"] = spec.rollout
    if spec.prefer_node:
        doc["prefer_node"] = spec.prefer_node
    if spec.want is not None:
        doc["want"] = {
            "gpu_class": spec.want.gpu_class,
            "gpus": spec.want.gpus,
            "ram_bytes": spec.want.ram_bytes,
            "nodes": spec.want.nodes,
        }
    return doc


def _want_of_doc(doc: Any) -> Want | None:
    """A spec's own `want` from its JSON; None when absent or not of that shape."""
    if not isinstance(doc, Mapping):
        return None

    def count(key: str, default: int) -> int:
        value = doc.get(key, default)
        return value if isinstance(value, int) and not isinstance(value, bool) else default

    return Want(
        gpu_class=str(doc.get("gpu_class", "") or ""),
        gpus=max(count("gpus", 0), 0),
        ram_bytes=max(count("ram_bytes", 0), 0),
        nodes=max(count("nodes", 1), 1),
    )


def spec_of_doc(doc: Mapping[str, Any], attempt: int = 1) -> RunSpec:
    """A replica's run spec from a row's JSON (unknown keys ignored)."""
    args = doc.get("args", [])
    return RunSpec(
        engine=str(doc.get("engine", "")),
        args=tuple(str(a) for a in args) if isinstance(args, list) else (),
        source=str(doc.get("source", "")),
        prefer_node=str(doc.get("prefer_node", "") or ""),
        rollout=str(doc.get("rollout", "") or ""),
        attempt=attempt,
        want=_want_of_doc(doc.get("want")),
    )


@functools.lru_cache(maxsize=1024)
def _row_spec(
    model: str, profile: str, spec: RunSpec, ram_bytes: int, retire: bool
) -> dict[str, Any]:
    """A replica row's `spec`, one dict for every replica it is the same for (a profile's
    replicas, mostly): read, never changed, so a store dumps it once a write (1,000
    replicas of a change were 1,000 dicts dumped one by one)."""
    doc = spec_doc(model, profile, spec)
    doc["_fleet"] = {"attempt": spec.attempt, "ram_bytes": ram_bytes, "retire": retire}
    return doc


def replica_record(r: ReplicaState) -> ReplicaRecord:
    """A replica as a row to store (its `spec` dict shared with others': not to be changed)."""
    spec = _row_spec(r.model, r.profile, r.spec, r.ram_bytes, r.retire)
    return ReplicaRecord(
        id=r.id,
        model=r.model,
        profile=r.profile,
        revision=r.revision,
        node=r.node,
        gpus=r.gpus,
        phase=r.phase.value,
        reason=r.reason,
        address=r.address,
        restarts=r.restarts,
        since=r.since_s,
        spec=spec,
        members=tuple(
            {
                "rank": m.rank,
                "node": m.node,
                "gpus": list(m.gpus),
                "phase": m.phase.value,
                "gang_address": m.gang_address,
            }
            for m in r.members
        ),
        progress=progress_doc(r.progress),
    )


def progress_doc(p: StartProgress | None) -> dict[str, Any]:
    """A replica's progress as its row keeps it ({} for none)."""
    if p is None:
        return {}
    return {
        "stage": p.stage,
        "done_bytes": p.done_bytes,
        "total_bytes": p.total_bytes,
        "rate_bytes_per_s": p.rate_bytes_per_s,
        "files_done": p.files_done,
        "files_total": p.files_total,
        "file": p.file,
    }


def progress_of_doc(doc: Mapping[str, Any]) -> StartProgress | None:
    """A replica's progress from its row's JSON (None for {} or no stage; a number that is
    not one reads as 0)."""
    stage = doc.get("stage")
    if not isinstance(stage, str) or not stage:
        return None

    def count(key: str) -> int:
        value = doc.get(key, 0)
        return max(value, 0) if isinstance(value, int) and not isinstance(value, bool) else 0

    return StartProgress(
        stage=stage,
        done_bytes=count("done_bytes"),
        total_bytes=count("total_bytes"),
        rate_bytes_per_s=count("rate_bytes_per_s"),
        files_done=count("files_done"),
        files_total=count("files_total"),
        file=str(doc.get("file", "")),
    )


def member_of(doc: Mapping[str, Any], rank: int) -> Member:
    """A gang member from its row's JSON (an unknown phase reads as PENDING: not reported)."""
    phase = str(doc.get("phase", ""))
    gpus = doc.get("gpus", [])
    return Member(
        rank=int(doc.get("rank", rank)),
        node=str(doc.get("node", "")),
        gpus=tuple(int(g) for g in gpus) if isinstance(gpus, list) else (),
        phase=P(phase) if phase in P.__members__ else P.PENDING,
        gang_address=str(doc.get("gang_address", "")),
    )


def replica_of(rec: ReplicaRecord) -> ReplicaState:
    """A stored row as a replica (an unknown phase reads as PENDING)."""
    meta = rec.spec.get("_fleet")
    fleet = meta if isinstance(meta, dict) else {}
    return ReplicaState(
        id=rec.id,
        model=rec.model,
        profile=rec.profile,
        revision=rec.revision,
        spec=spec_of_doc(rec.spec, attempt=int(fleet.get("attempt", 1))),
        phase=P(rec.phase) if rec.phase in P.__members__ else P.PENDING,
        node=rec.node,
        gpus=tuple(rec.gpus),
        reason=rec.reason,
        address=rec.address,
        restarts=rec.restarts,
        since_s=rec.since,
        ram_bytes=int(fleet.get("ram_bytes", 0)),
        retire=bool(fleet.get("retire", False)),
        members=tuple(member_of(m, i) for i, m in enumerate(rec.members)),
        progress=progress_of_doc(rec.progress),
    )


def rollout_record(ro: Rollout) -> RolloutRecord:
    """A rollout as a store record."""
    spec: dict[str, Any] = {
        "kind": ro.kind,
        "strategy": ro.strategy.value,
        "from_revision": ro.from_revision,
        "to_revision": ro.to_revision,
        "surge": ro.surge,
        "reason": ro.reason,
        "log_tail": list(ro.log_tail),
        "by": ro.by,
        "undo_of": ro.undo_of,
        "start_timeout_s": ro.start_timeout_s,
        "old_specs": {k: spec_doc(ro.model, k, v) for k, v in ro.old_specs.items()},
        "trace": ro.trace,
        "steps": [
            {
                "profile": s.profile,
                "old_id": s.old_id,
                "new_id": s.new_id,
                "mode": s.mode.value,
                "stage": s.stage.value,
                "node": s.node,
                "gpus": list(s.gpus),
                "old_node": s.old_node,
                "started_s": s.started_s,
                "message": s.message,
                **({"canary": True} if s.canary else {}),
            }
            for s in ro.steps
        ],
    }
    if ro.canary is not None:
        spec["canary"] = canary_doc(ro.canary)
    if ro.failure_reason:
        spec["failure"] = {"reason": ro.failure_reason, "metadata": dict(ro.failure_metadata)}
    return RolloutRecord(
        id=ro.id,
        model=ro.model,
        state=ro.state.value,
        spec=spec,
        created_at=ro.created_s,
        updated_at=ro.updated_s or ro.created_s,
    )


def load_rollout(rec: RolloutRecord) -> Rollout:
    """A rollout from its store record."""
    s = rec.spec
    stored_failure = s.get("failure")
    failure: dict[str, Any] = stored_failure if isinstance(stored_failure, dict) else {}
    return Rollout(
        id=rec.id,
        model=rec.model,
        kind=str(s.get("kind", "")),
        strategy=Strategy(s.get("strategy", "beside")),
        from_revision=int(s.get("from_revision", 0)),
        to_revision=int(s.get("to_revision", 0)),
        steps=tuple(
            Step(
                profile=str(st["profile"]),
                old_id=str(st.get("old_id", "")),
                new_id=str(st.get("new_id", "")),
                mode=Mode(str(st.get("mode", ""))),
                stage=Stage(st.get("stage", "waiting")),
                node=str(st.get("node", "")),
                gpus=tuple(int(g) for g in st.get("gpus", [])),
                old_node=str(st.get("old_node", "")),
                started_s=float(st.get("started_s", 0.0)),
                message=str(st.get("message", "")),
                canary=bool(st.get("canary", False)),
            )
            for st in s.get("steps", [])
        ),
        state=RolloutState(rec.state),
        surge=int(s.get("surge", 1)),
        reason=str(s.get("reason", "")),
        log_tail=tuple(str(x) for x in s.get("log_tail", [])),
        created_s=rec.created_at,
        updated_s=rec.updated_at,
        by=str(s.get("by", "")),
        undo_of=str(s.get("undo_of", "")),
        start_timeout_s=float(s.get("start_timeout_s", 600.0)),
        old_specs={str(k): spec_of_doc(v) for k, v in s.get("old_specs", {}).items()},
        trace=str(s.get("trace", "")),
        canary=canary_of_doc(s.get("canary")),
        failure_reason=str(failure.get("reason", "")),
        failure_metadata={str(k): str(v) for k, v in failure.get("metadata", {}).items()},
    )


def event_doc(event: Event, state: RolloutState) -> dict[str, Any]:
    """A rollout event, with the rollout's state right after it, as its row keeps it."""
    if event.kind is EventKind.UNKNOWN:
        raise ValueError("an event of unknown kind is read, never written")
    doc: dict[str, Any] = {
        "kind": event.kind.value,
        "profile": event.profile,
        "replica_id": event.replica_id,
        "node": event.node,
        "gpus": list(event.gpus),
        "mode": event.mode.value,
        "message": event.message,
        "state": state.value,
    }
    if event.canary is not None:
        doc["canary"] = canary_doc(event.canary)
    return doc


def _known(kind: type[E], value: object, default: E) -> E:
    """`value` as a member of `kind`; `default` for one this fleet does not know (a row a
    newer fleet wrote)."""
    try:
        return kind(str(value))
    except ValueError:
        return default


def load_event(rec: EventRecord) -> RolloutEvent:
    """A rollout event from its store record: a kind, mode or state this fleet does not know
    reads as UNKNOWN, undecided and RUNNING."""
    e = rec.event
    return RolloutEvent(
        rollout_id=rec.rollout_id,
        seq=rec.seq,
        at_s=rec.at,
        event=Event(
            kind=_known(EventKind, e.get("kind", ""), EventKind.UNKNOWN),
            profile=str(e.get("profile", "")),
            replica_id=str(e.get("replica_id", "")),
            node=str(e.get("node", "")),
            gpus=tuple(int(g) for g in e.get("gpus", [])),
            mode=_known(Mode, e.get("mode", ""), Mode.UNDECIDED),
            message=str(e.get("message", "")),
            canary=canary_of_doc(e.get("canary")),
        ),
        state=_known(RolloutState, e.get("state", "RUNNING"), RolloutState.RUNNING),
    )
