"""The widths tensor parallel splits, read from a Hugging Face config.json (`ParallelDims`):
which MLPs a model builds, its experts, its vision encoder, its recurrent mixers and how its
weights are quantized. `engines.heads` holds the checks and their sources.

Which MLPs exist follows the vLLM model files: a model without experts has a dense MLP of
`intermediate_size`; DeepSeek V2/V3 (deepseek_v2.py) dense layers before
`first_k_dense_replace` (or off `moe_layer_freq`) and shared experts of n_shared_experts x
moe_intermediate_size; Qwen2/3-MoE (qwen3_moe.py) dense layers only in `mlp_only_layers` or off
`decoder_sparse_step`, and Qwen2-MoE / Qwen3-Next a shared expert of
`shared_expert_intermediate_size`; Llama 4 dense layers of `intermediate_size_mlp` between MoE
layers (`interleave_moe_layer_step` > 1) and a shared expert of `intermediate_size`; Mixtral,
gpt-oss and others whose experts have no `moe_intermediate_size` use `intermediate_size` for an
expert.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmgw.shape import Layer, LayerKind, ParallelDims, WeightQuant
from planner_svc.domain.hf_layers import ConfigView

_MAX = 1 << 24
_EXPERT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts")
_VISION_KEYS = ("vision_config", "vision_tower_config")
# InternViT's heads need not divide by the tp size: vLLM replicates its attention on every rank
# when they do not (models/intern_vit.py, vllm-project/vllm#8061) or pads them (NVLM-D).
_PADDED_VISION = frozenset({"internvl_chat", "internvl", "nemotron_vl"})


def parallel_dims(
    config: ConfigView, top: Mapping[str, object], layers: Sequence[Layer], heads: int
) -> ParallelDims:
    """What tensor parallel splits besides the attention heads (0 where absent or unreadable)."""
    experts = _first_int(config, _EXPERT_KEYS) if _may_have_experts(config) else 0
    intermediate = _first_int(
        config, ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size")
    )
    dense = expert = shared = 0
    if experts <= 0:
        dense = intermediate
    else:
        moe_width = _first_int(config, ("moe_intermediate_size", "expert_intermediate_size"))
        expert = moe_width or intermediate
        dense = intermediate if _has_dense_layers(config) else 0
        if config.model_type.startswith("llama4"):
            dense = _first_int(config, ("intermediate_size_mlp",)) if dense else 0
            shared = intermediate
        # A shared expert's own width when the config gives one (Qwen2-MoE, Qwen3-Next,
        # Nemotron-H), else DeepSeek's n_shared_experts merged experts.
        shared = shared or _first_int(
            config, ("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size")
        )
        n_shared = _first_int(config, ("n_shared_experts", "num_shared_experts"))
        shared = shared or n_shared * moe_width
    q_dim, o_dim = _head_dims(config, heads)
    vision = _vision(top)
    recurrent = [la for la in layers if la.kind is LayerKind.RECURRENT or la.state_bytes]
    linear = (
        any(la.kind is LayerKind.RECURRENT for la in layers)
        and config.get("linear_num_value_heads") is not None
    )
    ssm_heads = ssm_groups = ssm_inner = 0
    if recurrent and not linear:
        ssm_heads = _first_int(config, ("mamba_num_heads", "mamba_n_heads", "n_mamba_heads"))
        ssm_groups = _first_int(config, ("mamba_n_groups", "n_groups", "mamba_ngroups"))
        if config.model_type in ("mamba", "falcon_mamba", "jamba"):
            hidden = _first_int(config, ("hidden_size", "d_model"))
            expand = _first_int(config, ("mamba_expand", "expand")) or 2
            ssm_inner = (
                _first_int(config, ("intermediate_size",)) if config.model_type != "jamba" else 0
            ) or expand * hidden
            if config.model_type != "jamba":
                dense = 0  # a Mamba-1 model's intermediate_size is its mixer's width
        elif config.model_type == "mamba2":
            ssm_heads = _first_int(config, ("num_heads",))
            ssm_groups = _first_int(config, ("n_groups",))
            dense = 0
    return ParallelDims(
        vocab=_first_int(config, ("vocab_size", "padded_vocab_size")),
        dense_intermediate=dense,
        expert_intermediate=expert,
        shared_intermediate=shared,
        vision_heads=vision[0],
        vision_intermediate=vision[1],
        vision_pads_heads=str(top.get("model_type", "")) in _PADDED_VISION,
        linear_k_heads=_first_int(config, ("linear_num_key_heads",)) if linear else 0,
        linear_v_heads=_first_int(config, ("linear_num_value_heads",)) if linear else 0,
        ssm_heads=ssm_heads,
        ssm_groups=ssm_groups,
        ssm_inner=ssm_inner,
        q_head_dim=q_dim,
        o_head_dim=o_dim,
        quant=_quant(top),
    )


def _may_have_experts(config: ConfigView) -> bool:
    """False for a Nemotron-H whose layer list has no "E"/"moe" layer: NemotronHConfig's
    n_routed_experts default then builds no experts."""
    if not config.model_type.startswith("nemotron_h"):
        return True
    pattern = config.get("hybrid_override_pattern")
    blocks = config.get("layers_block_type")
    if isinstance(blocks, list):
        return "moe" in blocks
    return not isinstance(pattern, str) or "E" in pattern


def _has_dense_layers(config: ConfigView) -> bool:
    """Whether a mixture-of-experts model also has dense-MLP layers."""
    if _first_int(config, ("first_k_dense_replace",)) > 0:
        return True
    if _first_int(config, ("moe_layer_freq", "decoder_sparse_step", "expert_layer_period")) > 1:
        return True
    if _first_int(config, ("interleave_moe_layer_step",)) > 1:
        return True
    only = config.get("mlp_only_layers")
    if isinstance(only, list) and only:
        return True
    # Nemotron-H: "-" / "mlp" layers are dense MLPs beside the "E" / "moe" ones.
    pattern = config.get("hybrid_override_pattern")
    blocks = config.get("layers_block_type")
    return (isinstance(pattern, str) and "-" in pattern) or (
        isinstance(blocks, list) and "mlp" in blocks
    )


def _head_dims(config: ConfigView, heads: int) -> tuple[int, int]:
    """The query and output head sizes of the attention projections (0 when unknown)."""
    if heads <= 0:
        return 0, 0
    if config.get("kv_lora_rank") is not None:
        nope = _first_int(config, ("qk_nope_head_dim",))
        rope = _first_int(config, ("qk_rope_head_dim",))
        return nope + rope, _first_int(config, ("v_head_dim",))
    explicit = _first_int(config, ("head_dim", "attention_head_dim"))
    if explicit:
        return explicit, explicit
    hidden = _first_int(config, ("hidden_size", "n_embd", "d_model"))
    return (hidden // heads, hidden // heads) if hidden and hidden % heads == 0 else (0, 0)


def _vision(top: Mapping[str, object]) -> tuple[int, int]:
    """A multimodal config's vision encoder (heads, MLP width); (0, 0) without one."""
    for key in _VISION_KEYS:
        sub = top.get(key)
        if not isinstance(sub, Mapping):
            continue
        heads = _int(sub, ("num_attention_heads", "num_heads", "n_heads", "attention_heads"))
        width = _int(sub, ("intermediate_size", "mlp_dim", "ffn_dim"))
        if not width:
            embed = _int(sub, ("embed_dim", "hidden_size"))
            ratio = sub.get("mlp_ratio")
            if embed and isinstance(ratio, int | float) and not isinstance(ratio, bool):
                width = int(embed * ratio)
        return heads, width
    return 0, 0


def _quant(top: Mapping[str, object]) -> WeightQuant:
    """The checkpoint's quantization as tensor parallel cares (fp8 blocks, GPTQ/AWQ groups)."""
    config = top.get("quantization_config")
    if not isinstance(config, Mapping):
        return WeightQuant()
    method = str(config.get("quant_method", "")).lower()
    block = config.get("weight_block_size")
    if (
        isinstance(block, list)
        and len(block) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) and 0 < n <= _MAX for n in block)
    ):
        return WeightQuant(method=method, block=(block[0], block[1]))
    if method in ("gptq", "awq"):
        group = config.get("group_size", config.get("q_group_size"))
        size = group if isinstance(group, int) and not isinstance(group, bool) else 0
        return WeightQuant(method=method, group=size if 0 < size <= _MAX else 0)
    return WeightQuant(method=method)


def _first_int(config: ConfigView, keys: Sequence[str]) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= _MAX:
            return value
    return 0


def _int(mapping: Mapping[str, object], keys: Sequence[str]) -> int:
    for key in keys:
        value = mapping.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= _MAX:
            return value
    return 0
