"""Card classes: how much memory a card named like `H100-80GB` holds, as NVML reports it and as
CUDA reports it to torch. Pure, shared by the planner (budgets) and the node agent (stand-in
cards).

Two totals, because the engines read different ones:

- NVML's `memory.total` (`nvidia-smi --query-gpu=memory.total`): what the node agent and
  SGLang's automatic `--mem-fraction-static` read (SGLang's get_device_memory_capacity asks
  nvidia-smi).
- CUDA's total (`torch.cuda.mem_get_info()[1]`, cudaMemGetInfo): what vLLM multiplies its
  `--gpu-memory-utilization` by (vllm/v1/worker/gpu_worker.py, MemorySnapshot.total_memory)
  and what TensorRT-LLM's free fraction and SGLang's free-memory figures start from. It is the
  NVML total less what the driver keeps for itself, a few hundred MiB.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class CardMemory:
    """One card's totals in MiB, and where the CUDA figure comes from (0: not known)."""

    nvml_mib: int
    cuda_mib: int = 0
    cuda_source: str = ""


# NVML totals are nvidia-smi's memory.total for these cards. CUDA totals, where a printed engine
# log gives them, cite it: vLLM prints the CUDA total as "Free memory on device (F/T GiB)" or
# "total_gpu_memory=T GiB" (two decimals, so a figure is known to ±0.005 GiB = ±5 MiB).
KNOWN_CARDS: dict[str, CardMemory] = {
    "h100-80gb": CardMemory(
        81559,
        81090,
        "79.19 GiB: vLLM 0.10.2 on an H100 80GB, 'Free memory on device (78.66/79.19 GiB)' "
        "(llava-v1.6-mistral-7b log; the same total in several refusals "
        "'Free memory on device cuda:0 (…/79.19 GiB)')",
    ),
    "h100-94gb": CardMemory(95830),
    "h200-141gb": CardMemory(
        143771,
        143165,
        "139.81 GiB: vLLM 0.10.2 on H200s, 'Free memory on device (139.21/139.81 GiB)' "
        "(Qwen3-Next-80B-A3B at tp 2); NVML's 143,771 MiB beside it in nvidia-smi",
    ),
    "a100-80gb": CardMemory(
        81920,
        81152,
        "79.25 GiB: vLLM v0.31.0 on an A100 80GB, 'Free memory on device (78.84/79.25 GiB)', "
        "'Desired GPU memory utilization is (0.92, 72.91 GiB)'",
    ),
    "a100-40gb": CardMemory(40960),
    "l40s-48gb": CardMemory(
        46068,
        45486,
        "44.42 GiB: gt-039 (vLLM V1 on L40S, 'Free memory on device (43.93/44.42 GiB)')",
    ),
    "l4-24gb": CardMemory(
        23034,
        22579,
        "22.05 GiB: vLLM's own CI on L4 agents, 'Free memory on device cuda:0 (1.53/22.05 GiB) "
        "on startup' (vllm-project/vllm issue #33297, PR #33154 naming the L4; the same total "
        "in PR #23513's CI failure '(16.56/22.05 GiB)')",
    ),
    "a10g-24gb": CardMemory(
        23028,
        22589,
        "22.06 GiB: vLLM on a single A10, 'Free memory on device cuda:0 (6.67/22.06 GiB) on "
        "startup' (aeread-org/AERead, integrations/rllm/modal_b1/train_smoke.py, its module "
        "docstring); V0 0.7 "
        "logs on a 24 GB card print 22.06-22.07 GiB",
    ),
    "rtx3090-24gb": CardMemory(
        24576,
        24146,
        "23.58 GiB: gt-023/024 (vLLM V0 on an RTX 3090, 'total_gpu_memory=23.58GiB')",
    ),
    "rtx4090-24gb": CardMemory(24564),
}

KNOWN_CARD_MIB: dict[str, int] = {name: card.nvml_mib for name, card in KNOWN_CARDS.items()}
"""NVML totals by class (what the node agent's stand-in cards report)."""

DRIVER_RESERVE_MIB = 768
"""NVML total − CUDA total on a card whose CUDA total no log gives: the largest of the known
gaps (H100 469 MiB, RTX 3090 430, L40S 582, L4 455, A10G 439, A100-80GB 768), so the derived
CUDA total is at the low end and the budget errs small."""

DRIVER_RESERVE_SPREAD_MIB = 340
"""How far a derived CUDA total may be off: the spread of the known gaps (430 to 768 MiB)."""

UNIFIED_MEMORY = re.compile(r"gb10(?!\d)", re.IGNORECASE)
"""Card classes whose memory is the host's, shared with the CPU: NVML reports no memory total
for them (`nvmlDeviceGetMemoryInfo` raises NVMLError_NotSupported on a GB10, as an analysis of
vLLM's `get_batch_defaults` on a DGX Spark, in a public repository's notes, found), so an engine
that asks NVML gets nothing. "GB10" but not "GB100"."""


def nvml_reports_memory(gpu_class: str) -> bool:
    """Whether NVML reports a memory total for a card of `gpu_class` (not for UNIFIED_MEMORY)."""
    return UNIFIED_MEMORY.search(gpu_class) is None


_GB_IN_NAME = re.compile(r"(\d+(?:\.\d+)?)\s*gi?b\b", re.IGNORECASE)


def class_memory_bytes(gpu_class: str) -> int:
    """NVML's memory of one card of `gpu_class`: a known card's total, else the "NNGB" in the
    name read as GiB; 0 when the name tells neither."""
    key = gpu_class.strip().lower()
    if key in KNOWN_CARDS:
        return KNOWN_CARDS[key].nvml_mib * MIB
    match = _GB_IN_NAME.search(key)
    if match and float(match.group(1)) > 0:
        return int(float(match.group(1)) * GIB)
    return 0


@dataclass(frozen=True)
class CudaTotal:
    """A card's CUDA total, where it comes from and how far it may be off (bytes)."""

    bytes: int
    source: str
    margin_bytes: int = 0


def cuda_total(gpu_class: str, nvml_bytes: int, reported_cuda_bytes: int = 0) -> CudaTotal:
    """The total CUDA reports for a card of `gpu_class` whose NVML total is `nvml_bytes`.

    A figure the node reported wins; then a known card's logged total (when `nvml_bytes` is
    that card's NVML total or not known; a card of another name whose NVML total is exactly a
    known card's is taken as that card); else the NVML total less `DRIVER_RESERVE_MIB`, with
    `DRIVER_RESERVE_SPREAD_MIB` of margin. 0 bytes when nothing is known.
    """
    if reported_cuda_bytes > 0:
        return CudaTotal(reported_cuda_bytes, "reported by the node")
    known = KNOWN_CARDS.get(gpu_class.strip().lower())
    if known is None and nvml_bytes > 0:
        # A card whose NVML total is exactly a known card's is taken as that card.
        known = next((c for c in KNOWN_CARDS.values() if c.nvml_mib * MIB == nvml_bytes), None)
    if known is not None and known.cuda_mib and nvml_bytes in (0, known.nvml_mib * MIB):
        return CudaTotal(known.cuda_mib * MIB, known.cuda_source)
    if nvml_bytes <= 0:
        return CudaTotal(0, "not known")
    return CudaTotal(
        max(nvml_bytes - DRIVER_RESERVE_MIB * MIB, nvml_bytes // 2),
        f"NVML total less {DRIVER_RESERVE_MIB} MiB for the driver (no logged CUDA total)",
        DRIVER_RESERVE_SPREAD_MIB * MIB,
    )
