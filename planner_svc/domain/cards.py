"""Cards: how much memory a card of a class holds."""

from __future__ import annotations

from llmgw.cardclass import GIB, class_memory_bytes
from llmgw.model import Inventory

__all__ = ["GIB", "card_memory_bytes"]


def card_memory_bytes(gpu_class: str, inventory: Inventory) -> int:
    """Memory of one card of `gpu_class`: the smallest the inventory reports for the class,
    else a known card's NVML total, else the "NNGB" in the class name read as GiB; 0 when
    none of these tells.
    """
    reported = [n.gpu_memory_bytes for n in inventory.of_class(gpu_class) if n.gpu_memory_bytes > 0]
    if reported:
        return min(reported)
    return class_memory_bytes(gpu_class)
