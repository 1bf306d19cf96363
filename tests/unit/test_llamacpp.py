"""llama-server's settings and llama.cpp's cache rules (llmgw/engines/llamacpp/), on
real model shapes. The same rules are checked against the real llama.cpp in tests/oracle."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from llmgw.engines.errors import EngineRefuses
from llmgw.engines.llamacpp import (
    LLAMACPP_VERSION,
    FlashAttn,
    LlamaCppSettings,
    llamacpp_cache,
    llamacpp_kv_bytes,
    llamacpp_overhead_bytes,
    settings_from_args,
)
from llmgw.shape import Layer, LayerKind, ModelShape
from tests.oracle.models import geometry, inline_shape
from tests.support.shapes import LLAMA_31_8B


def _alternating(
    arch: str, layers: int, pattern: int, kv: int, head: int, window: int, heads: int
) -> ModelShape:
    """A sliding-window model whose layer il slides when il % pattern < pattern - 1 (llama.cpp's
    set_swa_pattern)."""
    full = Layer(LayerKind.FULL, kv, head, head)
    sliding = Layer(LayerKind.SLIDING, kv, head, head, window)
    return ModelShape(
        architecture=arch,
        layers=tuple(sliding if il % pattern < pattern - 1 else full for il in range(layers)),
        attention_heads=heads,
        kv_heads=kv,
        trained_context=131_072,
    )


# google/gemma-3-27b-it text_config: 62 layers, 32 heads, 16 KV heads of 128, window 1024,
# 5 sliding : 1 global -> 52 sliding, 10 full.
GEMMA3_27B = _alternating("gemma3", 62, 6, 16, 128, 1024, 32)
# openai/gpt-oss-20b: 24 layers, 64 heads, 8 KV heads of 64, window 128, alternating.
GPT_OSS_20B = _alternating("gpt-oss", 24, 2, 8, 64, 128, 64)
# deepseek-ai/DeepSeek-V3: 61 layers, 128 heads, MLA latent kv_lora_rank 512 + rope 64.
DEEPSEEK_V3 = ModelShape(
    architecture="deepseek2",
    layers=(Layer(LayerKind.MLA, 1, 576, 0),) * 61,
    attention_heads=128,
    kv_heads=1,
    trained_context=163_840,
)
# state-spaces/mamba-2.8b-hf: 64 layers, inner 5120, state 16, conv 4: per layer
# ((4 - 1) x 5120 + 16 x 5120) x 4 B of f32 state.
MAMBA_28B_STATE = ((4 - 1) * 5120 + 16 * 5120) * 4
MAMBA_28B = ModelShape(
    architecture="mamba",
    layers=(Layer(LayerKind.RECURRENT, state_bytes=MAMBA_28B_STATE),) * 64,
    attention_heads=0,
    kv_heads=0,
)
# microsoft/phi-2: 32 layers, 32 heads of 80 (2560 / 32), no GQA.
PHI_2 = ModelShape(
    architecture="phi2",
    layers=(Layer(LayerKind.FULL, 32, 80, 80),) * 32,
    attention_heads=32,
    kv_heads=32,
    trained_context=2048,
)
# xai-org/grok-1: 64 layers, 48 heads, 8 KV heads of 128.
GROK_1 = ModelShape(
    architecture="grok",
    layers=(Layer(LayerKind.FULL, 8, 128, 128),) * 64,
    attention_heads=48,
    kv_heads=8,
    trained_context=8192,
)
# The oracle's deci model: KV heads 2, 4, 0, 1 of 64 (tests/oracle/models.py).
DECI = inline_shape(geometry("deci-per-layer-kv"))
NO_TRAINED = ModelShape(
    architecture="llama",
    layers=LLAMA_31_8B.layers,
    attention_heads=32,
    kv_heads=8,
)

# Llama 3.1 8B: 32 layers x 8 KV heads x 128 = 32768 K (and V) elements per cell.
LLAMA_ROW = 32 * 8 * 128


def test_version_names_the_llamacpp_modelled() -> None:
    """The version string names the llama.cpp commit and the package it came in."""
    assert LLAMACPP_VERSION == "llama.cpp 0c1e570 (llama-cpp-python 0.3.36)"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            [],
            LlamaCppSettings(
                ctx_size_tokens=0,
                slots=4,
                kv_unified=True,
                cache_type_k="f16",
                cache_type_v="f16",
                flash_attn=FlashAttn.AUTO,
                ubatch_tokens=512,
                batch_tokens=2048,
                swa_full=False,
                n_gpu_layers=-1,
                split_mode="layer",
                fit=True,
            ),
        ),
        (["-c", "4096", "-np", "2"], {"ctx_size_tokens": 4096, "slots": 2, "kv_unified": False}),
        (["--ctx-size=8192", "--parallel=3", "--kv-unified"], {"slots": 3, "kv_unified": True}),
        (["-np", "3", "-kvu", "--no-kv-unified"], {"kv_unified": False}),
        (["-np", "3", "-no-kvu", "--kv-unified"], {"kv_unified": True}),
        (["--no-kv-unified"], {"slots": 4, "kv_unified": True}),
        (["-np", "-1"], {"slots": 4, "kv_unified": True}),
        (["-ctk", "q8_0", "--cache-type-v=q4_0"], {"cache_type_k": "q8_0", "cache_type_v": "q4_0"}),
        (["-ctk", "iq4_nl", "-ctv", "bf16"], {"cache_type_k": "iq4_nl", "cache_type_v": "bf16"}),
        (["-fa", "on"], {"flash_attn": FlashAttn.ON}),
        (["--flash-attn", "enabled"], {"flash_attn": FlashAttn.ON}),
        (["-fa=1"], {"flash_attn": FlashAttn.ON}),
        (["-fa", "off"], {"flash_attn": FlashAttn.OFF}),
        (["--flash-attn", "false"], {"flash_attn": FlashAttn.OFF}),
        (["-fa", "auto"], {"flash_attn": FlashAttn.AUTO}),
        (["-fa", "-1"], {"flash_attn": FlashAttn.AUTO}),
        (["-ub", "128", "-b", "64"], {"ubatch_tokens": 128, "batch_tokens": 64}),
        (["--ubatch-size=256", "--batch-size=1024"], {"ubatch_tokens": 256, "batch_tokens": 1024}),
        (["--swa-full"], {"swa_full": True}),
        (["-ngl", "all"], {"n_gpu_layers": -2}),
        (["--n-gpu-layers", "auto"], {"n_gpu_layers": -1}),
        (["--gpu-layers", "99"], {"n_gpu_layers": 99}),
        (["--kv-unified-per-slot", "4096", "-np", "2"], {"ctx_size_tokens": 8192}),
        (["--kv-unified-per-slot", "4096", "-c", "1000"], {"ctx_size_tokens": 1000}),
        (["--fit", "off"], {"fit": False}),
        (["-sm", "tensor"], {"split_mode": "tensor"}),
        (["-c", "4096", "-c", "2048"], {"ctx_size_tokens": 2048}),
        (["--ctx_size", "4096", "--cache_type_k", "q8_0"], {"ctx_size_tokens": 4096}),
        (["--cache_type_k=q8_0", "--no_kv_unified", "-np", "2"], {"cache_type_k": "q8_0"}),
    ],
)
def test_settings_from_args(args: list[str], expected: LlamaCppSettings | dict[str, Any]) -> None:
    """llama-server's flags, in any spelling, read as its settings with its defaults."""
    settings = settings_from_args(args)
    if isinstance(expected, LlamaCppSettings):
        assert settings == expected
        return
    for name, value in expected.items():
        assert getattr(settings, name) == value, name


