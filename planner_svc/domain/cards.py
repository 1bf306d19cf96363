"""Cards: how much memory a card of a class holds."""

from __future__ import annotations

import re

from planner_svc.domain.model import Inventory

GIB = 1 << 30

# What NVML reports as memory.total for common data-centre cards, in MiB (nvidia-smi
# --query-gpu=memory.total). The marketing "80GB" is close to GiB, not 10^9 bytes.
_KNOWN_MIB: dict[str, int] = {
    "h100-80gb": 81559,
    "h100-94gb": 95830,
    "h200-141gb": 143771,
    "a100-80gb": 81920,
    "a100-40gb": 40960,
    "l40s-48gb": 46068,
    "l4-24gb": 23034,
    "a10g-24gb": 23028,
    "rtx4090-24gb": 24564,
}

_GB_IN_NAME = re.compile(r"(\d+(?:\.\d+)?)\s*g(?:i)?b\b", re.IGNORECASE)


def card_memory_bytes(gpu_class: str, inventory: Inventory) -> int:
    """Memory of one card of `gpu_class`: the smallest the inventory reports for the class,
    else a known card's NVML total, else the "NNGB" in the class name read as GiB; 0 when
    none of these tells.
    """
    reported = [n.gpu_memory_bytes for n in inventory.of_class(gpu_class) if n.gpu_memory_bytes > 0]
    if reported:
        return min(reported)
    key = gpu_class.strip().lower()
    if key in _KNOWN_MIB:
        return _KNOWN_MIB[key] << 20
    match = _GB_IN_NAME.search(key)
    if match:
        return int(float(match.group(1)) * GIB)
    return 0
