"""Replicas as the fleet keeps them: what each runs (its spec) and where it stands (its state)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fleet_svc.domain.phases import ReplicaPhase


@dataclass(frozen=True)
class ReplicaSpec:
    """What a replica runs, and what the fleet decided for it beyond its profile.

    The cards it runs on are not here: placement picks them, and `ReplicaState.gpus` holds them.
    """

    engine: str
    args: tuple[str, ...] = ()
    source: str = ""
    prefer_node: str = ""
    """A node tried first: an in-place replacement goes back where the old replica ran."""
    rollout: str = ""
    """The rollout that started it ("" for one the counts of its profile started)."""
    attempt: int = 1
    """Which placement this is after FAILED ones of the same revision (1 for the first)."""


@dataclass(frozen=True)
class ReplicaState:
    """A replica the fleet keeps: what it runs, where, its phase and why."""

    id: str
    model: str
    profile: str
    revision: int
    spec: ReplicaSpec = field(default_factory=lambda: ReplicaSpec(engine=""))
    phase: ReplicaPhase = ReplicaPhase.PENDING
    node: str = ""
    gpus: tuple[int, ...] = ()
    reason: str = ""
    address: str = ""
    restarts: int = 0
    since_s: float = 0.0
    """When it entered its phase, on the wall clock (shown to people, kept across restarts);
    the controller stamps it."""
    entered_s: float = 0.0
    """When it entered its phase, on the controller's monotonic clock: what durations (the
    drain delay) and the order of replicas are measured by."""
    ram_bytes: int = 0
    retire: bool = False
    """Wanted gone: drained (if it was ready), then stopped."""

    @property
    def attempt(self) -> int:
        """Which placement of its revision this is (see `ReplicaSpec.attempt`)."""
        return self.spec.attempt
