"""vLLM's `--cpu-offload-gb`: the weights it keeps in host memory leave the card, and under V0
the profile run holds one offloaded layer's copy at its peak (llmgw.engines.vllm_offload)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from llmgw.engines.base import CardNeed, CardTotals, SizingRequest
from llmgw.engines.errors import EngineRefuses
from llmgw.engines.vllm_offload import EMBEDDING_COPIES, EMBEDDING_ELEMENT_BYTES
from llmgw.shape import ModelShape
from planner_svc.domain.hf_shape import shape_from_hf_config
from planner_svc.domain.memory import card_need

GIB = 1 << 30
H100 = CardTotals("H100-80GB", 81559 << 20, 85029027840, "printed")
CONFIG = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
LLAMA = replace(
    shape_from_hf_config(
        json.loads((CONFIG / "meta-llama__Llama-3.1-8B-Instruct.json").read_text())
    ),
    weights_bytes=16_060_522_496,
)
"""Llama-3.1-8B-Instruct with its checkpoint's bf16 bytes (32 layers, 128256 × 4096 embeddings
and head)."""


def need(shape: ModelShape, offload: str | None, *, version: str, tp: int = 1) -> CardNeed:
    """The need on each H100 at 8k tokens with `--cpu-offload-gb offload` (None: not given)."""
    args = ["--max-model-len", "8192", "--tensor-parallel-size", str(tp)]
    if offload is not None:
        args += ["--cpu-offload-gb", offload]
    return card_need(
        "vllm",
        shape,
        SizingRequest(
            args=tuple(args),
            tokens=8192,
            slots=1,
            cards=tp,
            card_memory_bytes=H100.cuda_bytes,
            card=H100,
            engine_version=version,
        ),
    )


def embeddings_per_card(shape: ModelShape, tp: int) -> int:
    """The card's share of the embeddings and head, which vLLM does not offload."""
    assert shape.compute is not None
    full = EMBEDDING_COPIES * shape.compute.vocab_size * shape.compute.hidden_size
    return -(-full * EMBEDDING_ELEMENT_BYTES // tp)


@pytest.mark.parametrize("tp", [1, 2])
def test_v1_takes_the_offload_per_card_off_the_weights_and_adds_it_to_the_pool(tp: int) -> None:
    """Under V1 the offloaded parameters are read in place (UVA): each card's weights fall by
    the budget, its pool grows by as much, and the peak does not move."""
    plain = need(LLAMA, None, version="0.10.2", tp=tp)
    offloaded = need(LLAMA, "4", version="0.10.2", tp=tp)
    assert plain.weights_per_card_bytes - offloaded.weights_per_card_bytes == 4 * GIB
    assert offloaded.kv_pool_bytes - plain.kv_pool_bytes == 4 * GIB
    assert offloaded.activation_bytes == plain.activation_bytes
    assert offloaded.weights_bytes == plain.weights_bytes  # the checkpoint itself is unchanged


def test_v0_holds_one_offloaded_layer_at_its_peak() -> None:
    """Under V0 an offloaded layer's forward runs on a copy of its parameters made on the card:
    the peak grows by one of its 32 layers' share, the pool by the offload less that."""
    plain = need(LLAMA, None, version="0.6.6")
    offloaded = need(LLAMA, "4", version="0.6.6")
    layer = -(-(plain.weights_per_card_bytes - embeddings_per_card(LLAMA, 1)) // 32)
    assert offloaded.activation_bytes - plain.activation_bytes == layer
    assert offloaded.kv_pool_bytes - plain.kv_pool_bytes == 4 * GIB - layer
    assert "V0 copies an offloaded layer back" in offloaded.rules


def test_an_offload_past_the_decoder_layers_leaves_the_embeddings_on_the_card() -> None:
    """vLLM offloads decoder layers only (make_layers): a budget past them leaves the
    embeddings and head, whatever it says."""
    offloaded = need(LLAMA, "100", version="0.10.2")
    assert offloaded.weights_per_card_bytes == embeddings_per_card(LLAMA, 1)


def test_no_offload_and_an_offload_of_zero_size_the_same() -> None:
    """`--cpu-offload-gb 0` is vLLM's default."""
    assert need(LLAMA, "0", version="0.10.2") == need(LLAMA, None, version="0.10.2")


@pytest.mark.parametrize("value", ["-1", "abc", "nan", "inf", ""])
def test_an_offload_that_is_not_a_size_is_refused(value: str) -> None:
    """A value vLLM could not take as GiB is refused with the flag named, not sized."""
    with pytest.raises(EngineRefuses, match="--cpu-offload-gb"):
        need(LLAMA, value, version="0.10.2")
