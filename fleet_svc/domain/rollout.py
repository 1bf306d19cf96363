"""Rollouts: the persisted state machine that takes a model's replicas to a new revision,
beside the old ones or in their place. Its values (states, steps, events) and the planning of
its steps are here; moving it on is `fleet_svc.domain.rollout_run`'s."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from fleet_svc.domain.canary import CanaryRun
from fleet_svc.domain.catalog import ProfileWant
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.replicas import ReplicaState, RunSpec

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
    old_specs: Mapping[str, RunSpec] = field(default_factory=dict)
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


def in_canary(ro: Rollout) -> bool:
    """Whether a rollout's canary is still being judged (not promoted yet)."""
    return ro.canary is not None and not ro.canary.promoted
