"""A Hugging Face config.json read as a model's shape, by vLLM's rules.

Sources, each read and restated here (nothing copied):
- vllm/config/model.py `get_head_size`, `get_total_num_kv_heads`, `get_sliding_window`,
  `is_deepseek_mla`; the trained context is `hf_context`'s;
- transformers' config classes for the sliding-window patterns (Gemma2/Gemma3/Cohere2
  `sliding_window_pattern`, Qwen2/Qwen3 `max_window_layers`); the hybrid encodings are
  `hf_layers`', the recurrent state `hf_state`'s, the keys a config omits `hf_defaults`', what
  tensor parallel splits `hf_parallel`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmgw.shape import Layer, LayerKind, ModelShape
from planner_svc.domain import hf_layers, hf_state
from planner_svc.domain.errors import InvalidShape
from planner_svc.domain.hf_compute import compute_from_hf_config
from planner_svc.domain.hf_context import trained_context
from planner_svc.domain.hf_defaults import defaults_for
from planner_svc.domain.hf_layers import DTYPE_BYTES, describe, whole
from planner_svc.domain.hf_parallel import parallel_dims

# Generous ceilings for "absurd": far past any released model, far below overflow.
_MAX_LAYERS = 1024
_MAX_HEADS = 1 << 14
_MAX_HEAD_DIM = 1 << 16
_MAX_HIDDEN = 1 << 20
_MAX_TOKENS = 1 << 32
_MAX_WEIGHTS_BYTES = 1 << 52

# Where multimodal configs keep their language model (transformers `get_text_config`).
_TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config")

# vllm get_total_num_kv_heads: the attributes it tries, in order.
_KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num")


_FULL = "full_attention"
_SLIDING = "sliding_attention"
_CHUNKED = "chunked_attention"

_MAMBA1_TYPES = frozenset({"mamba", "falcon_mamba"})
_MAMBA2_TYPES = frozenset({"mamba2"})
# transformers Gemma2 attention: every other layer slides (layer_types: sliding iff (i+1) % 2).
_PATTERN_DEFAULTS = {"gemma2": 2}


def shape_from_hf_config(config: Mapping[str, object], *, weights_bytes: int = 0) -> ModelShape:
    """Read a Hugging Face `config.json` (already parsed) as a model's shape.

    The language model's numbers come from a nested text config when there is one
    (multimodal repos); heads, head sizes, sliding windows, MLA and recurrent state are read
    as vLLM applies them, and the trained context is the length vLLM derives.

    Args:
        config: the parsed `config.json`.
        weights_bytes: the weights' size, when the caller knows it (0: unknown).

    Returns:
        The model's shape, `format="hf"`.

    Raises:
        InvalidShape: the config is malformed (missing, zero, negative, non-numeric, absurd or
            mistyped values; inconsistent layer types).
    """
    if not isinstance(config, Mapping):
        raise InvalidShape(f"config.json must be a JSON object, not {describe(config)}.")
    if isinstance(weights_bytes, bool) or not isinstance(weights_bytes, int):
        raise InvalidShape(f"weights_bytes must be a whole number, not {describe(weights_bytes)}.")
    if not 0 <= weights_bytes <= _MAX_WEIGHTS_BYTES:
        raise InvalidShape(f"weights_bytes {weights_bytes} is out of range.")
    return _Reader(config).shape(weights_bytes)


class _Reader:
    """One config being read: the text config first, the top level for what it lacks."""

    def __init__(self, config: Mapping[str, object]) -> None:
        self.top = config
        self.text = self._text_config(config)
        self.notes: list[str] = []
        self.model_type = self._model_type()
        self.defaults = defaults_for(self.model_type)
        self.defaulted: dict[str, object] = {}

    @staticmethod
    def _text_config(config: Mapping[str, object]) -> Mapping[str, object]:
        for key in _TEXT_CONFIG_KEYS:
            sub = config.get(key)
            if sub is None:
                continue
            if not isinstance(sub, Mapping):
                raise InvalidShape(f"config.json's {key} must be an object, not {describe(sub)}.")
            return sub
        thinker = config.get("thinker_config")
        if isinstance(thinker, Mapping):
            text = thinker.get("text_config")
            if isinstance(text, Mapping):
                return text
        return config

    # -- raw access ------------------------------------------------------------------------

    def get(self, key: str) -> object:
        """The text config's value for `key`, else the top level's, else the default of the
        architecture's transformers config class (`hf_defaults`); None when none has it."""
        if key in self.text:
            return self.text[key]
        if key in self.top:
            return self.top[key]
        if key in self.defaults:
            self.defaulted[key] = self.defaults[key]
            return self.defaults[key]
        return None

    def first(self, keys: Sequence[str]) -> tuple[str, object]:
        """The first of `keys` with a non-null value, and that value (None when none has)."""
        for key in keys:
            value = self.get(key)
            if value is not None:
                return key, value
        return keys[0], None

    def int_at(self, key: str, value: object, *, minimum: int, maximum: int) -> int:
        """`value` (read from `key`) as a whole number in [minimum, maximum]."""
        number = whole(value)
        if number is None or not minimum <= number <= maximum:
            raise InvalidShape(
                f"config.json's {key} is {describe(value)}, not a whole number from {minimum} "
                f"to {maximum}."
            )
        return number

    def required(self, keys: Sequence[str], *, minimum: int = 1, maximum: int) -> int:
        """The first present of `keys` as a whole number; InvalidShape when none is present."""
        key, value = self.first(keys)
        if value is None:
            names = " or ".join(keys)
            raise InvalidShape(f"config.json has no {names}: it does not describe a model.")
        return self.int_at(key, value, minimum=minimum, maximum=maximum)

    def optional(self, key: str, *, minimum: int = 1, maximum: int) -> int | None:
        """`key` as a whole number, or None when it is absent or null."""
        value = self.get(key)
        if value is None:
            return None
        return self.int_at(key, value, minimum=minimum, maximum=maximum)

    # -- the shape --------------------------------------------------------------------------

    def _model_type(self) -> str:
        text_type = self.text.get("model_type")
        top_type = self.top.get("model_type")
        for value in (text_type, top_type):
            if value is not None and not isinstance(value, str):
                raise InvalidShape(f"config.json's model_type must be text, not {describe(value)}.")
        return str(text_type or top_type or "")

    def _architecture(self) -> str:
        top_type = self.top.get("model_type")
        if isinstance(top_type, str) and top_type:
            return top_type
        architectures = self.top.get("architectures")
        if isinstance(architectures, list) and architectures and isinstance(architectures[0], str):
            return architectures[0]
        if self.model_type:
            return self.model_type
        raise InvalidShape("config.json names neither a model_type nor architectures.")

    def shape(self, weights_bytes: int) -> ModelShape:
        architecture = self._architecture()
        dtype_bytes = self._dtype_bytes()
        trained = trained_context(self)
        if self.model_type in _MAMBA1_TYPES or self.model_type in _MAMBA2_TYPES:
            layers, heads, kv_heads, expanded = (
                hf_state.recurrent_layers(self, dtype_bytes),
                0,
                0,
                None,
            )
        else:
            layers, heads, kv_heads, expanded = self._attention_layers(dtype_bytes, trained)
        parallel = parallel_dims(self, self.top, layers, heads)
        if self.defaulted:
            self.notes.append(
                "config.json omits "
                + ", ".join(
                    f"{key} (default {value!r:.30})" for key, value in self.defaulted.items()
                )
                + f": read as transformers' {self.model_type} config class defines them"
            )
        return ModelShape(
            architecture=architecture,
            layers=layers,
            attention_heads=heads,
            kv_heads=kv_heads,
            trained_context=trained,
            weights_bytes=weights_bytes,
            kv_dtype_bytes=dtype_bytes,
            format="hf",
            notes=tuple(self.notes),
            mla_expanded=expanded,
            compute=compute_from_hf_config(self.top),
            parallel=parallel,
        )

    def _dtype_bytes(self) -> int:
        # vLLM `_find_dtype`: config.dtype (transformers v5) or torch_dtype, then the text
        # config's; with none, vLLM falls back to the weights' dtype or float32, which its
        # "auto" dtype runs at 16 bits.
        key, value = "torch_dtype", None
        for source in (self.top, self.text):
            for name in ("dtype", "torch_dtype"):
                if source.get(name) is not None:
                    key, value = name, source[name]
                    break
            if value is not None:
                break
        if value is None or value == "auto":
            return 2
        if not isinstance(value, str):
            raise InvalidShape(f"config.json's {key} must be text, not {describe(value)}.")
        size = DTYPE_BYTES.get(value.removeprefix("torch.").lower())
        if size is None:
            self.notes.append(
                f"dtype {value!r} is not a 16- or 32-bit float; the cache is sized at 2 bytes."
            )
            return 2
        if size == 4:
            # vllm/config/model.py `_resolve_auto_dtype`: "Downcast for float32 models".
            self.notes.append(
                "float32 checkpoint: the cache is sized at 4 bytes, but vLLM's --dtype auto runs "
                "it at 16 bits (half this)."
            )
        return size

    # -- layers -----------------------------------------------------------------------------

    def _attention_layers(
        self, dtype_bytes: int, trained: int
    ) -> tuple[tuple[Layer, ...], int, int, tuple[int, int] | None]:
        count_keys = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
        implied = hf_layers.pattern_length(self)
        if self.first(count_keys)[1] is None and implied is not None:
            count = self.int_at("layers_block_type", implied, minimum=1, maximum=_MAX_LAYERS)
        else:
            count = self.required(count_keys, maximum=_MAX_LAYERS)
        heads = self.required(("num_attention_heads", "n_head", "num_heads"), maximum=_MAX_HEADS)
        kv_heads = self._kv_heads(heads)
        layer_types = self._layer_types(count)

        expanded: tuple[int, int] | None = None
        if self.get("kv_lora_rank") is not None:
            attention, expanded = self._mla_layer()
            shape_kv_heads = kv_heads
        else:
            if heads % kv_heads:
                raise InvalidShape(
                    f"config.json's {heads} attention heads do not split into {kv_heads} KV heads."
                )
            head_dim = self._head_dim(heads)
            attention = Layer(
                LayerKind.FULL, kv_heads=kv_heads, head_dim_k=head_dim, head_dim_v=head_dim
            )
            shape_kv_heads = kv_heads

        window = self._window(layer_types)
        sliding = self._sliding_layer(attention, window, trained, layer_types)
        built: dict[str, Layer] = {}
        layers: list[Layer] = []
        for kind in layer_types:
            layer = built.get(kind)
            if layer is None:
                layer = built[kind] = self._layer_of(kind, attention, sliding, dtype_bytes)
            layers.append(layer)
        return tuple(layers), heads, shape_kv_heads, expanded

    def _layer_of(
        self, kind: str, attention: Layer, sliding: Layer | None, dtype_bytes: int
    ) -> Layer:
        """One layer of `kind` (an `hf_layers` kind)."""
        if kind == hf_layers.FULL:
            return attention
        if kind in (hf_layers.SLIDING, hf_layers.CHUNKED):
            assert sliding is not None
            return sliding
        if kind == hf_layers.LINEAR:
            return hf_state.linear_layer(self, dtype_bytes)
        if kind == hf_layers.MAMBA:
            return hf_state.jamba_mamba_layer(self, dtype_bytes)
        ssm = hf_state.ssm_dtype_bytes(self, dtype_bytes)
        if kind == hf_layers.MAMBA2:
            return hf_layers.mamba2_layer(self, dtype_bytes, ssm)
        if kind == hf_layers.PARALLEL_HYBRID:
            mixer = hf_layers.mamba2_layer(self, dtype_bytes, ssm)
            return Layer(
                attention.kind,
                kv_heads=attention.kv_heads,
                head_dim_k=attention.head_dim_k,
                head_dim_v=attention.head_dim_v,
                state_bytes=mixer.state_bytes,
            )
        if kind == hf_layers.CONV:
            return hf_layers.conv_layer(self, dtype_bytes)
        return Layer(LayerKind.NO_CACHE)

    def _kv_heads(self, heads: int) -> int:
        # vllm get_total_num_kv_heads: Falcon-style multi_query means one KV head.
        if self.get("multi_query") is True and not self.get("new_decoder_architecture"):
            return 1
        key, value = self.first(_KV_HEAD_KEYS)
        if value is None:
            return heads
        return self.int_at(key, value, minimum=1, maximum=heads)

    def _head_dim(self, heads: int) -> int:
        # vllm get_head_size: an explicit head_dim wins (Qwen3, Gemma 2: heads x head_dim is not
        # hidden_size), else hidden_size / num_attention_heads.
        explicit = self.optional("head_dim", maximum=_MAX_HEAD_DIM)
        if explicit is None:
            # NemotronHConfig spells it attention_head_dim.
            explicit = self.optional("attention_head_dim", maximum=_MAX_HEAD_DIM)
        if explicit is not None:
            return explicit
        hidden = self.required(("hidden_size", "n_embd", "d_model"), maximum=_MAX_HIDDEN)
        if hidden % heads:
            raise InvalidShape(
                f"config.json's hidden_size {hidden} does not split into {heads} heads and it "
                "gives no head_dim."
            )
        return hidden // heads

    def _mla_layer(self) -> tuple[Layer, tuple[int, int]]:
        # vllm get_head_size with use_mla: the cache holds kv_lora_rank + qk_rope_head_dim per
        # token and layer, once (one "head"), whatever the tensor parallel.
        rank = self.required(("kv_lora_rank",), maximum=_MAX_HEAD_DIM)
        rope = self.required(("qk_rope_head_dim",), minimum=0, maximum=_MAX_HEAD_DIM)
        nope = self.required(("qk_nope_head_dim",), minimum=0, maximum=_MAX_HEAD_DIM)
        v_dim = self.required(("v_head_dim",), maximum=_MAX_HEAD_DIM)
        if nope + rope < 1:
            raise InvalidShape("config.json's qk_nope_head_dim + qk_rope_head_dim is 0.")
        layer = Layer(LayerKind.MLA, kv_heads=1, head_dim_k=rank + rope, head_dim_v=0)
        index_dim = self.optional("index_head_dim", maximum=_MAX_HEAD_DIM)
        if index_dim is not None and self.get("index_topk") is not None:
            # DeepSeek V3.2's sparse attention (DSA). vLLM's DeepseekV32IndexerCache
            # (vllm/model_executor/models/deepseek_v2.py) caches every attention layer's
            # indexer key as fp8 plus one 4-byte scale per 128 values, whatever the KV cache
            # type: index_head_dim + index_head_dim // 128 * 4 bytes a token (132 for 128).
            # Its FlashMLA sparse backend stores an fp8 cache as "fp8_ds_mla"
            # (vllm/v1/attention/backends/mla/flashmla_sparse.py get_kv_cache_shape: 656 bytes a
            # token): the latent in fp8, one float32 scale per 128 of it, the rope part in bf16.
            # SGLang's NSATokenToKVPool (python/sglang/srt/mem_cache/memory_pool.py) keeps the
            # same: an index key of index_head_dim fp8 values + a 4-byte scale a token (quant
            # block 128), and its fp8 store the rope part in bf16.
            layer = Layer(
                LayerKind.MLA,
                kv_heads=1,
                head_dim_k=rank + rope,
                head_dim_v=0,
                indexer_dim=index_dim,
                fp8_token_bytes=rank + rank // 128 * 4 + rope * 2,
            )
            self.notes.append(
                "sparse attention (DSA): an indexer key of "
                f"{index_dim + index_dim // 128 * 4} bytes a token and layer is counted beside the "
                "latent; an fp8 cache is sized in vLLM's fp8_ds_mla layout"
            )
        return layer, (nope + rope, v_dim)

    def _layer_types(self, count: int) -> list[str]:
        explicit = hf_layers.explicit_pattern(self, count)
        if explicit is not None:
            return explicit

        if not self._slides():
            return [_FULL] * count

        pattern_key, pattern_value = self.first(
            ("sliding_window_pattern", "_sliding_window_pattern")
        )
        pattern = (
            self.int_at(pattern_key, pattern_value, minimum=1, maximum=_MAX_LAYERS)
            if pattern_value is not None
            else _PATTERN_DEFAULTS.get(self.model_type)
        )
        if pattern is not None:
            # transformers Gemma2/Gemma3/Cohere2: sliding unless (i + 1) % pattern == 0, so
            # layer 0 slides and every pattern-th layer is global (Gemma 3: 5 local : 1 global).
            return [_FULL if (i + 1) % pattern == 0 else _SLIDING for i in range(count)]

        if self.get("max_window_layers") is not None:
            # transformers Qwen2/Qwen3: with use_sliding_window, layers from max_window_layers on
            # slide (vLLM qwen2.py builds the same layer_types).
            first = self.int_at(
                "max_window_layers", self.get("max_window_layers"), minimum=0, maximum=_MAX_LAYERS
            )
            return [_SLIDING if i >= first else _FULL for i in range(count)]

        # One window for every layer (Mistral v0.1, Phi-3): vLLM's Attention falls back to the
        # model-level cache_config.sliding_window (= hf_text_config.sliding_window) when a model
        # gives no per-layer window.
        return [_SLIDING] * count

    def _slides(self) -> bool:
        """Whether the config turns sliding-window attention on at all."""
        if self.get("sliding_window") is None:
            return False
        use = self.get("use_sliding_window")
        if use is not None and not isinstance(use, bool):
            raise InvalidShape(
                f"config.json's use_sliding_window must be true or false, not {describe(use)}."
            )
        if use is False:
            # Qwen2/2.5 ship sliding_window: 131072 with use_sliding_window: false; transformers
            # then sets sliding_window to None and vLLM reads no window.
            return False
        # Qwen2/Qwen3 configs (max_window_layers) default use_sliding_window to false.
        return not (use is None and self.get("max_window_layers") is not None)

    def _window(self, layer_types: Sequence[str]) -> int:
        if _CHUNKED in layer_types:
            return self.required(("attention_chunk_size",), maximum=_MAX_TOKENS)
        if _SLIDING not in layer_types:
            return 0
        value = self.get("sliding_window")
        if value is None:
            raise InvalidShape(
                "config.json's layer_types has sliding_attention layers but no sliding_window."
            )
        return self.int_at("sliding_window", value, minimum=1, maximum=_MAX_TOKENS)

    def _sliding_layer(
        self, attention: Layer, window: int, trained: int, layer_types: Sequence[str]
    ) -> Layer | None:
        if window == 0:
            return None
        if 0 < trained <= window:
            self.notes.append(
                f"sliding window {window} is not shorter than the trained context {trained}: "
                "those layers are sized as full attention."
            )
            return attention
        if all(kind in (_SLIDING, _CHUNKED) for kind in layer_types):
            self.notes.append(
                f"every layer slides over {window} tokens as vLLM reads this config; engines "
                "differ: llama.cpp disables the window for some architectures (Phi-3) and "
                "caches every token."
            )
        return Layer(
            LayerKind.SLIDING,
            kv_heads=attention.kv_heads,
            head_dim_k=attention.head_dim_k,
            head_dim_v=attention.head_dim_v,
            window_tokens=window,
        )
