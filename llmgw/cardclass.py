"""Card classes: how much memory a card named like `H100-80GB` holds. Pure, shared by the
planner (budgets) and the node agent (stand-in cards)."""

from __future__ import annotations

import re

MIB = 1 << 20
GIB = 1 << 30

# What NVML reports as memory.total for these cards, in MiB (nvidia-smi
# --query-gpu=memory.total): the marketing "80GB" is close to GiB, not 10^9 bytes.
KNOWN_CARD_MIB: dict[str, int] = {
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

_GB_IN_NAME = re.compile(r"(\d+(?:\.\d+)?)\s*gi?b\b", re.IGNORECASE)


def class_memory_bytes(gpu_class: str) -> int:
    """Memory of one card of `gpu_class`: a known card's NVML total, else the "NNGB" in the
    name read as GiB; 0 when the name tells neither."""
    key = gpu_class.strip().lower()
    if key in KNOWN_CARD_MIB:
        return KNOWN_CARD_MIB[key] * MIB
    match = _GB_IN_NAME.search(key)
    if match and float(match.group(1)) > 0:
        return int(float(match.group(1)) * GIB)
    return 0
