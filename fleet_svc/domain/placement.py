"""Placement: which node and cards a replica goes on, or why it cannot go anywhere."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from fleet_svc.domain.nodes import NodePhase, NodeView


@dataclass(frozen=True)
class Want:
    """What a replica needs of a node: `gpus` cards of `gpu_class`, or `ram_bytes` of RAM
    for a CPU profile. `avoid` lists nodes it failed on, tried last."""

    gpu_class: str = ""
    gpus: int = 0
    ram_bytes: int = 0
    avoid: frozenset[str] = frozenset()
    prefer: str = ""
    """A node tried first (an in-place replacement goes back on the cards it freed)."""
    nodes: int = 1
    """Nodes one replica spans: more than one makes it a gang, `gpus` cards on each node,
    placed on all of them or on none."""

    @property
    def gang(self) -> bool:
        """Whether one replica spans several nodes."""
        return self.nodes > 1

    @property
    def on_cpu(self) -> bool:
        """Whether it runs in RAM rather than on cards."""
        return not self.gpu_class or self.gpus <= 0


@dataclass(frozen=True)
class Placement:
    """A node and the indices of its cards."""

    node: str
    gpus: tuple[int, ...] = ()


@functools.lru_cache(maxsize=1024)
def card_key(name: str) -> str:
    """A card class as compared: case and spacing aside."""
    return name.strip().lower().replace(" ", "")


def same_class(a: str, b: str) -> bool:
    """Whether two card classes name the same card (case and spacing aside)."""
    return card_key(a) == card_key(b)


def free_cards(node: NodeView, used: Iterable[int]) -> list[int]:
    """The indices of a node's cards no replica holds."""
    taken = set(used)
    return [c.index for c in node.cards if c.index not in taken]


def most_free(
    want: Want, nodes: Iterable[NodeView], used_cards: Mapping[str, Iterable[int]]
) -> int:
    """The most free cards of `want`'s class on any READY node."""
    return max(
        (
            len(free_cards(n, used_cards.get(n.name, ())))
            for n in nodes
            if n.phase is NodePhase.READY and same_class(n.gpu_class, want.gpu_class)
        ),
        default=0,
    )


def place(
    want: Want,
    nodes: Iterable[NodeView],
    used_cards: Mapping[str, Iterable[int]],
    used_ram: Mapping[str, int],
    *,
    presorted: bool = False,
) -> Placement | str:
    """The node a replica goes on, or a reason a person can read why none can take it.

    Among READY nodes of the class with enough free cards (or RAM), the one with the fewest
    free cards left wins (big holes are kept for big replicas), then the name; `want.prefer`
    before others, nodes in `want.avoid` only when nothing else fits.
    """
    candidates: list[tuple[bool, bool, int, str, tuple[int, ...]]] = []
    seen: list[str] = []
    for node in nodes if presorted else sorted(nodes, key=lambda n: n.name):
        if node.phase is not NodePhase.READY:
            seen.append(f"{node.name} is {node.phase.value}")
            continue
        if want.on_cpu:
            free = node.memory_bytes - used_ram.get(node.name, 0)
            if free >= want.ram_bytes:
                candidates.append(
                    (node.name in want.avoid, node.name != want.prefer, 0, node.name, ())
                )
            else:
                seen.append(f"{node.name} has {free / 1e9:.0f} GB of RAM free")
            continue
        if not same_class(node.gpu_class, want.gpu_class):
            continue
        free_idx = free_cards(node, used_cards.get(node.name, ()))
        if len(free_idx) >= want.gpus:
            left = len(free_idx) - want.gpus
            candidates.append(
                (
                    node.name in want.avoid,
                    node.name != want.prefer,
                    left,
                    node.name,
                    tuple(free_idx[: want.gpus]),
                )
            )
        else:
            seen.append(f"{node.name}: {len(free_idx)} free")
    if candidates:
        _, _, _, name, gpus = min(candidates)
        return Placement(node=name, gpus=gpus)
    if want.on_cpu:
        need = f"{want.ram_bytes / 1e9:.0f} GB of RAM"
    else:
        need = f"{want.gpus} free {want.gpu_class} card{'s' if want.gpus != 1 else ''}"
    if not seen:
        return (
            f"no node has {want.gpu_class or 'CPU'} cards for {need}"
            if not want.on_cpu
            else (f"no node has {need} free")
        )
    return f"no READY node has {need} ({'; '.join(seen)})"


