"""A card: one GPU of a node, as its agent reads it and the fleet places replicas on it.

The node agent finds its cards (fleet_svc/agent/cards.py) and sends them in its Hello and
heartbeats (`llmgw.common.v1.Card` on the wire); the fleet keeps them in its view of the node
(fleet_svc/domain/nodes.py `NodeView.cards`). Both ends hold this one type. What the engines
size against is another thing, a card class's totals (`llmgw.engines.base.CardTotals`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Card:
    """One card of a node: its index on the node, NVML's UUID, its model (the class name,
    e.g. "H100-80GB"), NVML's total and used memory, and CUDA's total."""

    index: int
    uuid: str = ""
    model: str = ""
    memory_total_bytes: int = 0
    memory_used_bytes: int = 0
    cuda_memory_total_bytes: int = 0
    """The total CUDA reports, below NVML's `memory_total_bytes` (0: not read)."""