@pytest.mark.parametrize(
    ("args", "mentions"),
    [
        (["-ctk", "q3_k"], "--cache-type-k q3_k"),
        (["--cache-type-v", "fp8"], "--cache-type-v fp8"),
        (["-np", "0"], "--parallel 0"),
        (["-fa"], "--flash-attn needs a value"),
        (["-fa", "-c", "4096"], "--flash-attn needs a value"),
        (["-fa", "maybe"], "'maybe' is not on, off or auto"),
        (["-c", "4k"], "--ctx-size '4k'"),
        (["-c", "-5"], "--ctx-size -5"),
        (["-ub", "0"], "--ubatch-size 0"),
        (["--fit", "auto"], "--fit 'auto'"),
    ],
)
def test_settings_refuse_what_llama_server_rejects(args: list[str], mentions: str) -> None:
    """Values llama-server itself rejects are refused with the flag and what would work."""
    with pytest.raises(EngineRefuses) as refused:
        settings_from_args(args)
    assert mentions in refused.value.message
    assert refused.value.engine == "llamacpp"


@pytest.mark.parametrize(
    ("shape", "args", "expected"),
    [
        # The issue's trial: --ctx-size 3000 --parallel 3 gave 3 x 1024 cells (3000 is padded
        # to 3072, each slot gets 1024).
        (
            LLAMA_31_8B,
            ["-c", "3000", "-np", "3"],
            {"n_ctx_tokens": 3072, "n_ctx_seq_tokens": 1024, "streams": 3, "full_cells": 1024},
        ),
        (
            LLAMA_31_8B,
            ["-c", "3000", "-np", "3", "-kvu"],
            {"n_ctx_tokens": 3072, "n_ctx_seq_tokens": 3072, "streams": 1, "full_cells": 3072},
        ),
        # 4096 / 3 = 1365 per slot, padded to 1536: 4608 cells in all.
        (
            LLAMA_31_8B,
            ["-c", "4096", "-np", "3"],
            {"n_ctx_tokens": 4608, "n_ctx_seq_tokens": 1536, "full_cells": 1536},
        ),
        (LLAMA_31_8B, ["-c", "300"], {"n_ctx_tokens": 512, "full_cells": 512, "streams": 1}),
        (LLAMA_31_8B, ["-c", "300", "-np", "4"], {"n_ctx_tokens": 1024, "full_cells": 256}),
        # No --ctx-size: the trained context for every slot (--fit on), or in all (--fit off).
        (LLAMA_31_8B, ["-np", "2"], {"n_ctx_tokens": 262_144, "full_cells": 131_072}),
        (LLAMA_31_8B, [], {"n_ctx_tokens": 131_072, "full_cells": 131_072, "streams": 1}),
        (LLAMA_31_8B, ["-np", "2", "--fit", "off"], {"full_cells": 65_536, "streams": 2}),
        (LLAMA_31_8B, ["-c", "0", "-np", "1"], {"full_cells": 131_072}),
        # f16: 4096 cells x 32768 elements x 2 B each for K and V.
        (
            LLAMA_31_8B,
            ["-c", "4096", "-np", "1"],
            {"k_bytes": 4096 * LLAMA_ROW * 2, "v_bytes": 4096 * LLAMA_ROW * 2},
        ),
        # Sliding windows: pad256(min(cells, window x sequences sharing a stream + ubatch)).
        (
            GEMMA3_27B,
            ["-c", "32768", "-np", "1"],
            {
                "full_cells": 32768,
                "swa_cells": 1536,
                "k_bytes": 10 * 32768 * 16 * 128 * 2,
                "swa_k_bytes": 52 * 1536 * 16 * 128 * 2,
            },
        ),
        (GEMMA3_27B, ["-c", "32768"], {"swa_cells": 4608, "streams": 1}),
        (
            GEMMA3_27B,
            ["-c", "32768", "-np", "4"],
            {"full_cells": 8192, "swa_cells": 1536, "streams": 4},
        ),
        (GEMMA3_27B, ["-c", "32768", "-np", "1", "--swa-full"], {"swa_cells": 32768}),
        (GEMMA3_27B, ["-c", "32768", "-np", "1", "-ub", "128"], {"swa_cells": 1280}),
        (GEMMA3_27B, ["-c", "32768", "-np", "1", "-b", "100"], {"swa_cells": 1280}),
        (GEMMA3_27B, ["-c", "1000", "-np", "1"], {"full_cells": 1024, "swa_cells": 1024}),
        (GPT_OSS_20B, ["-c", "8192", "-np", "1"], {"swa_cells": 768, "full_cells": 8192}),
        # MLA: one 576-wide K row per layer, no V, with or without flash attention.
        (
            DEEPSEEK_V3,
            ["-c", "4096", "-np", "1"],
            {"k_bytes": 61 * 4096 * 576 * 2, "v_bytes": 0},
        ),
        (DEEPSEEK_V3, ["-c", "4096", "-np", "1", "-fa", "off"], {"v_bytes": 0}),
        # Recurrent: max(1, slots) rows of f32 state, no KV.
        (
            MAMBA_28B,
            ["-c", "4096", "-np", "3"],
            {"recurrent_bytes": 3 * 64 * MAMBA_28B_STATE, "k_bytes": 0, "full_cells": 0},
        ),
        (MAMBA_28B, ["-c", "4096"], {"recurrent_bytes": 4 * 64 * MAMBA_28B_STATE}),
        # Per-layer KV heads: without flash attention every layer's V row is the widest
        # (4 x 64), the attention-free layer's too; with it each layer keeps its own.
        (
            DECI,
            ["-c", "4096", "-np", "1", "-fa", "off"],
            {"k_bytes": 4096 * 7 * 64 * 2, "v_bytes": 4096 * 4 * 256 * 2},
        ),
        (DECI, ["-c", "4096", "-np", "1", "-fa", "on"], {"v_bytes": 4096 * 7 * 64 * 2}),
        # Flash attention: auto is on; a quantized V forces it on; Grok forces it off.
        (LLAMA_31_8B, ["-c", "4096"], {"flash_attn": True}),
        (LLAMA_31_8B, ["-c", "4096", "-fa", "off"], {"flash_attn": False}),
        (LLAMA_31_8B, ["-c", "4096", "-ctv", "q8_0"], {"flash_attn": True}),
        (LLAMA_31_8B, ["-c", "4096", "-sm", "tensor"], {"flash_attn": True}),
        (GROK_1, ["-c", "4096"], {"flash_attn": False}),
        # The ubatch is capped by the batch and the batch by the context as asked.
        (LLAMA_31_8B, ["-c", "300", "-np", "1"], {"ubatch_tokens": 300}),
        (LLAMA_31_8B, ["-c", "4096", "-b", "256"], {"ubatch_tokens": 256}),
    ],
)
def test_cache_rules(shape: ModelShape, args: list[str], expected: dict[str, object]) -> None:
    """llama.cpp's cells, streams, bytes and flash-attention choice for llama-server's flags."""
    cache = llamacpp_cache(shape, settings_from_args(args))
    for name, value in expected.items():
        assert getattr(cache, name) == value, name


