"""Which cards are joined to their peers by NVLink, and which of those do NVLink SHARP: facts of
the card, not of an engine, read by each engine's collective buffers (vllm_memory, sglang,
trtllm)."""

from __future__ import annotations

from llmgw.engines.base import CardTotals

NVLINK_CARDS = ("h100", "h200", "h800", "h20", "a100", "a800", "b200", "b100", "gb200", "gh200")
"""Card classes sold as SXM/NVLink parts (a name with "pcie" in it is not taken as one)."""


NVLS_CARDS = ("h100", "h200", "h800", "h20", "b200", "b100", "gb200", "gh200")
"""The NVLink classes whose NVSwitch does NVLink SHARP (Hopper and later): NCCL's NVLS
algorithm maps its multicast buffers there when the first large all-reduce runs. Ampere
NVLink parts (A100, A800) have no NVLS (what that means for vLLM's figures:
vllm_memory.collective_step)."""


def nvlink_card(card: CardTotals) -> bool:
    """Whether `card` is taken to be joined to its peers by NVLink (NVLINK_CARDS)."""
    name = card.name.strip().lower()
    return "pcie" not in name and name.startswith(NVLINK_CARDS)


def nvls_card(card: CardTotals) -> bool:
    """Whether `card` is an NVLink part whose NVSwitch does NVLink SHARP (NVLS_CARDS)."""
    return nvlink_card(card) and card.name.strip().lower().startswith(NVLS_CARDS)
