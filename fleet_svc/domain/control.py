"""The control plan: from what is wanted and what is observed, what to do next."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from fleet_svc.domain.catalog import ProfileWant
from fleet_svc.domain.nodes import NodePhase, NodeView
from fleet_svc.domain.phases import HOLDS_CARDS, ReplicaPhase
from fleet_svc.domain.placement import (
    GangShortfall,
    Placement,
    Want,
    card_key,
    free_cards,
    place,
    place_gang,
)
from fleet_svc.domain.replicas import ReplicaState, StartProgress

P = ReplicaPhase

MAX_ATTEMPTS = 3
"""Times a profile's replica is placed again after it FAILED before the fleet stops trying
(until the model changes)."""


@dataclass(frozen=True)
class Create:
    """Add a replica record (PENDING) for a profile."""

    replica: ReplicaState


@dataclass(frozen=True)
class Assign:
    """Put a pending replica on a node's cards (it becomes STARTING); a gang on every one
    of its members' nodes at once, the head's placement first in `members`."""

    replica_id: str
    placement: Placement
    members: tuple[Placement, ...] = ()


@dataclass(frozen=True)
class Hold:
    """Keep a replica pending, saying why."""

    replica_id: str
    reason: str


@dataclass(frozen=True)
class Move:
    """Change a replica's phase (through the transition table), with why."""

    replica_id: str
    phase: ReplicaPhase
    reason: str = ""


@dataclass(frozen=True)
class Retire:
    """Take a replica out: a READY one is drained first (the gateway stops routing to it),
    a PENDING one is dropped, any other is stopped."""

    replica_id: str
    reason: str = "no longer wanted"


@dataclass(frozen=True)
class Forget:
    """Drop a replica's record: it is stopped, or its node is lost and it is replaced."""

    replica_id: str


@dataclass(frozen=True)
class MarkRetiring:
    """Record that a replica is wanted gone (it is not counted, and is stopped when it can be)."""

    replica_id: str


@dataclass(frozen=True)
class Report:
    """Record what an agent reports of a replica: its phase (through the transition table),
    why, its address, restarts and (while STARTING) its progress."""

    replica_id: str
    phase: ReplicaPhase
    reason: str
    address: str
    restarts: int
    progress: StartProgress | None = None


@dataclass(frozen=True)
class ReportMember:
    """Record what the agent of one gang member reports of it: its phase and the address it
    listens on for its gang."""

    replica_id: str
    rank: int
    phase: ReplicaPhase
    gang_address: str


Action = Create | Assign | Hold | Move | Retire | Forget | MarkRetiring | Report | ReportMember

_RETIRED_TO = {
    P.READY: P.DRAINING,
    P.PENDING: P.STOPPED,
    P.STARTING: P.STOPPING,
    P.CRASHED: P.STOPPING,
    P.LOST: P.STOPPING,
    P.FAILED: P.STOPPED,
}
"""Where retiring takes a replica: a READY one is drained first, a PENDING or FAILED one runs
nowhere and is stopped at once, the rest are asked to stop (DRAINING and STOPPING are on the
way already)."""


def retirement(r: ReplicaState, reason: str) -> list[Action]:
    """What taking `r` out does: mark it wanted gone, and move it toward STOPPED."""
    out: list[Action] = [] if r.retire else [MarkRetiring(r.id)]
    phase = _RETIRED_TO.get(r.phase)
    if phase is not None:
        out.append(Move(r.id, phase, reason))
    return out


ACTIVE = frozenset({P.PENDING, P.STARTING, P.READY, P.CRASHED})
"""Phases that count toward the replicas a profile wants."""


def cards_in_use(
    replicas: Mapping[str, ReplicaState], skip: frozenset[str] = frozenset()
) -> tuple[dict[str, set[int]], dict[str, int]]:
    """Per node, the cards and the RAM its replicas hold."""
    used_cards: dict[str, set[int]] = {}
    used_ram: dict[str, int] = {}
    for r in replicas.values():
        if r.id in skip or not r.node or r.phase not in HOLDS_CARDS:
            continue
        for node, gpus in _held(r):
            used_cards.setdefault(node, set()).update(gpus)
            used_ram[node] = used_ram.get(node, 0) + r.ram_bytes
    return used_cards, used_ram


