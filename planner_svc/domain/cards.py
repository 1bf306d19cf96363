"""Cards: how much memory a card of a class holds, as NVML and as CUDA report it."""

from __future__ import annotations

from llmgw.cardclass import GIB, class_memory_bytes
from llmgw.engines.base import CardTotals
from llmgw.model import Inventory

__all__ = ["GIB", "card_memory_bytes", "card_of"]


def card_memory_bytes(gpu_class: str, inventory: Inventory) -> int:
    """NVML's memory of one card of `gpu_class`: the smallest the inventory reports for the
    class, else a known card's NVML total, else the "NNGB" in the class name read as GiB; 0
    when none of these tells.
    """
    reported = [n.gpu_memory_bytes for n in inventory.of_class(gpu_class) if n.gpu_memory_bytes > 0]
    if reported:
        return min(reported)
    return class_memory_bytes(gpu_class)


_last: tuple[str, Inventory, CardTotals] | None = None
"""The card asked last, with its class and inventory (held, so the inventory's identity
cannot be reused; frozen, so it cannot have changed): one sizing asks it for the profile as
it stands and at the new context, and the servicer hands every request with the same
inventory message the same `Inventory` (`planner_svc.rpc.decoded`)."""


def card_of(gpu_class: str, inventory: Inventory) -> CardTotals:
    """One card of `gpu_class` with both totals: NVML's (`card_memory_bytes`) and CUDA's (the
    smallest a node of the class reports, else the card table's logged figure, else derived
    from NVML's; `llmgw.cardclass.cuda_total`)."""
    global _last
    if _last is not None and _last[1] is inventory and _last[0] == gpu_class:
        return _last[2]
    card = _card_of(gpu_class, inventory)
    _last = (gpu_class, inventory, card)
    return card


def _card_of(gpu_class: str, inventory: Inventory) -> CardTotals:
    """`card_of` itself."""
    nvml = card_memory_bytes(gpu_class, inventory)
    cuda = [
        n.gpu_cuda_memory_bytes
        for n in inventory.of_class(gpu_class)
        if n.gpu_cuda_memory_bytes > 0
    ]
    return CardTotals.of(gpu_class, nvml, min(cuda) if cuda else 0)
