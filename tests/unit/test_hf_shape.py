"""Hugging Face config.json -> ModelShape: every fixture config against hand-derived numbers,
the per-layer patterns, rope scaling as vLLM derives the context, and malformed configs."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmgw.shape import LayerKind, ModelShape
from planner_svc.domain.errors import InvalidShape
from planner_svc.domain.hf_shape import shape_from_hf_config

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hf"

FULL, SLIDING, MLA, RECURRENT = (
    LayerKind.FULL,
    LayerKind.SLIDING,
    LayerKind.MLA,
    LayerKind.RECURRENT,
)


def load(name: str) -> dict[str, object]:
    """A fixture config.json (see tests/fixtures/hf/PROVENANCE.md) as parsed JSON."""
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    assert isinstance(data, dict)
    return data


@dataclass(frozen=True)
class Expected:
    """What a config must read as; byte counts are at bf16 (2 bytes) unless said."""

    kinds: Mapping[LayerKind, int]
    heads: int
    kv_heads: int
    head_dim_k: int
    head_dim_v: int
    per_token: int
    fixed: int
    state: int
    trained: int
    window: int = 0
    mla_expanded: tuple[int, int] | None = None


# Each line's comment is the derivation; INDEX.md's "correct" column where it corrects the plain
# layers x kv_heads x head_dim x 2 x 2 reading.
EXPECTED: dict[str, Expected] = {
    # 32 x 8 x (128+128) x 2 = 131,072; llama3 rope does not extend: 131,072 tokens.
    "meta-llama__Llama-3.1-8B-Instruct": Expected(
        {FULL: 32}, 32, 8, 128, 128, 131_072, 0, 0, 131_072
    ),
    # 80 x 8 x 256 x 2 = 327,680.
    "meta-llama__Llama-3.1-70B-Instruct": Expected(
        {FULL: 80}, 64, 8, 128, 128, 327_680, 0, 0, 131_072
    ),
    # head_dim field 64: 16 x 8 x 128 x 2 = 32,768; llama3 factor 32 ignored.
    "meta-llama__Llama-3.2-1B-Instruct": Expected({FULL: 16}, 32, 8, 64, 64, 32_768, 0, 0, 131_072),
    # use_sliding_window false: no window despite sliding_window 131072; 28 x 4 x 256 x 2.
    "Qwen__Qwen2.5-7B-Instruct": Expected({FULL: 28}, 28, 4, 128, 128, 57_344, 0, 0, 32_768),
    # Qwen2-VL's language model is Qwen2.5-7B's widths: 28 x 4 x 256 x 2 = 57,344 (UI-TARS log:
    # 5102 blocks x 16 x 57,344 B = 4.36 GiB as printed).
    "Qwen__Qwen2-VL-7B-Instruct": Expected({FULL: 28}, 28, 4, 128, 128, 57_344, 0, 0, 32_768),
    # 80 x 8 x 256 x 2 = 327,680, same trap as 7B.
    "Qwen__Qwen2.5-72B-Instruct": Expected({FULL: 80}, 64, 8, 128, 128, 327_680, 0, 0, 32_768),
    # head_dim 128 (hidden 4096 / 32 heads agrees): 36 x 8 x 256 x 2 = 147,456.
    "Qwen__Qwen3-8B": Expected({FULL: 36}, 32, 8, 128, 128, 147_456, 0, 0, 40_960),
    # head_dim 128 though hidden/heads = 80: 64 x 8 x 256 x 2 = 262,144.
    "Qwen__Qwen3-32B": Expected({FULL: 64}, 64, 8, 128, 128, 262_144, 0, 0, 40_960),
    # head_dim 128 though hidden/heads = 64: 48 x 4 x 256 x 2 = 98,304.
    "Qwen__Qwen3-30B-A3B": Expected({FULL: 48}, 32, 4, 128, 128, 98_304, 0, 0, 40_960),
    # 94 x 4 x 256 x 2 = 192,512.
    "Qwen__Qwen3-235B-A22B": Expected({FULL: 94}, 64, 4, 128, 128, 192_512, 0, 0, 40_960),
    # full_attention_interval 4: layers 3, 7, ... 47 = 12 full x 2 x 512 x 2 = 24,576 B/tok;
    # 36 Gated DeltaNet layers: conv (2*16*128 + 32*128) x (4-1) = 24,576 + temporal
    # 32 x 128 x 128 = 524,288 -> 548,864 x 2 B = 1,097,728 B; x 36 = 39,518,208 B.
    "Qwen__Qwen3-Next-80B-A3B-Thinking": Expected(
        {FULL: 12, RECURRENT: 36}, 16, 2, 256, 256, 24_576, 0, 39_518_208, 262_144
    ),
    # A to_dict() dump: sliding_window null, 32 x 8 x 256 x 2 = 131,072.
    "mistralai__Mistral-7B-Instruct-v0.3": Expected(
        {FULL: 32}, 32, 8, 128, 128, 131_072, 0, 0, 32_768
    ),
    "mistralai__Mixtral-8x7B-v0.1": Expected({FULL: 32}, 32, 8, 128, 128, 131_072, 0, 0, 32_768),
    # Even layers slide over 4096: 21 global x 8 x 512 x 2 = 172,032 B/tok; 21 local layers
    # capped at 4096 tokens: 21 x 4096 x 8 x 512 x 2 = 704,643,072 B. head_dim 256, not 224.
    "google__gemma-2-9b-it": Expected(
        {FULL: 21, SLIDING: 21}, 16, 8, 256, 256, 172_032, 704_643_072, 0, 8192, window=4096
    ),
    # MLA latent: 61 x (512 + 64) x 2 = 70,272 B/tok (first_k_dense_replace 3 changes the MLP,
    # not the attention); yarn 4096 x 40 = 163,840 tokens; expanded heads (128+64, 128).
    "deepseek-ai__DeepSeek-V3": Expected(
        {MLA: 61}, 128, 128, 576, 0, 70_272, 0, 0, 163_840, mla_expanded=(192, 128)
    ),
    # DSA: V3's latent plus each layer's indexer key, fp8 128 + a 4-byte scale:
    # 61 x (576 x 2 + 132) = 78,324 B/tok (written from the published config, PROVENANCE.md).
    "deepseek-ai__DeepSeek-V3.2": Expected(
        {MLA: 61}, 128, 128, 576, 0, 78_324, 0, 0, 163_840, mla_expanded=(192, 128)
    ),
    # 27 x 576 x 2 = 31,104 B/tok.
    "deepseek-ai__DeepSeek-V2-Lite": Expected(
        {MLA: 27}, 16, 16, 576, 0, 31_104, 0, 0, 163_840, mla_expanded=(192, 128)
    ),
    # layer_types: 12 full x 8 x 128 x 2 = 24,576 B/tok; 12 sliding x 128 x 8 x 128 x 2 =
    # 3,145,728 B; yarn 4096 x 32 = 131,072 tokens.
    "openai__gpt-oss-20b": Expected(
        {FULL: 12, SLIDING: 12}, 64, 8, 64, 64, 24_576, 3_145_728, 0, 131_072, window=128
    ),
    # 18 x 8 x 128 x 2 = 36,864 B/tok; 18 x 128 x 2048 = 4,718,592 B.
    "openai__gpt-oss-120b": Expected(
        {FULL: 18, SLIDING: 18}, 64, 8, 64, 64, 36_864, 4_718_592, 0, 131_072, window=128
    ),
    # vLLM reads sliding_window 2047 for every layer: nothing per token past the window;
    # 32 x 2047 x 32 x (96+96) x 2 = 804,913,152 B (llama.cpp would cache 393,216 B/tok).
    "microsoft__Phi-3-mini-4k-instruct": Expected(
        {SLIDING: 32}, 32, 32, 96, 96, 0, 804_913_152, 0, 4096, window=2047
    ),
    # All recurrent: 64 x ((4-1) x 8192 + 8192 x 16) = 9,961,472 elements x 2 B (vLLM keeps
    # the model dtype) = 19,922,944 B per sequence; no context key: unknown (0).
    "tiiuae__falcon-mamba-7b": Expected({RECURRENT: 64}, 0, 0, 0, 0, 0, 0, 19_922_944, 0),
    # hybrid_override_pattern: 4 attention layers x 8 x 256 x 2 = 16,384 B/tok (the 52 layers
    # read as attention would be 212,992); 24 Mamba-2 layers: conv (128 x 64 + 2 x 8 x 128) x 3
    # = 30,720 x 2 B + temporal 128 x 64 x 128 = 1,048,576 x 4 B (NemotronHConfig's
    # mamba_ssm_cache_dtype default, float32) = 4,255,744 B, x 24; 24 MLP layers.
    "nvidia__Nemotron-H-8B-Base-8K": Expected(
        {RECURRENT: 24, FULL: 4, LayerKind.NO_CACHE: 24},
        32,
        8,
        128,
        128,
        16_384,
        0,
        102_137_856,
        8192,
    ),
    # attention_chunk_size 8192 on the rope layers, every fourth NoPE layer global: 12 x 8 x
    # 256 x 2 = 49,152 B/tok; 36 chunked layers x 8192 x 4096 = 1,207,959,552 B; llama3 rope
    # does not extend the 10,485,760 positions.
    "meta-llama__Llama-4-Scout-17B-16E-Instruct": Expected(
        {SLIDING: 36, FULL: 12}, 40, 8, 128, 128, 49_152, 1_207_959_552, 0, 10_485_760, window=8192
    ),
}


def kinds_of(shape: ModelShape) -> Counter[LayerKind]:
    """How many layers of each kind a shape has."""
    return Counter(layer.kind for layer in shape.layers)


def test_every_fixture_config_has_expected_numbers() -> None:
    """Each config in tests/fixtures/hf is pinned by a row of the table below (none forgotten)."""
    assert {path.stem for path in FIXTURES.glob("*.json")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_config_reads_as_hand_derived_shape(name: str) -> None:
    """Layers, kinds, heads, head dims, per-token, windowed and recurrent bytes and the trained
    context match the hand derivation for each real config."""
    want = EXPECTED[name]
    shape = shape_from_hf_config(load(name))
    assert kinds_of(shape) == Counter(want.kinds)
    assert shape.block_count == sum(want.kinds.values())
    assert (shape.attention_heads, shape.kv_heads) == (want.heads, want.kv_heads)
    assert (shape.head_dim_k, shape.head_dim_v) == (want.head_dim_k, want.head_dim_v)
    assert shape.kv_bytes_per_token() == want.per_token
    assert shape.kv_bytes_fixed() == want.fixed
    assert shape.state_bytes_per_sequence() == want.state
    assert shape.trained_context == want.trained
    assert shape.sliding_window == want.window
    assert shape.mla_expanded == want.mla_expanded
    assert shape.format == "hf"
    assert shape.kv_dtype_bytes == 2


def test_weights_bytes_are_carried_through() -> None:
    """The weights' size given by the caller (INDEX.md's total_size for Llama-3.1-8B) is kept."""
    shape = shape_from_hf_config(
        load("meta-llama__Llama-3.1-8B-Instruct"), weights_bytes=16_060_522_496
    )
    assert shape.weights_bytes == 16_060_522_496
    assert shape.architecture == "llama"


def test_gemma2_slides_on_even_layers() -> None:
    """Gemma 2's local layers are 0, 2, 4 ... (transformers: sliding iff (i + 1) % 2)."""
    shape = shape_from_hf_config(load("google__gemma-2-9b-it"))
    assert [layer.kind for layer in shape.layers[:4]] == [SLIDING, FULL, SLIDING, FULL]
    assert shape.layers[-1].kind is FULL