def _held(r: ReplicaState) -> list[tuple[str, tuple[int, ...]]]:
    """The (node, cards) a replica holds: one pair, or one per gang member."""
    if r.members:
        return [(m.node, m.gpus) for m in r.members]
    return [(r.node, r.gpus)]


def plan_actions(
    wants: list[ProfileWant],
    replicas: Mapping[str, ReplicaState],
    nodes: Mapping[str, NodeView],
    now_s: float,
    *,
    drain_s: float,
    new_id: Callable[[], str],
    managed: frozenset[tuple[str, str]] = frozenset(),
) -> list[Action]:
    """What the controller does this tick, level-triggered.

    Args:
        wants: every profile of every model in the catalog.
        replicas: the replicas the fleet keeps.
        nodes: the nodes, their phases already computed for `now_s`.
        now_s: the time of the tick, on the monotonic clock `ReplicaState.entered_s` is on.
        drain_s: how long a drained replica keeps running before it is stopped.
        new_id: makes a fresh replica id.
        managed: (model, profile) pairs a rollout is changing; their counts are its business.
    Returns:
        Actions in the order to apply them.
    """
    actions: list[Action] = []
    by_key: dict[tuple[str, str], list[ReplicaState]] = {}
    for r in replicas.values():
        by_key.setdefault((r.model, r.profile), []).append(r)
    wanted_keys = {(w.model, w.profile) for w in wants}

    # Lost nodes: their replicas are gone; the counts below place replacements.
    # A gang is lost with any of its nodes: its other members cannot go on without it.
    lost_nodes = {name for name, v in nodes.items() if v.phase is NodePhase.LOST}
    for r in replicas.values() if lost_nodes else ():
        if r.phase is P.STOPPED:
            continue
        gone = [n for n in r.nodes if n in lost_nodes]
        if gone:
            why = f"node {gone[0]} was lost"
            if r.gang:
                rank = next(m.rank for m in r.members if m.node == gone[0])
                why = f"node {gone[0]} (rank {rank} of its gang of {len(r.members)}) was lost"
            actions.append(Move(r.id, P.LOST, why))
            actions.append(Forget(r.id))

    # Replicas of models or profiles no longer in the catalog are retired.
    for key, group in by_key.items():
        if key not in wanted_keys:
            actions.extend(_retire(r, now_s) for r in group if not r.retire)

    lost = {a.replica_id for a in actions if isinstance(a, Forget)}
    for w in wants:
        group = [r for r in by_key.get((w.model, w.profile), []) if r.id not in lost]
        if (w.model, w.profile) in managed:
            continue
        active = [r for r in group if r.phase in ACTIVE and not r.retire]
        failed = [r for r in group if r.phase is P.FAILED and not r.retire]
        failed_now = [r for r in failed if r.revision == w.revision]
        attempts = max((r.attempt for r in failed_now), default=0)
        give_up = attempts >= MAX_ATTEMPTS
        for r in failed:
            if not (give_up and r.revision == w.revision):
                actions.append(_retire(r, now_s, f"failed ({r.reason}); placed again"))
        if give_up:
            for r in failed_now:
                if not r.reason.startswith("gave up"):
                    actions.append(Hold(r.id, f"gave up after {MAX_ATTEMPTS} attempts: {r.reason}"))
        missing = w.replicas - len(active) - (len(failed_now) if give_up else 0)
        # One spec for the profile's new replicas (a change of 1,000 made 1,000 copies).
        spec = replace(w.spec, attempt=attempts + 1) if missing > 0 else w.spec
        for _ in range(max(missing, 0)):
            actions.append(
                Create(
                    ReplicaState(
                        id=new_id(),
                        model=w.model,
                        profile=w.profile,
                        revision=w.revision,
                        entered_s=now_s,
                        ram_bytes=w.want.ram_bytes,
                        spec=spec,
                        reason="waiting for a node",
                    )
                )
            )
        if missing < 0:
            # Fewest losses first: pending, then starting or crashed, then the newest ready.
            order = {P.PENDING: 0, P.CRASHED: 1, P.STARTING: 2, P.READY: 3}
            surplus = sorted(active, key=lambda r: (order[r.phase], -r.entered_s))[:-missing]
            actions.extend(_retire(r, now_s) for r in surplus)

    # Draining replicas stop once the drain delay has passed.
    for r in replicas.values():
        if r.phase is P.DRAINING and now_s - r.entered_s >= drain_s and r.id not in lost:
            actions.append(Move(r.id, P.STOPPING, "drained"))
        if r.phase is P.STOPPED:
            actions.append(Forget(r.id))

    actions.extend(_placements(wants, replicas, actions, nodes))
    return actions


