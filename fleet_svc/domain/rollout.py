"""Rollouts: the persisted state machine that takes a model's replicas to a new revision,
beside the old ones or in their place, one bounded step at a time."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from fleet_svc.domain.canary import CanaryRun
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
from fleet_svc.domain.replicas import ReplicaSpec, ReplicaState

P = ReplicaPhase

DEFAULT_START_TIMEOUT_S = 600.0
"""How long a new replica may take to turn healthy before the rollout fails (large models
take minutes to load)."""


class RolloutState(enum.Enum):
    """Where a rollout stands."""

    PENDING = "PENDING"
    """Committed with its change; the controller has not taken it up yet."""
    RUNNING = "RUNNING"
    """Replacing replicas."""
    SUCCEEDED = "SUCCEEDED"
    """Every step is done: the replicas run the new revision."""
    FAILED = "FAILED"
    """A new replica did not turn healthy; the rollout stopped and says why."""
    CANCELLED = "CANCELLED"
    """Cancelled, or superseded by a newer change of the model."""


class Strategy(enum.Enum):
    """How a step replaces a replica."""

    BESIDE = "beside"
    """The new replica starts on free cards; the old one stops once the new one is ready."""
    IN_PLACE = "in_place"
    """The old replica stops first; the new one starts on the cards it freed."""
    AUTO = "auto"
    """Beside where a node has room, in place where none has, decided per step."""
    CANARY = "canary"
    """Beside, after a canary: one new replica per changed profile serves the policy's
    traffic steps beside the old ones, judged by the gateway's reports (domain.canary)."""


class Stage(enum.Enum):
    """Where one step stands."""

    WAITING = "waiting"
    """Not started (bounded surge: earlier steps first)."""
    STARTING = "starting"
    """The new replica is created and not healthy yet."""
    RETIRING = "retiring"
    """The old replica is drained and stopping; the step waits until it is gone."""
    DONE = "done"
    """The new replica serves and the old one is gone."""
    FAILED = "failed"
    """The new replica did not turn healthy."""
    CANCELLED = "cancelled"
    """The rollout ended before this step finished."""
    CANARY = "canary"
    """The new replica is healthy and serves its canary's traffic share beside the old
    replicas; the step goes on once the canary is promoted."""


class Mode(enum.StrEnum):
    """How a step replaces its replica (the values are what the store keeps)."""

    UNDECIDED = ""
    """Not started yet (an auto rollout decides when the step begins)."""
    BESIDE = "beside"
    """The new replica starts first; the old one stops once the new one is ready."""
    IN_PLACE = "in_place"
    """The old replica stops first; the new one starts on the cards it freed."""


@dataclass(frozen=True)
class Step:
    """One replica's replacement."""

    profile: str
    old_id: str = ""
    new_id: str = ""
    mode: Mode = Mode.UNDECIDED
    stage: Stage = Stage.WAITING
    node: str = ""
    gpus: tuple[int, ...] = ()
    old_node: str = ""
    started_s: float = 0.0
    """When the step started, on the controller's monotonic clock (the start timeout counts
    from it; a restarted fleet starts it again)."""
    message: str = ""
    canary: bool = False
    """This step's new replica is its profile's canary (it starts first and serves the
    canary's traffic steps before its old replica is retired)."""


@dataclass(frozen=True)
class Rollout:
    """A rollout's whole state: what it changes, its steps, and how it ended."""

    id: str
    model: str
    kind: str
    strategy: Strategy
    from_revision: int
    to_revision: int
    steps: tuple[Step, ...]
    state: RolloutState = RolloutState.RUNNING
    surge: int = 1
    reason: str = ""
    log_tail: tuple[str, ...] = ()
    created_s: float = 0.0
    updated_s: float = 0.0
    """Wall-clock times, stamped by whoever stores the rollout (advance and cancel leave them)."""
    by: str = ""
    undo_of: str = ""
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    old_specs: Mapping[str, ReplicaSpec] = field(default_factory=dict)
    """Per profile, the spec of the revision rolled from: an in-place step that fails starts
    the old replica again with it."""
    trace: str = ""
    """The trace context of the request that made the change ("" when untraced): the replicas
    the rollout starts and stops carry it to their agents."""
    canary: CanaryRun | None = None
    """A canary rollout's policy, step and figures (None for other strategies)."""
    failure_reason: str = ""
    """The stable reason of a failure that has one (e.g. CANARY_ANALYSIS_FAILED)."""
    failure_metadata: Mapping[str, str] = field(default_factory=dict)
    """What the failure's reason is about: figures and thresholds, numbers as strings."""

    @property
    def done(self) -> bool:
        """Whether the rollout has ended."""
        return self.state not in (RolloutState.PENDING, RolloutState.RUNNING)