def test_qwen3_next_full_layers_close_each_group_of_four() -> None:
    """Qwen3-Next's full-attention layers are 3, 7, 11 ... (full_attention_interval 4)."""
    shape = shape_from_hf_config(load("Qwen__Qwen3-Next-80B-A3B-Thinking"))
    full = [i for i, layer in enumerate(shape.layers) if layer.kind is FULL]
    assert full == list(range(3, 48, 4))


def test_phi3_window_is_noted_as_engine_dependent() -> None:
    """Phi-3 mini 4k's config-wide window says engines differ (llama.cpp caches every token)."""
    shape = shape_from_hf_config(load("microsoft__Phi-3-mini-4k-instruct"))
    assert any("llama.cpp" in note for note in shape.notes)


def test_falcon_mamba_notes_unknown_context_and_state_dtype() -> None:
    """A Mamba config with no context key says the context is unknown and how state is sized."""
    notes = " ".join(shape_from_hf_config(load("tiiuae__falcon-mamba-7b")).notes)
    assert "no context length" in notes
    assert "float32" in notes


LLAMA_LIKE: dict[str, object] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}


def with_keys(base: Mapping[str, object], **changes: object) -> dict[str, object]:
    """`base` with keys replaced (a value of ... removes the key)."""
    config = dict(base)
    for key, value in changes.items():
        if value is ...:
            config.pop(key, None)
        else:
            config[key] = value
    return config


