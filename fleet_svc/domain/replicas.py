"""Replicas as the fleet keeps them: what each runs (its spec) and where it stands (its state)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.placement import Want


@dataclass(frozen=True)
class RunSpec:
    """What a replica runs, and what the fleet decided for it beyond its profile, as the
    fleet keeps it.

    The cards it runs on are not here: placement picks them, and `ReplicaState.gpus` holds them.
    Not what a node's agent is sent: that is the agent protocol's `ReplicaSpec`, built from
    the whole `ReplicaState` (fleet_svc/rpc/agent_stream.py `add_spec`) and read by the agent
    as its own `fleet_svc.agent.replica.ReplicaSpec`.
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
    want: Want | None = None
    """What it needs of a node when that is not its profile's current need: the old revision
    started again after an in-place rollout ended early needs the old revision's cards, not
    the new one's (None: the profile's)."""


@dataclass(frozen=True)
class StartProgress:
    """How far a STARTING replica got, as its agent last reported it: its stage
    ("DOWNLOADING" or "LOADING"), bytes fetched of how many (`total_bytes` 0: not known), the
    recent rate, whole files of how many, and the file's name."""

    stage: str
    done_bytes: int = 0
    total_bytes: int = 0
    rate_bytes_per_s: int = 0
    files_done: int = 0
    files_total: int = 0
    file: str = ""


@dataclass(frozen=True)
class Member:
    """One node of a gang (a replica spanning several nodes): its rank, where it runs, and
    what its agent last reported of it. Rank 0 is the head: the node the gateway routes to."""

    rank: int
    node: str
    gpus: tuple[int, ...] = ()
    phase: ReplicaPhase = ReplicaPhase.PENDING
    """As its agent last reported it; PENDING until its agent reports it."""
    gang_address: str = ""
    """host:port it listens on for the rest of its gang (the head's rendezvous for vLLM and
    SGLang, a worker's rpc-server for llama.cpp); "" until its agent reports one."""


@dataclass(frozen=True)
class ReplicaState:
    """A replica the fleet keeps: what it runs, where, its phase and why."""

    id: str
    model: str
    profile: str
    revision: int
    spec: RunSpec = field(default_factory=lambda: RunSpec(engine=""))
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
    members: tuple[Member, ...] = ()
    """A gang's nodes by rank, the head (`node`, `gpus`) first; empty for a replica on one
    node."""
    progress: StartProgress | None = None
    """While STARTING: its agent's last report of its download or load (None otherwise)."""

    @property
    def gang(self) -> bool:
        """Whether the replica spans several nodes."""
        return len(self.members) > 1

    @property
    def nodes(self) -> tuple[str, ...]:
        """Every node the replica runs on, the head first."""
        if self.members:
            return tuple(m.node for m in self.members)
        return (self.node,) if self.node else ()

    def member_on(self, node: str) -> Member | None:
        """The gang member on `node`, if any."""
        return next((m for m in self.members if m.node == node), None)

    def with_member(self, member: Member) -> ReplicaState:
        """The replica with `member` (of the same rank) replaced."""
        return replace(
            self, members=tuple(member if m.rank == member.rank else m for m in self.members)
        )

    trace: str = ""
    """Opaque here: the trace context of the request behind its latest command (its start,
    or its stop once retired), handed to its agent; "" when untraced. Not stored."""

    @property
    def attempt(self) -> int:
        """Which placement of its revision this is (see `RunSpec.attempt`)."""
        return self.spec.attempt


_FIELDS = frozenset(f.name for f in fields(ReplicaState))


def amended(r: ReplicaState, **changes: Any) -> ReplicaState:
    """The replica with `changes` made: `dataclasses.replace` without its call of `__init__`
    (a frozen dataclass sets each of its 18 fields through `object.__setattr__`), about a
    quarter of its time; the controller makes three a replica in a change of 1,000.

    Raises:
        TypeError: a change names no field of ReplicaState.
    """
    if not changes.keys() <= _FIELDS:
        raise TypeError(f"ReplicaState has no field {sorted(changes.keys() - _FIELDS)}")
    new = object.__new__(ReplicaState)
    new.__dict__.update(r.__dict__)
    new.__dict__.update(changes)
    return new
