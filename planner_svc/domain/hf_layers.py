"""Which kind each layer of a Hugging Face config is, in every encoding transformers and vLLM
read, and the recurrent state of its non-attention layers.

Encodings (each restated from the transformers config class and the vLLM model that reads it):
- `layer_types` (Gemma 2/3, Cohere2, gpt-oss, Qwen3-Next, GraniteMoeHybrid, LFM2, ...): one name
  a layer; "mamba" is a Mamba-2 mixer except in Jamba; "conv" is LFM2's short convolution.
- `hybrid_override_pattern` (NemotronHConfig): one character a layer, "M" Mamba-2, "*" attention,
  "-" MLP and "E" mixture of experts (neither keeps a cache).
- `layers_block_type` (Zamba2, NemotronHConfig, older Jamba/Granite dumps): "mamba",
  "attention", "hybrid", and "mlp"/"moe" for Nemotron-H's layers without a mixer (whose
  Mamba-2 layers NemotronHConfig calls "linear_attention").
- `attn_layer_indices` (BambaConfig): attention at those indices, Mamba-2 elsewhere.
- `attn_layer_period` / `attn_layer_offset` (JambaConfig): attention iff i % period == offset.
- `full_attention_interval` (Qwen3NextConfig): full attention iff (i + 1) % interval == 0, gated
  delta nets elsewhere.
- `no_rope_layers` / `no_rope_layer_interval` with `attention_chunk_size` (Llama4TextConfig;
  vllm/model_executor/models/llama4.py): rope layers attend in chunks, the NoPE layers fully.
- `sliding_window_pattern` (Gemma 2/3, Cohere2): sliding unless (i + 1) % pattern == 0.
- Falcon-H1 (FalconH1Config): every layer has attention and a Mamba-2 mixer side by side.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from llmgw.shape import Layer, LayerKind
from planner_svc.domain.errors import InvalidShape

FULL = "full_attention"
SLIDING = "sliding_attention"
CHUNKED = "chunked_attention"
LINEAR = "linear_attention"
MAMBA = "mamba"
"""A Mamba-1 mixer (Jamba)."""
MAMBA2 = "mamba2"
CONV = "conv"
NONE = "none"
"""A layer without attention or state (Nemotron-H's MLP and MoE layers)."""
PARALLEL_HYBRID = "attention+mamba2"
"""Attention and a Mamba-2 mixer in one layer (Falcon-H1)."""

ATTENTION = frozenset({FULL, SLIDING, CHUNKED, PARALLEL_HYBRID})

# layer_types / layers_block_type names -> this module's kinds (the Mamba flavour is fixed later).
_NAMES = {
    "full_attention": FULL,
    "attention": FULL,
    "global": FULL,
    "sliding_attention": SLIDING,
    "chunked_attention": CHUNKED,
    "linear_attention": LINEAR,
    "mamba": MAMBA2,
    "mamba2": MAMBA2,
    "conv": CONV,
    "hybrid": FULL,
    "mlp": NONE,
    "moe": NONE,
}
# hybrid_override_pattern characters (NemotronHConfig).
_PATTERN_CHARS = {"M": MAMBA2, "*": FULL, "-": NONE, "E": NONE}
_MAMBA1_HYBRIDS = frozenset({"jamba"})
_MAX_LAYERS = 1024
_MAX = 1 << 24


DTYPE_BYTES = {
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float32": 4,
    "fp32": 4,
    "float": 4,
}
"""Bytes of the float types a config names (torch_dtype, mamba_ssm_cache_dtype)."""

# Layer-type names transformers writes in `layer_types` (and as keys of per-layer-type
# rope_parameters).
KNOWN_LAYER_TYPES = frozenset({FULL, SLIDING, CHUNKED, LINEAR, "mamba", "attention"})


class ConfigView(Protocol):
    """The reader's access to a config (hf_shape._Reader)."""

    model_type: str
    notes: list[str]

    def get(self, key: str) -> object: ...

    def first(self, keys: Sequence[str]) -> tuple[str, object]: ...

    def optional(self, key: str, *, minimum: int = 1, maximum: int) -> int | None: ...

    def required(self, keys: Sequence[str], *, minimum: int = 1, maximum: int) -> int: ...

    def int_at(self, key: str, value: object, *, minimum: int, maximum: int) -> int: ...


def explicit_pattern(config: ConfigView, count: int) -> list[str] | None:
    """The layer kinds a hybrid or per-layer encoding gives, or None when the config uses none
    of them (then the reader decides from the sliding-window keys)."""
    pattern = _read_pattern(config, count)
    if pattern is None:
        return None
    if config.model_type in _MAMBA1_HYBRIDS:
        pattern = [MAMBA if kind == MAMBA2 else kind for kind in pattern]
    if config.model_type.startswith("nemotron_h"):
        # NemotronHConfig names its Mamba-2 layers "linear_attention" (legacy: "mamba").
        pattern = [MAMBA2 if kind == LINEAR else kind for kind in pattern]
    return pattern


def pattern_length(config: ConfigView) -> int | None:
    """The layer count a per-layer encoding gives, for configs that leave num_hidden_layers
    to it (NemotronHConfig derives it from layers_block_type)."""
    for key in ("layer_types", "layers_block_type", "hybrid_override_pattern"):
        value = config.get(key)
        if isinstance(value, list | str) and value:
            return len(value)
    return None


def _read_pattern(config: ConfigView, count: int) -> list[str] | None:
    if config.model_type == "falcon_h1":
        return [PARALLEL_HYBRID] * count
    for key in ("layer_types", "layers_block_type"):
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or len(value) != count:
            raise InvalidShape(
                f"config.json's {key} must list one type for each of its {count} layers."
            )
        out = []
        for name in value:
            if not isinstance(name, str) or name not in _NAMES:
                raise InvalidShape(
                    f"config.json's {key} has {name!r:.40}, a layer type this planner does not "
                    "size."
                )
            out.append(_NAMES[name])
        return out
    hybrid = config.get("hybrid_override_pattern")
    if hybrid is not None:
        if not isinstance(hybrid, str) or len(hybrid) != count:
            raise InvalidShape(
                f"config.json's hybrid_override_pattern must have one character for each of its "
                f"{count} layers."
            )
        if any(ch not in _PATTERN_CHARS for ch in hybrid):
            raise InvalidShape("config.json's hybrid_override_pattern may only hold M, *, - and E.")
        return [_PATTERN_CHARS[ch] for ch in hybrid]
    indices = config.get("attn_layer_indices")
    if indices is not None:
        if not isinstance(indices, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < count for i in indices
        ):
            raise InvalidShape(
                f"config.json's attn_layer_indices must be layer numbers below {count}."
            )
        chosen = set(indices)
        return [FULL if i in chosen else MAMBA2 for i in range(count)]
    interval = config.optional("full_attention_interval", maximum=_MAX_LAYERS)
    if interval is not None:
        return [FULL if (i + 1) % interval == 0 else LINEAR for i in range(count)]
    period = config.optional("attn_layer_period", maximum=_MAX_LAYERS)
    if period is not None:
        offset = config.optional("attn_layer_offset", minimum=0, maximum=_MAX_LAYERS) or 0
        return [FULL if i % period == offset else MAMBA2 for i in range(count)]
    if config.get("attention_chunk_size") is not None and config.model_type.startswith("llama4"):
        return _llama4_pattern(config, count)
    return None


def _llama4_pattern(config: ConfigView, count: int) -> list[str]:
    flags = config.get("no_rope_layers")
    if flags is None or flags == []:
        interval = config.optional("no_rope_layer_interval", maximum=_MAX_LAYERS) or 4
        flags = [int((i + 1) % interval != 0) for i in range(count)]
    if not isinstance(flags, list) or len(flags) != count:
        raise InvalidShape(
            f"config.json's no_rope_layers must have one entry for each of its {count} layers."
        )
    return [CHUNKED if flag else FULL for flag in flags]


def mamba2_layer(config: ConfigView, dtype_bytes: int, ssm_bytes: int) -> Layer:
    """A Mamba-2 mixer's state per sequence, as vLLM's MambaStateShapeCalculator
    `mamba2_state_shape` sizes it: conv state (inner + 2 x groups x state) x (kernel - 1) at the
    model's dtype, temporal state heads x head_dim x state at the SSM cache dtype."""
    heads = config.required(
        ("mamba_num_heads", "mamba_n_heads", "n_mamba_heads", "num_heads"), maximum=_MAX
    )
    head_dim = config.required(
        ("mamba_head_dim", "mamba_d_head", "mamba_headdim", "head_dim"), maximum=_MAX
    )
    state = config.required(("ssm_state_size", "mamba_d_state", "state_size"), maximum=_MAX)
    kernel = config.required(("conv_kernel", "mamba_d_conv"), minimum=2, maximum=_MAX)
    groups = config.required(("mamba_n_groups", "n_groups", "mamba_ngroups"), maximum=_MAX)
    inner = mamba2_inner(config, heads, head_dim)
    conv = (inner + 2 * groups * state) * (kernel - 1)
    temporal = heads * head_dim * state
    return Layer(LayerKind.RECURRENT, state_bytes=conv * dtype_bytes + temporal * ssm_bytes)


def mamba2_inner(config: ConfigView, heads: int, head_dim: int) -> int:
    """A Mamba-2 mixer's inner width: mamba_d_ssm (Falcon-H1) when given, else heads x
    head_dim (what every Mamba-2 config's expand x hidden equals)."""
    explicit = config.optional("mamba_d_ssm", maximum=_MAX)
    return explicit if explicit is not None else heads * head_dim


def conv_layer(config: ConfigView, dtype_bytes: int) -> Layer:
    """LFM2's short convolution: hidden x (conv_L_cache - 1) at the model's dtype (vLLM
    MambaStateShapeCalculator `short_conv_state_shape`)."""
    hidden = config.required(("hidden_size",), maximum=_MAX)
    kernel = config.required(("conv_L_cache",), minimum=2, maximum=_MAX)
    return Layer(LayerKind.RECURRENT, state_bytes=hidden * (kernel - 1) * dtype_bytes)


def whole(value: object) -> int | None:
    """`value` as an int when it is a whole number (an integral float counts), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def describe(value: object) -> str:
    """A short, safe rendering of a value for a message."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