@pytest.mark.parametrize(
    ("cache_type", "numerator", "denominator"),
    [
        ("f32", 4, 1),
        ("f16", 2, 1),
        ("bf16", 2, 1),
        ("q8_0", 34, 32),
        ("q4_0", 18, 32),
        ("q4_1", 20, 32),
        ("q5_0", 22, 32),
        ("q5_1", 24, 32),
        ("iq4_nl", 18, 32),
    ],
)
def test_cache_type_bytes(cache_type: str, numerator: int, denominator: int) -> None:
    """Each cache type stores its elements in blocks: q8_0 34 B per 32, q4_0 18 per 32 …"""
    args = ["-c", "4096", "-np", "1", "-ctk", cache_type, "-ctv", cache_type]
    cache = llamacpp_cache(LLAMA_31_8B, settings_from_args(args))
    assert cache.k_bytes == cache.v_bytes == 4096 * LLAMA_ROW * numerator // denominator
    assert cache.total_bytes == 2 * cache.k_bytes


@pytest.mark.parametrize(
    ("shape", "args", "mentions"),
    [
        (PHI_2, ["-c", "2048", "-ctk", "q8_0"], "K head size is 80"),
        (PHI_2, ["-c", "2048", "-ctk", "q4_0", "-fa", "off"], "K head size is 80"),
        (PHI_2, ["-c", "2048", "-ctv", "q4_0", "-fa", "on"], "V head size is 80"),
        (LLAMA_31_8B, ["-c", "4096", "-ctv", "q8_0", "-fa", "off"], "needs flash attention"),
        (GROK_1, ["-c", "4096", "-ctk", "q8_0", "-ctv", "q8_0"], "runs without flash attention"),
        (DEEPSEEK_V3, ["-c", "4096", "-ctk", "q8_0", "-ctv", "f16"], "--cache-type-v q8_0"),
        (LLAMA_31_8B, ["-c", "4096", "-sm", "tensor", "-fa", "off"], "--split-mode tensor"),
        (LLAMA_31_8B, ["-c", "4096", "-np", "300"], "--parallel 300"),
        (NO_TRAINED, ["-np", "1"], "give --ctx-size"),
    ],
)
def test_refusals(shape: ModelShape, args: list[str], mentions: str) -> None:
    """Settings llama.cpp refuses (or cannot run) are refused, saying what would work."""
    with pytest.raises(EngineRefuses) as refused:
        llamacpp_cache(shape, settings_from_args(args))
    assert mentions in refused.value.message
    assert refused.value.metadata()["engine"] == "llamacpp"


