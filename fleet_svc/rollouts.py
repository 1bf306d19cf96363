"""Rollouts as the store keeps them: their whole state as one JSON document."""

from __future__ import annotations

from typing import Any

from fleet_svc.domain.rollout import Rollout, RolloutState, Stage, Step, Strategy
from fleet_svc.store.base import RolloutRecord


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
        "old_specs": {k: dict(v) for k, v in ro.old_specs.items()},
        "steps": [
            {
                "profile": s.profile,
                "old_id": s.old_id,
                "new_id": s.new_id,
                "mode": s.mode,
                "stage": s.stage.value,
                "node": s.node,
                "gpus": list(s.gpus),
                "old_node": s.old_node,
                "started_s": s.started_s,
                "message": s.message,
            }
            for s in ro.steps
        ],
    }
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
                mode=str(st.get("mode", "")),
                stage=Stage(st.get("stage", "waiting")),
                node=str(st.get("node", "")),
                gpus=tuple(int(g) for g in st.get("gpus", [])),
                old_node=str(st.get("old_node", "")),
                started_s=float(st.get("started_s", 0.0)),
                message=str(st.get("message", "")),
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
        old_specs={str(k): dict(v) for k, v in s.get("old_specs", {}).items()},
    )
