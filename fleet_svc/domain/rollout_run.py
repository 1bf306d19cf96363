"""Running a rollout: moving it on by what its replicas' phases allow, one bounded step at a
time (beside the old replicas or in their place), and ending it (succeeded, failed,
cancelled). The values it works on are `fleet_svc.domain.rollout`'s."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from fleet_svc.domain.catalog import ProfileWant
from fleet_svc.domain.control import Action, Create, Retire, cards_in_use
from fleet_svc.domain.nodes import NodeView
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.placement import (
    GangShortfall,
    Placement,
    Want,
    most_free,
    place,
    place_gang,
)
from fleet_svc.domain.replicas import ReplicaState
from fleet_svc.domain.rollout import (
    Event,
    EventKind,
    Mode,
    Rollout,
    RolloutState,
    Stage,
    Step,
    Strategy,
    in_canary,
)

P = ReplicaPhase


def room_beside(
    want: Want, nodes: Mapping[str, NodeView], replicas: Mapping[str, ReplicaState]
) -> tuple[bool, int]:
    """Whether some READY node can take one more replica of `want` now, and the most free
    cards any node of its class has."""
    used_cards, used_ram = cards_in_use(replicas)
    if want.gang:
        gang = place_gang(want, nodes.values(), used_cards, used_ram)
        return not isinstance(gang, GangShortfall), most_free(want, nodes.values(), used_cards)
    where = place(want, nodes.values(), used_cards, used_ram)
    return isinstance(where, Placement), most_free(want, nodes.values(), used_cards)


def gang_shortfall(
    want: Want, nodes: Mapping[str, NodeView], replicas: Mapping[str, ReplicaState]
) -> GangShortfall | None:
    """Why a whole new gang of `want` cannot start beside the replicas now (None: it can)."""
    used_cards, used_ram = cards_in_use(replicas)
    gang = place_gang(want, nodes.values(), used_cards, used_ram)
    return gang if isinstance(gang, GangShortfall) else None


@dataclass
class _Tick:
    """What one advance produces."""

    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)


def advance(
    ro: Rollout,
    replicas: Mapping[str, ReplicaState],
    wants: Mapping[tuple[str, str], ProfileWant],
    nodes: Mapping[str, NodeView],
    now_s: float,
    *,
    new_id: Callable[[], str],
    logs: Mapping[str, tuple[str, ...]],
) -> tuple[Rollout, list[Action], list[Event]]:
    """Move a running rollout on by what the replicas' phases allow, level-triggered.

    Returns:
        The rollout as it now stands, the actions for the controller (create, retire), and
        the events to record.
    """
    if ro.done:
        return ro, [], []
    out = _Tick()
    steps = list(ro.steps)
    busy = sum(1 for s in steps if s.stage in (Stage.STARTING, Stage.RETIRING))
    failure: tuple[Step, str] | None = None
    judging = in_canary(ro)
    for i, step in enumerate(steps):
        want = wants.get((ro.model, step.profile))
        if want is None:
            steps[i] = replace(step, stage=Stage.CANCELLED, message="the profile was removed")
            continue
        if judging and step.stage is Stage.WAITING:
            # Until the canary is promoted only the canaries start (all at once: each is one
            # replica beside its profile's old ones); the other steps wait for the verdict.
            if step.canary:
                steps[i] = _begin(ro, step, want, replicas, nodes, now_s, new_id, out)
            continue
        if step.stage is Stage.WAITING and busy < max(ro.surge, 1):
            steps[i] = _begin(ro, step, want, replicas, nodes, now_s, new_id, out)
            busy += 1
        elif step.stage is Stage.STARTING:
            steps[i], why = _starting(ro, step, want, replicas, now_s, out)
            if why:
                failure = (steps[i], why)
                break
        elif step.stage is Stage.RETIRING:
            steps[i] = _retiring(ro, step, want, replicas, now_s, new_id, out)
        elif step.stage is Stage.CANARY and not judging:
            steps[i] = _after_canary(ro, step, replicas, out)
        if step.stage in (Stage.STARTING, Stage.RETIRING) and steps[i].stage is Stage.DONE:
            busy -= 1  # a step that finished frees its place for a waiting one this pass
    ro = replace(ro, steps=tuple(steps))
    if failure is not None:
        step, why = failure
        return _end(
            ro, RolloutState.FAILED, why, replicas, now_s, new_id, out, logs.get(step.new_id, ())
        )
    if all(s.stage in (Stage.DONE, Stage.CANCELLED) for s in ro.steps):
        ro = replace(ro, state=RolloutState.SUCCEEDED)
        out.events.append(
            Event(EventKind.ROLLOUT_SUCCEEDED, message=f"revision {ro.to_revision} serves")
        )
    return ro, out.actions, out.events


def fail(
    ro: Rollout,
    reason: str,
    replicas: Mapping[str, ReplicaState],
    now_s: float,
    *,
    new_id: Callable[[], str],
    events: tuple[Event, ...] = (),
) -> tuple[Rollout, list[Action], list[Event]]:
    """End a running rollout FAILED for `reason` (after `events`): the new replicas are
    stopped (a canary's too), old ones keep serving."""
    if ro.done:
        return ro, [], []
    out = _Tick(events=list(events))
    return _end(ro, RolloutState.FAILED, reason, replicas, now_s, new_id, out, ())


def cancel(
    ro: Rollout,
    reason: str,
    replicas: Mapping[str, ReplicaState],
    now_s: float,
    *,
    new_id: Callable[[], str],
) -> tuple[Rollout, list[Action], list[Event]]:
    """End a running rollout: the new replica in flight is stopped, old ones keep serving
    (an in-place step's old replica is started again)."""
    if ro.done:
        return ro, [], []
    out = _Tick()
    return _end(ro, RolloutState.CANCELLED, reason, replicas, now_s, new_id, out, ())


def _new_replica(
    ro: Rollout, step: Step, want: ProfileWant, rid: str, now_s: float, prefer: str = ""
) -> ReplicaState:
    spec = replace(want.spec, rollout=ro.id, prefer_node=prefer)
    return ReplicaState(
        id=rid,
        model=ro.model,
        profile=step.profile,
        revision=ro.to_revision,
        entered_s=now_s,
        ram_bytes=want.want.ram_bytes,
        spec=spec,
        reason=f"started by rollout {ro.id}",
    )


def _begin(
    ro: Rollout,
    step: Step,
    want: ProfileWant,
    replicas: Mapping[str, ReplicaState],
    nodes: Mapping[str, NodeView],
    now_s: float,
    new_id: Callable[[], str],
    out: _Tick,
) -> Step:
    """Start a step: beside creates the new replica, in place retires the old one first."""
    old = replicas.get(step.old_id) if step.old_id else None
    if old is None or old.phase is P.PENDING:
        mode = Mode.BESIDE
        if old is not None:
            out.actions.append(Retire(old.id, f"replaced by rollout {ro.id} before it was placed"))
    elif ro.strategy in (Strategy.BESIDE, Strategy.CANARY):
        mode = Mode.BESIDE
    elif ro.strategy is Strategy.IN_PLACE:
        mode = Mode.IN_PLACE
    else:
        room, _ = room_beside(want.want, nodes, replicas)
        mode = Mode.BESIDE if room else Mode.IN_PLACE
        out.events.append(
            Event(
                EventKind.MODE_CHOSEN,
                step.profile,
                old.id,
                old.node,
                old.gpus,
                mode,
                "a node has room beside it" if room else "no node has room beside it",
            )
        )
    out.events.append(
        Event(EventKind.STEP_STARTED, step.profile, step.old_id, step.old_node, (), mode, "")
    )
    if mode is Mode.BESIDE:
        rid = new_id()
        out.actions.append(Create(_new_replica(ro, step, want, rid, now_s)))
        out.events.append(Event(EventKind.REPLICA_CREATED, step.profile, rid, mode=mode))
        return replace(step, mode=mode, stage=Stage.STARTING, new_id=rid, started_s=now_s)
    assert old is not None
    out.actions.append(Retire(old.id, f"replaced in place by rollout {ro.id}"))
    out.events.append(
        Event(
            EventKind.REPLICA_DRAINING,
            step.profile,
            old.id,
            old.node,
            old.gpus,
            mode,
            "stopped first",
        )
    )
    return replace(step, mode=mode, stage=Stage.RETIRING, old_node=old.node, started_s=now_s)


def _starting(
    ro: Rollout,
    step: Step,
    want: ProfileWant,
    replicas: Mapping[str, ReplicaState],
    now_s: float,
    out: _Tick,
) -> tuple[Step, str]:
    """Wait for the new replica's health; on it, retire the old one (beside) or finish.

    Returns:
        The step, and a reason when the rollout must fail.
    """
    new = replicas.get(step.new_id)
    if new is None:
        # Created before a restart and not persisted, or forgotten: create it again, same id.
        prefer = step.old_node if step.mode is Mode.IN_PLACE else ""
        out.actions.append(Create(_new_replica(ro, step, want, step.new_id, now_s, prefer)))
        return step, ""
    if new.node and not step.node:
        step = replace(step, node=new.node, gpus=new.gpus)
        out.events.append(
            Event(EventKind.REPLICA_PLACED, step.profile, new.id, new.node, new.gpus, step.mode)
        )
    if new.phase in (P.CRASHED, P.FAILED):
        return step, (
            f"replica {new.id} on {new.node or 'no node'} did not become healthy: {new.reason}"
        )
    if new.phase is not P.READY:
        if now_s - step.started_s > ro.start_timeout_s:
            where = new.node or "no node"
            return step, (
                f"replica {new.id} on {where} was not healthy within {ro.start_timeout_s:.0f} s"
                f" ({new.phase.value}: {new.reason})"
            )
        return step, ""
    out.events.append(
        Event(EventKind.REPLICA_READY, step.profile, new.id, new.node, new.gpus, step.mode)
    )
    if step.canary and in_canary(ro):
        return replace(step, stage=Stage.CANARY), ""
    old = replicas.get(step.old_id) if step.old_id else None
    if step.mode is Mode.BESIDE and old is not None:
        out.actions.append(Retire(old.id, f"replaced beside by rollout {ro.id}"))
        out.events.append(
            Event(EventKind.REPLICA_DRAINING, step.profile, old.id, old.node, old.gpus, step.mode)
        )
        return replace(step, stage=Stage.RETIRING), ""
    out.events.append(
        Event(EventKind.STEP_DONE, step.profile, new.id, new.node, new.gpus, step.mode)
    )
    return replace(step, stage=Stage.DONE), ""


def _after_canary(
    ro: Rollout, step: Step, replicas: Mapping[str, ReplicaState], out: _Tick
) -> Step:
    """The canary was promoted: its step goes on as a beside step whose new replica is
    ready (the old one is retired, or the step is done when it replaces none)."""
    old = replicas.get(step.old_id) if step.old_id else None
    if old is not None:
        out.actions.append(Retire(old.id, f"replaced beside by rollout {ro.id}'s canary"))
        out.events.append(
            Event(EventKind.REPLICA_DRAINING, step.profile, old.id, old.node, old.gpus, step.mode)
        )
        return replace(step, stage=Stage.RETIRING)
    out.events.append(
        Event(EventKind.STEP_DONE, step.profile, step.new_id, step.node, step.gpus, step.mode)
    )
    return replace(step, stage=Stage.DONE)


def _retiring(
    ro: Rollout,
    step: Step,
    want: ProfileWant,
    replicas: Mapping[str, ReplicaState],
    now_s: float,
    new_id: Callable[[], str],
    out: _Tick,
) -> Step:
    """Wait until the old replica is gone (stopped, its cards freed); then finish (beside)
    or start the new one on its cards (in place)."""
    if step.old_id in replicas:
        return step
    out.events.append(
        Event(EventKind.REPLICA_STOPPED, step.profile, step.old_id, step.old_node, (), step.mode)
    )
    if step.mode is Mode.BESIDE:
        out.events.append(
            Event(EventKind.STEP_DONE, step.profile, step.new_id, step.node, step.gpus, step.mode)
        )
        return replace(step, stage=Stage.DONE)
    rid = new_id()
    out.actions.append(Create(_new_replica(ro, step, want, rid, now_s, step.old_node)))
    out.events.append(
        Event(EventKind.REPLICA_CREATED, step.profile, rid, step.old_node, (), step.mode)
    )
    return replace(step, stage=Stage.STARTING, new_id=rid, started_s=now_s)


def _end(
    ro: Rollout,
    state: RolloutState,
    reason: str,
    replicas: Mapping[str, ReplicaState],
    now_s: float,
    new_id: Callable[[], str],
    out: _Tick,
    log_tail: tuple[str, ...],
) -> tuple[Rollout, list[Action], list[Event]]:
    """Stop where the rollout stands: new replicas in flight are stopped; an in-place step
    whose old replica is gone gets the old revision started again."""
    steps = []
    for step in ro.steps:
        if step.stage in (Stage.DONE, Stage.CANCELLED, Stage.FAILED):
            steps.append(step)
            continue
        new = replicas.get(step.new_id) if step.new_id else None
        if step.stage in (Stage.STARTING, Stage.CANARY) and new is not None:
            out.actions.append(Retire(new.id, f"rollout {ro.id} {state.value.lower()}: {reason}"))
            out.events.append(
                Event(
                    EventKind.REPLICA_DRAINING,
                    step.profile,
                    new.id,
                    new.node,
                    new.gpus,
                    step.mode,
                    reason,
                )
            )
        old_gone = step.old_id and step.old_id not in replicas
        if step.mode is Mode.IN_PLACE and step.stage is not Stage.WAITING and old_gone:
            spec = ro.old_specs.get(step.profile)
            if spec is not None:
                rid = new_id()
                restored = replace(spec, prefer_node=step.old_node)
                out.actions.append(
                    Create(
                        ReplicaState(
                            id=rid,
                            model=ro.model,
                            profile=step.profile,
                            revision=ro.from_revision,
                            entered_s=now_s,
                            spec=restored,
                            reason=f"the old revision started again after rollout {ro.id}",
                        )
                    )
                )
                out.events.append(
                    Event(
                        EventKind.REPLICA_CREATED,
                        step.profile,
                        rid,
                        step.old_node,
                        (),
                        step.mode,
                        f"revision {ro.from_revision} started again",
                    )
                )
        stage = (
            Stage.FAILED
            if state is RolloutState.FAILED and step.stage is not Stage.WAITING
            else Stage.CANCELLED
        )
        steps.append(replace(step, stage=stage))
    kind = EventKind.ROLLOUT_FAILED if state is RolloutState.FAILED else EventKind.ROLLOUT_CANCELLED
    out.events.append(Event(kind, message=reason))
    ended = replace(ro, steps=tuple(steps), state=state, reason=reason, log_tail=log_tail)
    return ended, out.actions, out.events