@pytest.mark.parametrize(
    ("shape", "args"),
    [
        (LLAMA_31_8B, ["-c", "8192", "-np", "2"]),
        (GEMMA3_27B, ["-c", "32768", "-ctk", "q8_0", "-ctv", "q8_0"]),
        (MAMBA_28B, ["-c", "4096", "-np", "2"]),
    ],
)
def test_kv_bytes_is_the_whole_cache(shape: ModelShape, args: Sequence[str]) -> None:
    """llamacpp_kv_bytes is the full, sliding and recurrent caches together."""
    cache = llamacpp_cache(shape, settings_from_args(args))
    assert llamacpp_kv_bytes(shape, args) == cache.total_bytes > 0
    assert cache.total_bytes == cache.full_bytes + cache.swa_bytes + cache.recurrent_bytes


@pytest.mark.parametrize(
    ("smaller", "larger"),
    [
        (["-c", "8192", "-fa", "on"], ["-c", "8192", "-fa", "off"]),
        (["-c", "8192", "-fa", "off"], ["-c", "65536", "-fa", "off"]),
        (["-c", "8192", "-ub", "128"], ["-c", "8192", "-ub", "512"]),
    ],
)
def test_overhead_grows_with_scores(smaller: list[str], larger: list[str]) -> None:
    """Compute buffers grow without flash attention, with the context and with the ubatch."""
    assert llamacpp_overhead_bytes(LLAMA_31_8B, smaller, 1) < llamacpp_overhead_bytes(
        LLAMA_31_8B, larger, 1
    )


