"""Hybrid layer patterns in every encoding, sparse-attention caches, and the transformers
defaults of keys a config omits (planner_svc.domain.hf_layers / hf_defaults / hf_shape)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from llmgw.engines.kvcache import token_bytes_on_card
from llmgw.shape import LayerKind, ModelShape
from planner_svc.domain.errors import InvalidShape
from planner_svc.domain.hf_shape import shape_from_hf_config

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hf"
FULL, SLIDING, MLA, RECURRENT, NONE = (
    LayerKind.FULL,
    LayerKind.SLIDING,
    LayerKind.MLA,
    LayerKind.RECURRENT,
    LayerKind.NO_CACHE,
)


def config(name: str) -> dict[str, object]:
    """A fixture config.json (tests/fixtures/hf/PROVENANCE.md)."""
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    assert isinstance(data, dict)
    return data


def kinds(shape: ModelShape) -> list[LayerKind]:
    return [la.kind for la in shape.layers]


# Mamba-2 keys as Bamba / Granite-4.0-H / Falcon-H1 spell them.
MAMBA2_KEYS = {
    "mamba_n_heads": 64,
    "mamba_d_head": 64,
    "mamba_n_groups": 1,
    "mamba_d_state": 128,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
}
# Conv (4096 + 2 x 1 x 128) x 3 and temporal 64 x 64 x 128, in bf16.
MAMBA2_STATE = ((4096 + 2 * 128) * 3 + 64 * 64 * 128) * 2
SMALL = {
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}


def test_nemotron_h_pattern_keeps_kv_only_in_its_attention_layers() -> None:
    """Nemotron-H-8B's hybrid_override_pattern: 24 Mamba-2 layers, 4 attention layers and 24
    MLP layers; KV per token is the 4 attention layers' (13x less than reading all 52 layers
    as attention), the Mamba layers keep vLLM's mamba2 state (the SSM part in float32, the
    mamba_ssm_cache_dtype NemotronHConfig defaults to and vLLM's NemotronH hook reads)."""
    shape = shape_from_hf_config(config("nvidia__Nemotron-H-8B-Base-8K"))
    assert (kinds(shape).count(RECURRENT), kinds(shape).count(FULL)) == (24, 4)
    assert kinds(shape).count(NONE) == 24
    assert shape.kv_bytes_per_token() == 4 * 8 * (128 + 128) * 2
    conv = (128 * 64 + 2 * 8 * 128) * (4 - 1)
    temporal = 128 * 64 * 128
    assert shape.state_bytes_per_sequence() == 24 * (conv * 2 + temporal * 4)
    assert shape.parallel.ssm_groups == 8


def test_layers_block_type_names_the_layers() -> None:
    """Nemotron-H successors list "mamba", "moe", "attention", "mlp" (NemotronHConfig now
    "linear_attention" for the Mamba-2 layers, and no num_hidden_layers); only attention
    caches, and only a list with "moe" layers builds experts."""
    cfg = {
        **config("nvidia__Nemotron-H-8B-Base-8K"),
        "num_hidden_layers": 5,
        "layers_block_type": ["mamba", "moe", "mamba", "attention", "mlp"],
    }
    del cfg["hybrid_override_pattern"]
    assert kinds(shape_from_hf_config(cfg)) == [RECURRENT, NONE, RECURRENT, FULL, NONE]
    del cfg["num_hidden_layers"]
    cfg["layers_block_type"] = ["linear_attention", "moe", "full_attention", "mlp"]
    cfg["moe_intermediate_size"] = 1856
    shape = shape_from_hf_config(cfg)
    assert kinds(shape) == [RECURRENT, NONE, FULL, NONE]
    assert shape.parallel.expert_intermediate == 1856
    dense = shape_from_hf_config(config("nvidia__Nemotron-H-8B-Base-8K"))
    assert dense.parallel.expert_intermediate == 0  # no "E" layer: no experts


def test_attn_layer_indices_place_attention_among_mamba2_layers() -> None:
    """Bamba: attention at attn_layer_indices, Mamba-2 everywhere else."""
    cfg = {"model_type": "bamba", "num_hidden_layers": 6, "attn_layer_indices": [2, 5]}
    shape = shape_from_hf_config({**cfg, **SMALL, **MAMBA2_KEYS})
    assert kinds(shape) == [RECURRENT, RECURRENT, FULL, RECURRENT, RECURRENT, FULL]
    assert shape.state_bytes_per_sequence() == 4 * MAMBA2_STATE