class EventKind(enum.StrEnum):
    """What happened in a rollout (the values are what the store keeps)."""

    ROLLOUT_STARTED = "rollout_started"
    """The rollout was stored and starts."""
    STEP_STARTED = "step_started"
    """A step began."""
    MODE_CHOSEN = "mode_chosen"
    """An auto rollout chose a step's mode."""
    REPLICA_CREATED = "replica_created"
    """A new replica was created."""
    REPLICA_PLACED = "replica_placed"
    """The new replica was placed on a node and cards."""
    REPLICA_READY = "replica_ready"
    """The new replica answers health checks."""
    REPLICA_DRAINING = "replica_draining"
    """A replica is taken out of routing before it stops."""
    REPLICA_STOPPED = "replica_stopped"
    """The old replica is gone."""
    STEP_DONE = "step_done"
    """The new replica serves and the old one is gone."""
    ROLLOUT_SUCCEEDED = "rollout_succeeded"
    """Every step is done."""
    ROLLOUT_FAILED = "rollout_failed"
    """A new replica did not turn healthy; the rollout stopped."""
    ROLLOUT_CANCELLED = "rollout_cancelled"
    """Cancelled or superseded."""
    CANARY_STEP = "canary_step"
    """A canary step began: the new revision's share of the model's weight."""
    CANARY_ANALYSIS = "canary_analysis"
    """A canary step was judged: its figures and verdict."""
    UNKNOWN = "unknown"
    """A stored kind this fleet's code does not know (written by a newer fleet): read, never
    written."""


ENDINGS = frozenset(
    {EventKind.ROLLOUT_SUCCEEDED, EventKind.ROLLOUT_FAILED, EventKind.ROLLOUT_CANCELLED}
)
"""The kinds of a rollout's last event: the only ones after which it is no longer RUNNING."""


@dataclass(frozen=True)
class Event:
    """What happened to which replica on which node and cards."""

    kind: EventKind
    profile: str = ""
    replica_id: str = ""
    node: str = ""
    gpus: tuple[int, ...] = ()
    mode: Mode = Mode.UNDECIDED
    message: str = ""
    canary: CanaryRun | None = None
    """A canary event's step, weights, figures and verdict."""


@dataclass(frozen=True)
class RolloutEvent:
    """One event of a rollout as the store keeps it: its place in the rollout's sequence
    (`seq`, from 1), when it was stored (`at_s`, wall-clock seconds), what happened, and the
    rollout's state right after it (RUNNING until the ending event, which carries the end)."""

    rollout_id: str
    seq: int
    at_s: float
    event: Event
    state: RolloutState = RolloutState.RUNNING


def plan_steps(
    model: str, profiles: set[str], replicas: Mapping[str, ReplicaState], wants: list[ProfileWant]
) -> tuple[Step, ...]:
    """One step per replica of the changed profiles (pending ones are simply replaced), and a
    step per replica the profile wants beyond those that exist."""
    steps: list[Step] = []
    for w in wants:
        if w.model != model or w.profile not in profiles:
            continue
        old = sorted(
            (
                r
                for r in replicas.values()
                if r.model == model
                and r.profile == w.profile
                and not r.retire
                and r.phase in (P.PENDING, P.STARTING, P.READY, P.CRASHED)
            ),
            key=lambda r: (r.phase is not P.PENDING, r.entered_s, r.id),
        )
        steps.extend(Step(profile=w.profile, old_id=r.id, old_node=r.node) for r in old)
        steps.extend(Step(profile=w.profile) for _ in range(max(w.replicas - len(old), 0)))
    return tuple(steps)


def mark_canaries(steps: tuple[Step, ...]) -> tuple[Step, ...]:
    """The steps with each profile's first replacement of a serving replica (else its first
    step) marked as that profile's canary."""
    chosen: dict[str, int] = {}
    for i, step in enumerate(steps):
        if step.profile not in chosen or (step.old_id and not steps[chosen[step.profile]].old_id):
            chosen[step.profile] = i
    picked = set(chosen.values())
    return tuple(replace(s, canary=i in picked) for i, s in enumerate(steps))


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


def in_canary(ro: Rollout) -> bool:
    """Whether a rollout's canary is still being judged (not promoted yet)."""
    return ro.canary is not None and not ro.canary.promoted


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
