"""TensorRT-LLM's per-rank memory at tensor parallel > 1: the all-reduce fusion workspace and
NCCL's buffers, both counted before the KV cache takes its free fraction."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from llmgw.engines.base import CardNeed, CardTotals, SizingRequest
from llmgw.engines.trtllm import (
    ALLREDUCE_WORKSPACE_BYTES_ABOVE_TP2,
    ALLREDUCE_WORKSPACE_BYTES_UP_TO_TP2,
    TRTLLM,
    TRTLLM_FREE_FRACTION,
    allreduce_workspace_bytes,
    trtllm_collective_bytes,
    trtllm_overhead_bytes,
)
from llmgw.engines.vllm_memory import NON_TORCH_NCCL_BYTES
from llmgw.engines.vllm_rules import NVLINK_NON_TORCH_MARGIN_BYTES, NVLINK_NON_TORCH_V1
from llmgw.shape import ModelShape
from planner_svc.domain.hf_shape import shape_from_hf_config

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
MIB = 1 << 20
H100_BYTES = 81559 * MIB
LLAMA_8B_WEIGHTS = 16_060_522_496


@cache
def llama_8b() -> ModelShape:
    """Llama-3.1-8B-Instruct from the HF fixtures, with its safetensors weights."""
    config = json.loads((HF / "meta-llama__Llama-3.1-8B-Instruct.json").read_text())
    return shape_from_hf_config(config, weights_bytes=LLAMA_8B_WEIGHTS)


@pytest.mark.parametrize(
    ("tp", "size"),
    [
        (2, ALLREDUCE_WORKSPACE_BYTES_UP_TO_TP2),
        (4, ALLREDUCE_WORKSPACE_BYTES_ABOVE_TP2),
        (8, ALLREDUCE_WORKSPACE_BYTES_ABOVE_TP2),
    ],
)
def test_allreduce_workspace_is_one_data_and_three_lamport_buffers_of_size_times_tp(
    tp: int, size: int
) -> None:
    """size x tp for the data buffer, 3 x size x tp of Lamport buffers, 256 B a rank of
    barriers: 128,000,512 B at tp 2 (16 MB), 128,001,024 at tp 4 (8 MB)."""
    assert allreduce_workspace_bytes(tp) == 4 * size * tp + 256 * tp
    assert allreduce_workspace_bytes(1) == 0


def test_the_workspace_size_halves_past_tp_2() -> None:
    """16,000,000 bytes up to tp 2, 8,000,000 above (max_workspace_size_auto)."""
    assert allreduce_workspace_bytes(2) == 128_000_512
    assert allreduce_workspace_bytes(4) == 128_001_024
    assert allreduce_workspace_bytes(8) == 256_002_048


@pytest.mark.parametrize(
    ("name", "nccl", "margin"),
    [
        ("H100", NVLINK_NON_TORCH_V1, NVLINK_NON_TORCH_MARGIN_BYTES),
        ("L40S", NON_TORCH_NCCL_BYTES, NON_TORCH_NCCL_BYTES),
        ("H100 PCIe", NON_TORCH_NCCL_BYTES, NON_TORCH_NCCL_BYTES),
    ],
)
def test_nccl_share_follows_the_card(name: str, nccl: int, margin: int) -> None:
    """NVLink-SHARP parts take vLLM's measured NVLink step, others NCCL's PCIe-sized buffers;
    one card adds nothing."""
    card = CardTotals.of(name, H100_BYTES)
    got, got_margin, words = trtllm_collective_bytes(card, 2)
    assert got == allreduce_workspace_bytes(2) + nccl
    assert got_margin == margin
    assert "tp 2" in words
    assert trtllm_collective_bytes(card, 1) == (0, 0, "")


def test_overhead_counts_the_collectives_at_tp_above_1() -> None:
    """The overhead grows by exactly the collective bytes at tp 2; tp 1 is as before."""
    shape, card = llama_8b(), CardTotals.of("H100", H100_BYTES)
    one = trtllm_overhead_bytes(shape, [], pp=1, tp=2)
    assert trtllm_overhead_bytes(shape, [], pp=1, tp=2, card=card) - one == (
        trtllm_collective_bytes(card, 2)[0] - trtllm_collective_bytes(None, 2)[0]
    )
    assert trtllm_overhead_bytes(shape, [], pp=1, tp=1, card=card) == trtllm_overhead_bytes(
        shape, [], pp=1, tp=1
    )


@pytest.mark.parametrize("tp", [2, 4])
def test_the_pool_loses_the_free_fraction_of_the_collectives(tp: int) -> None:
    """pool = f x (total - weights - overhead): on an H100 the pool at tp 2 and 4 is
    f x (NVLink step - PCIe step) below the same card unnamed, the rules say why, and the
    card's non-torch figure carries the collectives."""
    shape = llama_8b()
    args = ["--max_seq_len", "8192"]

    def need(name: str) -> CardNeed:
        card = CardTotals.of(name, H100_BYTES)
        return TRTLLM.card_need(
            shape,
            SizingRequest(
                args=tuple(args),
                tokens=8192,
                slots=1,
                cards=tp,
                card_memory_bytes=H100_BYTES,
                card=card,
            ),
        )

    nvlink, plain = need("H100"), need("")
    gap = TRTLLM_FREE_FRACTION * (NVLINK_NON_TORCH_V1 - NON_TORCH_NCCL_BYTES)
    assert abs((plain.kv_pool_bytes - nvlink.kv_pool_bytes) - gap) <= 2
    assert nvlink.kv_token_capacity < plain.kv_token_capacity
    assert f"tp {tp}: all-reduce workspace" in nvlink.rules
    expected = 256 * MIB + trtllm_collective_bytes(CardTotals.of("H100", H100_BYTES), tp)[0]
    assert nvlink.non_torch_bytes == expected