def need_text(want: Want) -> str:
    """What one node of a replica needs, in words ("4 free H100 cards", "8 GB of RAM")."""
    if want.on_cpu:
        return f"{want.ram_bytes / 1e9:.0f} GB of RAM"
    return f"{want.gpus} free {want.gpu_class} card{'s' if want.gpus != 1 else ''}"


def _fits(
    want: Want, node: NodeView, used_cards: Mapping[str, Iterable[int]], used_ram: Mapping[str, int]
) -> tuple[int, tuple[int, ...]] | str | None:
    """(cards left over, the cards taken) when `node` can hold one member of `want`; a
    reason when it is of the class and cannot; None when it is not of the class at all."""
    if node.phase is not NodePhase.READY:
        if want.on_cpu or same_class(node.gpu_class, want.gpu_class):
            return f"{node.name} is {node.phase.value}"
        return None
    if want.on_cpu:
        free = node.memory_bytes - used_ram.get(node.name, 0)
        if free >= want.ram_bytes:
            return 0, ()
        return f"{node.name} has {free / 1e9:.0f} GB of RAM free"
    if not same_class(node.gpu_class, want.gpu_class):
        return None
    free_idx = free_cards(node, used_cards.get(node.name, ()))
    if len(free_idx) < want.gpus:
        return f"{node.name}: {len(free_idx)} free"
    return len(free_idx) - want.gpus, tuple(free_idx[: want.gpus])


@dataclass(frozen=True)
class GangShortfall:
    """Why a gang cannot be placed now: how many nodes it needs, how many could take a
    member, and what each of the others lacks."""

    want: Want
    fitting: tuple[str, ...]
    lacking: tuple[str, ...]

    @property
    def message(self) -> str:
        """One sentence: what is needed, what there is, and what would fit."""
        need = f"{self.want.nodes} READY nodes with {need_text(self.want)} each"
        if not self.fitting and not self.lacking:
            cls = "CPU" if self.want.on_cpu else self.want.gpu_class
            return f"a gang needs {need}, and no node has {cls} cards"
        have = f"{len(self.fitting)} {'has' if len(self.fitting) == 1 else 'have'} room" + (
            f" ({', '.join(self.fitting)})" if self.fitting else ""
        )
        why = f"; {'; '.join(self.lacking)}" if self.lacking else ""
        fits = (
            f"a gang of {len(self.fitting)} nodes would fit now"
            if len(self.fitting) > 1
            else "no gang of two or more nodes fits now"
        )
        return f"a gang needs {need}: {have}{why}; {fits}"


def place_gang(
    want: Want,
    nodes: Iterable[NodeView],
    used_cards: Mapping[str, Iterable[int]],
    used_ram: Mapping[str, int],
) -> tuple[Placement, ...] | GangShortfall:
    """The nodes a replica spanning `want.nodes` nodes goes on, rank 0 (the head) first, or
    why it cannot go anywhere now: all of its members or none.

    Each member takes `want.gpus` free cards (or `want.ram_bytes`) on a node of its own, as
    `place` chooses for one node: not avoided, then the preferred node (it becomes the head),
    then the fewest cards left over (big holes are kept for big replicas), then the name.
    """
    ranked: list[tuple[bool, bool, int, str, tuple[int, ...]]] = []
    lacking: list[str] = []
    for node in sorted(nodes, key=lambda n: n.name):
        fit = _fits(want, node, used_cards, used_ram)
        if fit is None:
            continue
        if isinstance(fit, str):
            lacking.append(fit)
            continue
        left, gpus = fit
        ranked.append((node.name in want.avoid, node.name != want.prefer, left, node.name, gpus))
    ranked.sort()
    if len(ranked) < want.nodes:
        return GangShortfall(want, tuple(r[3] for r in ranked), tuple(lacking))
    return tuple(Placement(node=r[3], gpus=r[4]) for r in ranked[: want.nodes])


def nodes_with_room(
    want: Want,
    nodes: Iterable[NodeView],
    used_cards: Mapping[str, Iterable[int]],
    used_ram: Mapping[str, int],
) -> int:
    """How many READY nodes could take one more member of `want` (one node each)."""
    return sum(1 for n in nodes if isinstance(_fits(want, n, used_cards, used_ram), tuple))