# Hand-made configs shaped like their transformers config classes (not copies of any file).
GEMMA3_MULTIMODAL: dict[str, object] = {
    "model_type": "gemma3",
    "architectures": ["Gemma3ForConditionalGeneration"],
    "torch_dtype": "bfloat16",
    "text_config": {
        "model_type": "gemma3_text",
        "num_hidden_layers": 62,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "hidden_size": 5376,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "max_position_embeddings": 131072,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    },
    "vision_config": {"num_hidden_layers": 27, "num_attention_heads": 16, "hidden_size": 1152},
}

JAMBA_LIKE: dict[str, object] = {
    "model_type": "jamba",
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "attn_layer_period": 8,
    "attn_layer_offset": 4,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "max_position_embeddings": 262144,
    "torch_dtype": "bfloat16",
}

MAMBA2_LIKE: dict[str, object] = {
    "model_type": "mamba2",
    "num_hidden_layers": 64,
    "hidden_size": 4096,
    "expand": 2,
    "state_size": 128,
    "n_groups": 8,
    "num_heads": 128,
    "head_dim": 64,
    "conv_kernel": 4,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    ("config", "kinds", "per_token", "fixed", "state", "trained"),
    [
        pytest.param(
            # Layers 5, 11, ... 59 global (10), 52 local over 1024: 10 x 16 x 256 x 2 = 81,920;
            # 52 x 1024 x 16 x 256 x 2 = 436,207,616; Gemma 3's 128K is already scaled.
            GEMMA3_MULTIMODAL,
            {FULL: 10, SLIDING: 52},
            81_920,
            436_207_616,
            0,
            131_072,
            id="gemma3-text-config-5-local-1-global",
        ),
        pytest.param(
            # Mistral v0.1 style: one window for all layers; 32 x 4096 x 8 x 256 x 2.
            with_keys(
                LLAMA_LIKE, model_type="mistral", sliding_window=4096, max_position_embeddings=32768
            ),
            {SLIDING: 32},
            0,
            536_870_912,
            0,
            32_768,
            id="mistral-v0.1-window-on-every-layer",
        ),
        pytest.param(
            # Qwen2 with the window on: layers >= max_window_layers (20) slide: 20 x 4 x 256 x 2
            # = 40,960 B/tok; 8 x 4096 x 4 x 256 x 2 = 67,108,864 B.
            with_keys(
                LLAMA_LIKE,
                model_type="qwen2",
                num_hidden_layers=28,
                num_attention_heads=28,
                num_key_value_heads=4,
                hidden_size=3584,
                max_position_embeddings=32768,
                sliding_window=4096,
                use_sliding_window=True,
                max_window_layers=20,
            ),
            {FULL: 20, SLIDING: 8},
            40_960,
            67_108_864,
            0,
            32_768,
            id="qwen2-use-sliding-window-max-window-layers",
        ),
        pytest.param(
            # A window not shorter than the trained context never caps: sized as full.
            with_keys(LLAMA_LIKE, sliding_window=8192),
            {FULL: 32},
            131_072,
            0,
            0,
            8192,
            id="window-not-shorter-than-context",
        ),
        pytest.param(
            # transformers v5 style layer_types, all full, sliding_window null.
            with_keys(LLAMA_LIKE, layer_types=["full_attention"] * 32, sliding_window=None),
            {FULL: 32},
            131_072,
            0,
            0,
            8192,
            id="explicit-layer-types-all-full",
        ),
        pytest.param(
            # Newer Qwen3-Next configs list layer_types instead of full_attention_interval:
            # the same 12 full layers and 36 linear ones, the same bytes.
            with_keys(
                load("Qwen__Qwen3-Next-80B-A3B-Thinking"),
                full_attention_interval=...,
                layer_types=["linear_attention"] * 3
                + ["full_attention"]
                + (["linear_attention"] * 3 + ["full_attention"]) * 11,
            ),
            {FULL: 12, RECURRENT: 36},
            24_576,
            0,
            39_518_208,
            262_144,
            id="qwen3-next-layer-types",
        ),
        pytest.param(
            # Attention layers i % 8 == 4 (4 of 32): 4 x 8 x 256 x 2 = 16,384 B/tok; 28 Mamba
            # layers of (8192 x 3 + 8192 x 16) x 2 B = 311,296 B: 8,716,288 B.
            JAMBA_LIKE,
            {FULL: 4, RECURRENT: 28},
            16_384,
            0,
            8_716_288,
            262_144,
            id="jamba-attn-layer-period-offset",
        ),
        pytest.param(
            # conv (8192 + 2 x 8 x 128) x 3 = 30,720 + temporal 128 x 64 x 128 = 1,048,576,
            # x 2 B = 2,158,592 per layer, x 64 = 138,149,888 B.
            MAMBA2_LIKE,
            {RECURRENT: 64},
            0,
            0,
            138_149_888,
            0,
            id="mamba2",
        ),
        pytest.param(
            # Falcon's multi_query: one KV head of 4544 / 71 = 64: 32 x 1 x 128 x 2 = 8,192.
            {
                "model_type": "falcon",
                "num_hidden_layers": 32,
                "num_attention_heads": 71,
                "hidden_size": 4544,
                "multi_query": True,
                "max_position_embeddings": 2048,
            },
            {FULL: 32},
            8_192,
            0,
            0,
            2048,
            id="falcon-multi-query",
        ),
    ],
)
def test_layer_patterns(
    config: dict[str, object],
    kinds: dict[LayerKind, int],
    per_token: int,
    fixed: int,
    state: int,
    trained: int,
) -> None:
    """Per-layer patterns (Gemma 3 in a multimodal config, model-wide and Qwen2 windows, Jamba,
    Mamba 2, multi-query) read as vLLM lays them out."""
    shape = shape_from_hf_config(config)
    assert kinds_of(shape) == Counter(kinds)
    assert shape.kv_bytes_per_token() == per_token
    assert shape.kv_bytes_fixed() == fixed
    assert shape.state_bytes_per_sequence() == state
    assert shape.trained_context == trained