def test_overhead_without_flash_attention_covers_the_scores() -> None:
    """Without flash attention the estimate covers one layer's f32 scores: cells x ubatch x
    heads x 4 B (16 GiB for Llama 3.1 8B at 131072 tokens), the same on every card."""
    args = ["-c", "131072", "-np", "1", "-fa", "off"]
    scores = 131_072 * 512 * 32 * 4
    assert llamacpp_overhead_bytes(LLAMA_31_8B, args, 1) > scores
    assert llamacpp_overhead_bytes(LLAMA_31_8B, args, 4) == llamacpp_overhead_bytes(
        LLAMA_31_8B, args, 1
    )


@pytest.mark.parametrize(("cache_type", "row"), [("f16", 128 * 2), ("q8_0", 128 // 32 * 34)])
def test_deepseek32_indexer_cache_is_one_k_head_a_layer(cache_type: str, row: int) -> None:
    """deepseek32 keeps, beside the latent, an indexer cache of one K head of the indexer width
    per layer at the K type, with the latent's cells (src/llama-kv-cache-dsa.cpp); the oracle
    checks it against the real llama.cpp (deepseek32-dsa)."""
    latent = Layer(LayerKind.MLA, 1, 576, 0, indexer_dim=128)
    shape = ModelShape("deepseek32", (latent,) * 3, 128, 128, trained_context=4096)
    args = ["-c", "1000", "-np", "1", "-ctk", cache_type, "-ctv", cache_type]
    cache = llamacpp_cache(shape, settings_from_args(args))
    assert cache.indexer_k_bytes == 3 * row * 1024
    assert cache.total_bytes == cache.k_bytes + cache.indexer_k_bytes
    assert not cache.notes