def _retire(r: ReplicaState, now_s: float, reason: str = "no longer wanted") -> Action:
    """The action that takes a replica out."""
    return Retire(r.id, reason)


def _placements(
    wants: list[ProfileWant],
    replicas: Mapping[str, ReplicaState],
    planned: list[Action],
    nodes: Mapping[str, NodeView],
) -> list[Action]:
    """Assign every pending replica (existing or created this tick) a node, or say why not."""
    stopped = {a.replica_id for a in planned if isinstance(a, Retire)}
    pending = [r for r in replicas.values() if r.phase is P.PENDING and r.id not in stopped]
    pending += [a.replica for a in planned if isinstance(a, Create)]
    if not pending:
        return []  # most ticks: nothing to place, so no count of the cards in use
    gone = frozenset(a.replica_id for a in planned if isinstance(a, Forget))
    used_cards, used_ram = cards_in_use(replicas, gone)
    want_of = {(w.model, w.profile): w.want for w in wants}
    out: list[Action] = []
    by_name = sorted(nodes.values(), key=lambda n: n.name)
    free = _FreeCards(by_name, used_cards)
    for r in sorted(pending, key=lambda r: (r.entered_s, r.id)):
        want = want_of.get((r.model, r.profile))
        if want is None or r.retire:
            continue
        if r.spec.want is not None:
            want = r.spec.want
        if r.spec.prefer_node:
            want = replace(want, prefer=r.spec.prefer_node)
        if want.gang:
            gang = place_gang(want, by_name, used_cards, used_ram)
            if isinstance(gang, GangShortfall):
                out.append(Hold(r.id, gang.message))
                continue
            for member in gang:
                used_cards.setdefault(member.node, set()).update(member.gpus)
                used_ram[member.node] = used_ram.get(member.node, 0) + want.ram_bytes
            out.append(Assign(r.id, gang[0], gang))
            free = _FreeCards(by_name, used_cards)  # the gang took cards on several nodes
            continue
        where = free.take(want) if not want.on_cpu else None
        if where is None:
            # Nothing fits (or a CPU replica): the full scan also says why.
            found = place(want, by_name, used_cards, used_ram, presorted=True)
            if isinstance(found, str):
                out.append(Hold(r.id, found))
                continue
            where = found
        used_cards.setdefault(where.node, set()).update(where.gpus)
        used_ram[where.node] = used_ram.get(where.node, 0) + want.ram_bytes
        out.append(Assign(r.id, where))
    return out


class _FreeCards:
    """Free cards of READY nodes by card class, kept as placements take them, so placing R
    replicas costs about R node look-ups rather than R scans of every node (the same choice
    as `place`: not avoided, then preferred, then fewest cards left, then the name)."""

    def __init__(self, by_name: list[NodeView], used: Mapping[str, set[int]]) -> None:
        self._by_class: dict[str, dict[str, list[int]]] = {}
        for node in by_name:
            if node.phase is not NodePhase.READY or not node.cards:
                continue
            idx = free_cards(node, used.get(node.name, ()))
            if idx:
                self._by_class.setdefault(card_key(node.gpu_class), {})[node.name] = idx

    def take(self, want: Want) -> Placement | None:
        """The placement `place` would choose, with its cards taken; None when none fits."""
        nodes = self._by_class.get(card_key(want.gpu_class), {})
        best: tuple[bool, bool, int, str] | None = None
        for name, idx in nodes.items():
            if len(idx) < want.gpus:
                continue
            key = (name in want.avoid, name != want.prefer, len(idx) - want.gpus, name)
            if best is None or key < best:
                best = key
                if not key[0] and key[2] == 0 and (not want.prefer or not key[1]):
                    break  # nothing can beat an exact fit on a node it may use (names ascend)
        if best is None:
            return None
        name = best[3]
        gpus = tuple(nodes[name][: want.gpus])
        rest = nodes[name][want.gpus :]
        if rest:
            nodes[name] = rest
        else:
            del nodes[name]
        return Placement(node=name, gpus=gpus)