def test_text_config_wins_over_top_level_numbers() -> None:
    """A multimodal config's language model numbers come from text_config, not the top level."""
    config = {
        "model_type": "llava",
        "num_attention_heads": 7,
        "text_config": with_keys(LLAMA_LIKE),
        "vision_config": {"num_hidden_layers": 24, "num_attention_heads": 16, "hidden_size": 1024},
    }
    shape = shape_from_hf_config(config)
    assert (shape.block_count, shape.attention_heads, shape.kv_heads) == (32, 32, 8)
    assert shape.architecture == "llava"


def test_nested_gemma3_layers_follow_the_pattern() -> None:
    """Gemma 3's global layers are every sixth, closing each group (5, 11, ...)."""
    shape = shape_from_hf_config(GEMMA3_MULTIMODAL)
    full = [i for i, layer in enumerate(shape.layers) if layer.kind is FULL]
    assert full == list(range(5, 62, 6))
    assert shape.sliding_window == 1024


@pytest.mark.parametrize(
    ("changes", "trained"),
    [
        pytest.param({}, 8192, id="no-rope-scaling"),
        pytest.param({"rope_scaling": None}, 8192, id="rope-scaling-null"),
        pytest.param(
            {"rope_scaling": {"type": "linear", "factor": 4.0}}, 32768, id="linear-legacy-type"
        ),
        pytest.param(
            {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, 16384, id="dynamic"
        ),
        pytest.param(
            # Qwen2.5's documented long-context setting: 32768 x 4.
            {
                "max_position_embeddings": 32768,
                "rope_scaling": {
                    "type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": 32768,
                },
            },
            131072,
            id="yarn-from-original",
        ),
        pytest.param(
            # yarn replaces the derived length by the original, then scales it: 4096 x 40.
            {
                "max_position_embeddings": 163840,
                "rope_scaling": {
                    "type": "yarn",
                    "factor": 40,
                    "original_max_position_embeddings": 4096,
                },
            },
            163840,
            id="yarn-deepseek",
        ),
        pytest.param(
            {
                "rope_scaling": {
                    "type": "yarn",
                    "factor": 1.5,
                    "original_max_position_embeddings": 4096,
                }
            },
            6144,
            id="yarn-fractional",
        ),
        pytest.param(
            {"rope_scaling": {"rope_type": "yarn", "factor": 2.0}},
            16384,
            id="yarn-without-original",
        ),
        pytest.param(
            {
                "max_position_embeddings": 131072,
                "rope_scaling": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "original_max_position_embeddings": 8192,
                },
            },
            131072,
            id="llama3-does-not-extend",
        ),
        pytest.param(
            # Phi-3 128k style: longrope (legacy "su") keeps max_position_embeddings.
            {
                "max_position_embeddings": 131072,
                "original_max_position_embeddings": 4096,
                "rope_scaling": {"type": "su", "long_factor": [1.0], "short_factor": [1.0]},
            },
            131072,
            id="su-is-longrope",
        ),
        pytest.param(
            {"rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}},
            8192,
            id="mrope-is-default",
        ),
        pytest.param(
            # transformers v5 rope_parameters, flat.
            {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}},
            16384,
            id="rope-parameters-flat",
        ),
        pytest.param(
            # transformers v5 rope_parameters per layer type.
            {
                "rope_parameters": {
                    "full_attention": {
                        "rope_type": "yarn",
                        "factor": 4.0,
                        "original_max_position_embeddings": 8192,
                    },
                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                }
            },
            32768,
            id="rope-parameters-per-layer-type",
        ),
        pytest.param({"seq_length": 4096}, 4096, id="smallest-context-key-wins"),
        pytest.param({"max_position_embeddings": ..., "n_positions": 1024}, 1024, id="n-positions"),
        pytest.param({"model_max_length": 131072}, 131072, id="model-max-length-overrides"),
        pytest.param({"max_position_embeddings": 8192.0}, 8192, id="integral-float"),
        pytest.param(
            {"max_position_embeddings": ..., "model_type": "untabled"},
            0,
            id="no-context-key-is-unknown",
        ),
        pytest.param({"max_position_embeddings": ...}, 2048, id="absent-context-is-llama-default"),
    ],
)
def test_trained_context_as_vllm_derives_it(changes: dict[str, object], trained: int) -> None:
    """The trained context is the smallest length key, times the rope factor for the scaling
    types vLLM lets extend it (not su/longrope/llama3; yarn from its original length)."""
    assert shape_from_hf_config(with_keys(LLAMA_LIKE, **changes)).trained_context == trained