def test_falcon_h1_layers_have_attention_and_a_mixer() -> None:
    """Falcon-H1 runs attention and Mamba-2 side by side in every layer."""
    cfg = {"model_type": "falcon_h1", "num_hidden_layers": 3, "mamba_d_ssm": 4096}
    shape = shape_from_hf_config({**cfg, **SMALL, **MAMBA2_KEYS})
    assert kinds(shape) == [FULL] * 3
    assert shape.kv_bytes_per_token() == 3 * 4 * 256 * 2
    assert shape.state_bytes_per_sequence() == 3 * MAMBA2_STATE


def test_lfm2_conv_layers_keep_a_short_convolution() -> None:
    """LFM2's layer_types: "conv" layers keep hidden x (conv_L_cache - 1) (vLLM short_conv)."""
    cfg = {
        "model_type": "lfm2",
        "num_hidden_layers": 4,
        "conv_L_cache": 3,
        "layer_types": ["conv", "full_attention", "conv", "full_attention"],
    }
    shape = shape_from_hf_config({**cfg, **SMALL})
    assert kinds(shape) == [RECURRENT, FULL, RECURRENT, FULL]
    assert shape.state_bytes_per_sequence() == 2 * 2048 * 2 * 2


def test_llama4_rope_layers_attend_in_chunks() -> None:
    """Llama 4 Scout: every fourth layer is NoPE and global, the others attend in chunks of
    attention_chunk_size (no_rope_layer_interval 4 by default)."""
    shape = shape_from_hf_config(config("meta-llama__Llama-4-Scout-17B-16E-Instruct"))
    assert kinds(shape) == ([SLIDING] * 3 + [FULL]) * 12
    assert shape.sliding_window == 8192
    assert shape.kv_bytes_per_token() == 12 * 8 * 256 * 2


def test_an_unknown_layer_name_is_refused() -> None:
    cfg = {"model_type": "x", "num_hidden_layers": 2, "layers_block_type": ["mamba", "moon"]}
    with pytest.raises(InvalidShape):
        shape_from_hf_config({**cfg, **SMALL, **MAMBA2_KEYS})


def test_a_short_hybrid_pattern_is_refused() -> None:
    cfg = {**config("nvidia__Nemotron-H-8B-Base-8K"), "hybrid_override_pattern": "M*-"}
    with pytest.raises(InvalidShape):
        shape_from_hf_config(cfg)


DSA = {"index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048}


def test_deepseek_v32_indexer_and_fp8_layout_are_counted() -> None:
    """DeepSeek V3.2 (V3's geometry plus a DSA indexer): each layer caches 132 indexer bytes a
    token beside its latent; an fp8 cache is vLLM's fp8_ds_mla row of 656 bytes."""
    v32 = shape_from_hf_config({**config("deepseek-ai__DeepSeek-V3"), **DSA})
    assert token_bytes_on_card(v32, 8, Fraction(2)) == 61 * (576 * 2 + 132)
    assert token_bytes_on_card(v32, 8, Fraction(1)) == 61 * (656 + 132)
    v3 = shape_from_hf_config(config("deepseek-ai__DeepSeek-V3"))
    assert token_bytes_on_card(v3, 8, Fraction(1)) == 61 * 576  # plain fp8, no indexer


def test_omitted_keys_take_the_config_class_defaults() -> None:
    """Like vLLM, which reads configs through transformers: a Mistral config without
    sliding_window slides over MistralConfig's 4096, a Gemma 3 text config without a pattern
    has five local layers to one global, a Llama config without max_position_embeddings was
    trained for LlamaConfig's 2048."""
    mistral = config("mistralai__Mistral-7B-Instruct-v0.3")
    del mistral["sliding_window"]
    shape = shape_from_hf_config(mistral)
    assert shape.sliding_window == 4096
    assert any("sliding_window" in note for note in shape.notes)

    gemma3 = {
        "model_type": "gemma3_text",
        "num_hidden_layers": 12,
        "max_position_embeddings": 32768,
    }
    assert kinds(shape_from_hf_config(gemma3)) == ([SLIDING] * 5 + [FULL]) * 2

    llama = config("meta-llama__Llama-3.1-8B-Instruct")
    del llama["max_position_embeddings"]
    del llama["rope_scaling"]
    assert shape_from_hf_config(llama).trained_context == 2048
