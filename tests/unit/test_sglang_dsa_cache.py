"""DeepSeek V3.2 (DSA) cache bytes: SGLang's row by cache type and sparse-attention backend,
and DescribeModel's bytes a token with the indexer's keys."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from llmgw.engines.sglang import sglang_cache_shape, sglang_dsa_packed
from llmgw.rpc.common import shape_to_proto
from llmgw.shape import ModelShape
from planner_svc.domain.hf_shape import shape_from_hf_config
from planner_svc.domain.memory import kv_bytes_per_token_per_card, kv_cache_bytes

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
LAYERS = 61
INDEXER = 128 + 4  # fp8 index key of index_head_dim 128 and one float32 scale per 128
PACKED = 512 + 512 // 128 * 4 + 64 * 2  # fp8 latent, its scales, bf16 rope: 656
PLAIN = 512 + 64  # kv_lora_rank + qk_rope_head_dim elements


@cache
def v32() -> ModelShape:
    """DeepSeek-V3.2 from the fixture written from its published config (PROVENANCE.md)."""
    config = json.loads((HF / "deepseek-ai__DeepSeek-V3.2.json").read_text())
    return shape_from_hf_config(config)


def test_describe_model_counts_the_indexer_keys() -> None:
    """DescribeModel's KV bytes a token at the model's dtype: each layer's 576-wide bf16 latent
    and its indexer's fp8 key with its scale (61 x (1152 + 132) = 78,324)."""
    assert shape_to_proto(v32()).kv_bytes_per_token == LAYERS * (PLAIN * 2 + INDEXER)


@pytest.mark.parametrize(
    ("args", "row"),
    [
        ([], PLAIN * 2),
        (["--kv-cache-dtype", "bf16"], PLAIN * 2),
        (["--kv-cache-dtype", "fp8_e4m3"], PACKED),
        (["--kv-cache-dtype", "fp8_e4m3", "--nsa-prefill-backend", "flashmla_sparse"], PACKED),
        (["--kv-cache-dtype", "fp8_e4m3", "--nsa-decode-backend", "trtllm"], PLAIN),
        (["--kv-cache-dtype", "fp8_e4m3", "--nsa-prefill-backend", "trtllm"], PLAIN),
        (["--kv-cache-dtype", "fp8_e4m3", "--dsa-decode-backend=trtllm"], PLAIN),
        (["--kv-cache-dtype", "fp8_e4m3", "--nsa-decode", "trtllm"], PLAIN),
        (["--kv-cache-dtype", "fp8_e5m2"], PLAIN),
    ],
)
def test_sglang_row_by_cache_type_and_backend(args: list[str], row: int) -> None:
    """SGLang packs the latent (656 B) only for float8_e4m3fn outside the trtllm backend;
    else the row is 576 elements at the cache type; the indexer's 132 B stay beside it, on
    every card (MLA is not split by tensor parallel)."""
    for tp in (1, 8):
        assert kv_bytes_per_token_per_card("sglang", v32(), tp, args) == LAYERS * (row + INDEXER)


def test_the_pool_bytes_follow_the_row() -> None:
    """kv_cache_bytes (and so card_need) size the pool with the same row: the trtllm backend's
    fp8 pool is 576/656 of the packed one's latent part."""
    packed = ["--kv-cache-dtype", "fp8_e4m3"]
    plain = [*packed, "--nsa-decode-backend", "trtllm"]
    size = {
        name: kv_cache_bytes("sglang", v32(), tokens=8192, sequences=1, tp=1, args=a)
        for name, a in (("packed", packed), ("plain", plain))
    }
    assert size["packed"] == 8192 * LAYERS * (PACKED + INDEXER)
    assert size["plain"] == 8192 * LAYERS * (PLAIN + INDEXER)


def test_vllm_keeps_its_fp8_ds_mla_row() -> None:
    """vLLM's FlashMLA sparse backend stores an fp8 cache as fp8_ds_mla (656 B) whatever
    SGLang's flags would say."""
    args = ["--kv-cache-dtype", "fp8"]
    assert kv_bytes_per_token_per_card("vllm", v32(), 1, args) == LAYERS * (PACKED + INDEXER)


def test_the_unpacked_shape_is_built_once_and_only_for_packed_layers() -> None:
    """The shape without packed rows is kept in the shape's memo; a shape without them, or
    flags that pack, get the shape itself."""
    shape = v32()
    assert sglang_dsa_packed(["--kv-cache-dtype", "fp8_e4m3"])
    assert not sglang_dsa_packed([])
    first = sglang_cache_shape(shape, [])
    assert first is not shape and first is sglang_cache_shape(shape, [])
    assert all(la.fp8_token_bytes == 0 for la in first.layers)
    assert sglang_cache_shape(shape, ["--kv-cache-dtype", "fp8_e4m3"]) is shape
    assert sglang_cache_shape(first, []) is first