def test_longrope_notes_the_default_vllm_serves() -> None:
    """A longrope config says vLLM serves the original length unless asked for more."""
    config = with_keys(
        LLAMA_LIKE,
        max_position_embeddings=131072,
        original_max_position_embeddings=4096,
        rope_scaling={"type": "longrope", "long_factor": [1.0], "short_factor": [1.0]},
    )
    assert any("4096" in note and "131072" in note for note in shape_from_hf_config(config).notes)


@pytest.mark.parametrize(
    ("changes", "dtype_bytes"),
    [
        pytest.param({}, 2, id="bfloat16"),
        pytest.param({"torch_dtype": "float16"}, 2, id="float16"),
        pytest.param({"torch_dtype": "float32"}, 4, id="float32"),
        pytest.param({"torch_dtype": ..., "dtype": "float32"}, 4, id="transformers-v5-dtype"),
        pytest.param({"torch_dtype": ...}, 2, id="absent-is-16-bit"),
    ],
)
def test_cache_dtype_follows_the_config(changes: dict[str, object], dtype_bytes: int) -> None:
    """The cache element size is the config's dtype: 2 bytes for bf16/f16 (and absent), 4 for
    float32."""
    shape = shape_from_hf_config(with_keys(LLAMA_LIKE, **changes))
    assert shape.kv_dtype_bytes == dtype_bytes
    assert shape.kv_bytes_per_token() == 32 * 8 * 256 * dtype_bytes


