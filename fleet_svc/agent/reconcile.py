"""Reconciling: what to start, stop and keep so the running replicas match a desired set."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleet_svc.agent.admission import (
    ArgRules,
    RejectReason,
    SourceRules,
    check_gpus,
    check_pin,
    check_source,
    refused_arg,
)
from fleet_svc.agent.replica import ReplicaSpec
from llmgw.rejection import Rejection


@dataclass(frozen=True)
class Changes:
    """What applying a desired set does.

    `stop`: replica ids to stop (no longer desired, or replaced by a new revision);
    `start`: specs to start (new, or a new revision of a running one);
    `keep`: specs already running as desired, left alone;
    `rejected`: desired specs the agent refuses.
    """

    stop: tuple[str, ...]
    start: tuple[ReplicaSpec, ...]
    keep: tuple[ReplicaSpec, ...]
    rejected: tuple[Rejection, ...]


def admit(
    desired: Sequence[ReplicaSpec],
    engines: Mapping[str, ArgRules],
    node_cards: Sequence[int],
    sources: SourceRules | None = None,
) -> tuple[list[ReplicaSpec], list[Rejection]]:
    """Split a desired set into the specs the agent will run and the ones it refuses.

    Checked in order: the engine is configured, the arguments pass its rules, the source is
    one the agent accepts (`sources`; None: no local paths) and any revision it pins reaches
    the engine, the cards are
    the node's and no other admitted replica of the set has them. A replica id given twice is
    refused the second time (the set is keyed by replica).
    """
    accepted: list[ReplicaSpec] = []
    rejected: list[Rejection] = []
    taken: dict[int, str] = {}
    seen: set[str] = set()

    def refuse(spec: ReplicaSpec, reason: RejectReason, message: str) -> None:
        rejected.append(Rejection(spec.replica_id, spec.revision, reason.value, message))

    for spec in desired:
        if spec.replica_id in seen:
            refuse(spec, RejectReason.DUPLICATE_REPLICA, "the desired set names this replica twice")
            continue
        seen.add(spec.replica_id)
        rules = engines.get(spec.engine)
        if rules is None:
            allowed = ", ".join(sorted(engines)) or "none"
            refuse(
                spec,
                RejectReason.ENGINE_NOT_ALLOWED,
                f"engine {spec.engine!r} is not in this agent's config (it runs: {allowed})",
            )
            continue
        why = refused_arg(spec.args, rules)
        if why is not None:
            refuse(spec, RejectReason.ARGS_REFUSED, why)
            continue
        why = check_source(spec.source, sources or SourceRules(), needs_source=rules.needs_source)
        if why is not None:
            refuse(spec, RejectReason.SOURCE_REFUSED, why)
            continue
        pin_problem = check_pin(spec.source, spec.args, rules, spec.engine)
        if pin_problem is not None:
            refuse(spec, *pin_problem)
            continue
        gpu_problem = check_gpus(spec.gpus, node_cards, taken)
        if gpu_problem is not None:
            refuse(spec, *gpu_problem)
            continue
        for g in spec.gpus:
            taken[g] = spec.replica_id
        accepted.append(spec)
    return accepted, rejected


def plan_changes(
    desired: Sequence[ReplicaSpec],
    running: Mapping[str, ReplicaSpec],
    engines: Mapping[str, ArgRules],
    node_cards: Sequence[int],
    sources: SourceRules | None = None,
) -> Changes:
    """What to do so that `running` (replica id -> the spec it runs) matches `desired`.

    Level-triggered and idempotent: a spec already running at the same (replica, revision) is
    kept; a running replica not in the admitted set is stopped (a refused one included: the
    fleet asked for something this agent will not run, so the old revision must not pass for
    it); a new revision of a running replica stops the old process and starts the new one.
    """
    accepted, rejected = admit(desired, engines, node_cards, sources)
    by_id = {s.replica_id: s for s in accepted}
    stop: list[str] = []
    start: list[ReplicaSpec] = []
    keep: list[ReplicaSpec] = []
    for replica_id, spec in sorted(running.items()):
        want = by_id.get(replica_id)
        if want is None or want.key != spec.key:
            stop.append(replica_id)
    for spec in accepted:
        current = running.get(spec.replica_id)
        if current is not None and current.key == spec.key:
            keep.append(spec)
        else:
            start.append(spec)
    return Changes(tuple(stop), tuple(start), tuple(keep), tuple(rejected))
