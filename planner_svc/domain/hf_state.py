"""Recurrent state per sequence of a Hugging Face config's non-attention layers, as vLLM keeps
it (vllm/model_executor/layers/mamba/mamba_utils.py `MambaStateShapeCalculator` for the shapes,
`MambaStateDtypeCalculator` for the dtypes): gated delta nets, Mamba-1 mixers (Jamba, Mamba,
Falcon-Mamba) and whole Mamba / Mamba-2 models. Mamba-2 layers of hybrids are in hf_layers.
"""

from __future__ import annotations

from llmgw.shape import Layer, LayerKind
from planner_svc.domain.errors import InvalidShape
from planner_svc.domain.hf_layers import DTYPE_BYTES, ConfigView, describe

_MAX_LAYERS = 1024
_MAX_HEADS = 1 << 14
_MAX_HEAD_DIM = 1 << 16
_MAX_HIDDEN = 1 << 20
_MAX_SSM = 1 << 24
_MAMBA1_TYPES = frozenset({"mamba", "falcon_mamba"})


def ssm_dtype_bytes(config: ConfigView, dtype_bytes: int) -> int:
    # vLLM MambaStateDtypeCalculator: mamba_ssm_cache_dtype "auto" keeps the conv state's
    # dtype (the model's); NemotronH's hook reads mamba_ssm_cache_dtype from the config.
    value = config.get("mamba_ssm_cache_dtype")
    if value is None or value == "auto":
        return dtype_bytes
    if not isinstance(value, str) or value.lower() not in DTYPE_BYTES:
        raise InvalidShape(
            f"config.json's mamba_ssm_cache_dtype is {describe(value)}, not a float type."
        )
    return DTYPE_BYTES[value.lower()]


def linear_layer(config: ConfigView, dtype_bytes: int) -> Layer:
    # vLLM gated_delta_net_state_shape: conv state (2*k_heads*k_dim + v_heads*v_dim) x
    # (kernel - 1), temporal state v_heads x v_dim x k_dim.
    k_heads = config.required(("linear_num_key_heads",), maximum=_MAX_HEADS)
    v_heads = config.required(("linear_num_value_heads",), maximum=_MAX_HEADS)
    k_dim = config.required(("linear_key_head_dim",), maximum=_MAX_HEAD_DIM)
    v_dim = config.required(("linear_value_head_dim",), maximum=_MAX_HEAD_DIM)
    kernel = config.required(("linear_conv_kernel_dim",), maximum=_MAX_SSM)
    conv = (2 * k_heads * k_dim + v_heads * v_dim) * (kernel - 1)
    temporal = v_heads * v_dim * k_dim
    state = conv * dtype_bytes + temporal * ssm_dtype_bytes(config, dtype_bytes)
    return Layer(LayerKind.RECURRENT, state_bytes=state)


def mamba1_layer(
    config: ConfigView, dtype_bytes: int, *, inner: int, state: int, kernel: int
) -> Layer:
    # vLLM mamba1_state_shape: conv state inner x (kernel - 1), temporal inner x state.
    conv = inner * (kernel - 1)
    temporal = inner * state
    return Layer(
        LayerKind.RECURRENT,
        state_bytes=conv * dtype_bytes + temporal * ssm_dtype_bytes(config, dtype_bytes),
    )


def jamba_mamba_layer(config: ConfigView, dtype_bytes: int) -> Layer:
    hidden = config.required(("hidden_size",), maximum=_MAX_HIDDEN)
    expand = config.optional("mamba_expand", maximum=64) or 2
    return mamba1_layer(
        config,
        dtype_bytes,
        inner=expand * hidden,
        state=config.required(("mamba_d_state",), maximum=_MAX_SSM),
        kernel=config.required(("mamba_d_conv",), maximum=_MAX_SSM),
    )


def recurrent_layers(config: ConfigView, dtype_bytes: int) -> tuple[Layer, ...]:
    count = config.required(("num_hidden_layers", "n_layer", "num_layers"), maximum=_MAX_LAYERS)
    hidden = config.required(("hidden_size", "d_model"), maximum=_MAX_HIDDEN)
    expand = config.optional("expand", maximum=64) or 2
    state = config.required(("state_size",), maximum=_MAX_SSM)
    kernel = config.required(("conv_kernel",), maximum=_MAX_SSM)
    inner = config.optional("intermediate_size", maximum=_MAX_HIDDEN * 64) or expand * hidden
    if config.model_type in _MAMBA1_TYPES:
        layer = mamba1_layer(config, dtype_bytes, inner=inner, state=state, kernel=kernel)
    else:
        # vLLM mamba2_state_shape: conv state (inner + 2*groups*state) x (kernel - 1),
        # temporal heads x head_dim x state.
        groups = config.optional("n_groups", maximum=_MAX_HEADS) or 1
        heads = config.required(("num_heads",), maximum=_MAX_HEADS)
        head_dim = config.required(("head_dim",), maximum=_MAX_HEAD_DIM)
        conv = (expand * hidden + 2 * groups * state) * (kernel - 1)
        temporal = heads * head_dim * state
        layer = Layer(
            LayerKind.RECURRENT,
            state_bytes=conv * dtype_bytes + temporal * ssm_dtype_bytes(config, dtype_bytes),
        )
    config.notes.append(
        "recurrent state sized at the model dtype as vLLM keeps it; llama.cpp keeps it in float32."
    )
    return (layer,) * count
