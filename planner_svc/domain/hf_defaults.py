"""What a config.json that omits a key means: the default of its architecture's transformers
config class, which is what vLLM and SGLang see (they load configs through those classes).

A hand-kept table, not transformers itself: transformers is not installed here, and as a
runtime dependency of the planner it would bring tokenizers, safetensors, huggingface_hub and
numpy to read a dozen integers, and its defaults move between releases while this table says
which release it restates. Each row restates the defaults of
`transformers/models/<arch>/configuration_<arch>.py` (transformers' main branch as indexed; the
mistral, qwen3, qwen3_moe and nemotron_h rows checked line by line) for the keys that size the
cache or decide tensor parallel; architectures not listed get no defaults (the reader then says
what is missing).
"""

from __future__ import annotations

from collections.abc import Mapping

_LLAMA = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "max_position_embeddings": 2048,
}

DEFAULTS: Mapping[str, Mapping[str, object]] = {
    # LlamaConfig; num_key_value_heads None -> num_attention_heads, head_dim None -> hidden/heads.
    "llama": _LLAMA,
    # MistralConfig: 4096 * 32 positions and a 4096-token window unless the config says null.
    "mistral": {
        **_LLAMA,
        "intermediate_size": 14336,
        "num_key_value_heads": 8,
        "max_position_embeddings": 4096 * 32,
        "sliding_window": 4096,
    },
    # MixtralConfig: no window by default.
    "mixtral": {
        **_LLAMA,
        "intermediate_size": 14336,
        "num_key_value_heads": 8,
        "max_position_embeddings": 4096 * 32,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
    # Qwen2Config: a window that is off unless use_sliding_window is true.
    "qwen2": {
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "max_position_embeddings": 32768,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
    },
    # Qwen3Config: head_dim 128 whatever hidden/heads is.
    "qwen3": {
        "vocab_size": 151936,
        "hidden_size": 4096,
        "intermediate_size": 22016,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "head_dim": 128,
        "max_position_embeddings": 32768,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
    },
    # Qwen3MoeConfig: no head_dim of its own (hidden / heads), no max_window_layers.
    "qwen3_moe": {
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "max_position_embeddings": 32768,
        "use_sliding_window": False,
        "sliding_window": 4096,
    },
    # Qwen3NextConfig: one full-attention layer in four, the rest gated delta nets.
    "qwen3_next": {
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "num_hidden_layers": 48,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "max_position_embeddings": 32768,
        "full_attention_interval": 4,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "num_experts": 512,
        "decoder_sparse_step": 1,
    },
    # Gemma2Config: head_dim 256, every other layer slides over 4096 tokens.
    "gemma2": {
        "vocab_size": 256000,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 8192,
        "sliding_window": 4096,
    },
    # Gemma3TextConfig: five local layers to one global (sliding_window_pattern 6).
    "gemma3_text": {
        "vocab_size": 262208,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
    },
    # Cohere2Config: three local layers to one global.
    "cohere2": {
        "vocab_size": 256000,
        "hidden_size": 8192,
        "intermediate_size": 22528,
        "num_hidden_layers": 40,
        "num_attention_heads": 64,
        "max_position_embeddings": 8192,
        "sliding_window": 4096,
        "sliding_window_pattern": 4,
    },
    # Phi3Config: no window unless given.
    "phi3": {
        "vocab_size": 32064,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "max_position_embeddings": 4096,
    },
    # DeepseekV2Config / DeepseekV3Config: MLA ranks and expert widths.
    "deepseek_v2": {
        "vocab_size": 102400,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "moe_intermediate_size": 1407,
        "num_hidden_layers": 30,
        "num_attention_heads": 32,
        "max_position_embeddings": 2048,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "first_k_dense_replace": 0,
        "moe_layer_freq": 1,
    },
    "deepseek_v3": {
        "vocab_size": 129280,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "n_shared_experts": 1,
        "n_routed_experts": 256,
        "max_position_embeddings": 4096,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "first_k_dense_replace": 3,
        "moe_layer_freq": 1,
    },
    # GptOssConfig: head_dim 64, alternating 128-token windows.
    "gpt_oss": {
        "vocab_size": 201088,
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_hidden_layers": 36,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "num_local_experts": 128,
        "max_position_embeddings": 131072,
        "sliding_window": 128,
    },
    # MambaConfig / FalconMambaConfig: recurrent, no position limit.
    "mamba": {
        "vocab_size": 50280,
        "hidden_size": 768,
        "state_size": 16,
        "num_hidden_layers": 32,
        "expand": 2,
        "conv_kernel": 4,
    },
    "falcon_mamba": {
        "vocab_size": 50280,
        "hidden_size": 768,
        "state_size": 16,
        "num_hidden_layers": 32,
        "expand": 2,
        "conv_kernel": 4,
    },
    # JambaConfig: one attention layer in eight (offset 4), 16 experts every other layer.
    "jamba": {
        "vocab_size": 65536,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 262144,
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "num_experts": 16,
    },
    # NemotronHConfig: the layers come from layers_block_type (or the legacy
    # hybrid_override_pattern), never defaulted here; the SSM state is kept in float32.
    "nemotron_h": {
        "vocab_size": 131072,
        "hidden_size": 4096,
        "intermediate_size": 21504,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 4096,
        "mamba_num_heads": 128,
        "mamba_head_dim": 64,
        "n_groups": 8,
        "ssm_state_size": 128,
        "conv_kernel": 4,
        "expand": 2,
        "mamba_ssm_cache_dtype": "float32",
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "moe_intermediate_size": 7688,
        "moe_shared_expert_intermediate_size": 7688,
    },
}


def defaults_for(model_type: str) -> Mapping[str, object]:
    """The transformers defaults of `model_type`'s config class (empty when not tabled)."""
    return DEFAULTS.get(model_type, {})
