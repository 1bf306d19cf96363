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