MLA_LIKE = load("deepseek-ai__DeepSeek-V2-Lite")
NEXT_LIKE = load("Qwen__Qwen3-Next-80B-A3B-Thinking")
MAMBA_LIKE = load("tiiuae__falcon-mamba-7b")
# An architecture hf_defaults has no row for: what it omits stays missing.
UNTABLED = with_keys(LLAMA_LIKE, model_type="untabled", architectures=["UntabledForCausalLM"])


@pytest.mark.parametrize(
    "config",
    [
        pytest.param([], id="not-an-object"),
        pytest.param("llama", id="a-string"),
        pytest.param(with_keys(UNTABLED, num_hidden_layers=...), id="no-layers"),
        pytest.param(with_keys(UNTABLED, num_attention_heads=...), id="no-heads"),
        pytest.param(with_keys(LLAMA_LIKE, num_hidden_layers=0), id="zero-layers"),
        pytest.param(with_keys(LLAMA_LIKE, num_hidden_layers=-32), id="negative-layers"),
        pytest.param(with_keys(LLAMA_LIKE, num_hidden_layers="32"), id="layers-as-text"),
        pytest.param(with_keys(LLAMA_LIKE, num_hidden_layers=32.5), id="fractional-layers"),
        pytest.param(with_keys(LLAMA_LIKE, num_hidden_layers=True), id="layers-as-bool"),
        pytest.param(with_keys(LLAMA_LIKE, num_hidden_layers=10**9), id="absurd-layers"),
        pytest.param(with_keys(LLAMA_LIKE, num_attention_heads=0), id="zero-heads"),
        pytest.param(with_keys(LLAMA_LIKE, num_key_value_heads=0), id="zero-kv-heads"),
        pytest.param(with_keys(LLAMA_LIKE, num_key_value_heads=64), id="more-kv-than-heads"),
        pytest.param(with_keys(LLAMA_LIKE, num_key_value_heads=5), id="kv-heads-do-not-divide"),
        pytest.param(with_keys(LLAMA_LIKE, head_dim=-128), id="negative-head-dim"),
        pytest.param(with_keys(LLAMA_LIKE, head_dim="128"), id="head-dim-as-text"),
        pytest.param(with_keys(LLAMA_LIKE, hidden_size=4097), id="hidden-not-divisible"),
        pytest.param(with_keys(UNTABLED, hidden_size=...), id="no-hidden-no-head-dim"),
        pytest.param(with_keys(LLAMA_LIKE, max_position_embeddings=-4096), id="negative-context"),
        pytest.param(with_keys(LLAMA_LIKE, max_position_embeddings="4k"), id="context-as-text"),
        pytest.param(with_keys(LLAMA_LIKE, max_position_embeddings=10**12), id="absurd-context"),
        pytest.param(with_keys(LLAMA_LIKE, max_position_embeddings=float("nan")), id="nan-context"),
        pytest.param(with_keys(LLAMA_LIKE, rope_scaling="yarn"), id="rope-scaling-as-text"),
        pytest.param(
            with_keys(LLAMA_LIKE, rope_scaling={"type": "linear", "factor": "8"}),
            id="factor-as-text",
        ),
        pytest.param(
            with_keys(LLAMA_LIKE, rope_scaling={"type": "linear", "factor": 0}), id="zero-factor"
        ),
        pytest.param(
            with_keys(LLAMA_LIKE, rope_scaling={"type": "linear", "factor": 1e9}),
            id="absurd-factor",
        ),
        pytest.param(with_keys(LLAMA_LIKE, rope_scaling={"type": 3}), id="rope-type-as-number"),
        pytest.param(with_keys(LLAMA_LIKE, sliding_window=-1), id="negative-window"),
        pytest.param(with_keys(LLAMA_LIKE, sliding_window="4096"), id="window-as-text"),
        pytest.param(
            with_keys(LLAMA_LIKE, sliding_window=4096, use_sliding_window="yes"),
            id="use-window-as-text",
        ),
        pytest.param(
            with_keys(LLAMA_LIKE, layer_types=["full_attention"] * 31), id="layer-types-too-short"
        ),
        pytest.param(
            with_keys(LLAMA_LIKE, layer_types="full_attention"), id="layer-types-not-a-list"
        ),
        pytest.param(
            with_keys(LLAMA_LIKE, layer_types=["moe_attention"] * 32), id="unknown-layer-type"
        ),
        pytest.param(
            with_keys(LLAMA_LIKE, layer_types=["sliding_attention"] * 32),
            id="sliding-without-window",
        ),
        pytest.param(
            {"model_type": "llava", "text_config": "llama"}, id="text-config-not-an-object"
        ),
        pytest.param(with_keys(LLAMA_LIKE, torch_dtype=16), id="dtype-as-number"),
        pytest.param(with_keys(LLAMA_LIKE, model_type=5), id="model-type-as-number"),
        pytest.param(with_keys(LLAMA_LIKE, model_type=..., architectures=...), id="no-model-type"),
        pytest.param(with_keys(MLA_LIKE, kv_lora_rank="512"), id="mla-rank-as-text"),
        pytest.param(
            with_keys(MLA_LIKE, qk_rope_head_dim=..., model_type="untabled"),
            id="mla-without-rope-dims",
        ),
        pytest.param(
            with_keys(NEXT_LIKE, linear_num_value_heads=..., model_type="untabled"),
            id="linear-without-keys",
        ),
        pytest.param(
            # mamba2 has no row in hf_defaults (falcon_mamba's state_size defaults to 16).
            with_keys(MAMBA_LIKE, state_size=..., model_type="mamba2"),
            id="mamba-without-state-size",
        ),
        pytest.param(with_keys(MAMBA_LIKE, conv_kernel=0), id="mamba-zero-kernel"),
        pytest.param(with_keys(MAMBA_LIKE, mamba_ssm_cache_dtype="int3"), id="bad-ssm-dtype"),
    ],
)
def test_malformed_configs_are_refused_with_one_sentence(config: object) -> None:
    """Missing, zero, negative, non-numeric, absurd or mistyped values raise InvalidShape with
    a one-sentence message, never another exception."""
    with pytest.raises(InvalidShape) as caught:
        shape_from_hf_config(config)  # type: ignore[arg-type]
    message = caught.value.message
    assert message.endswith(".")
    assert "\n" not in message
    assert len(message) < 200


@pytest.mark.parametrize("weights_bytes", [-1, 1 << 60, "16GB", True])
def test_bad_weights_bytes_are_refused(weights_bytes: object) -> None:
    """A negative, absurd or non-integer weights size raises InvalidShape."""
    with pytest.raises(InvalidShape):
        shape_from_hf_config(LLAMA_LIKE, weights_bytes=weights_bytes)  # type: ignore[arg-type]
