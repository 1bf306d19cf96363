"""The trained context a Hugging Face config gives, as vLLM derives it.

Restated from vllm/config/model.py `_get_and_verify_max_len` (every context key, the smallest
present wins; Command-R's model_max_length; Gemma 3's already-scaled length; rope factors of the
types that extend it, yarn from its original length) and vllm/transformers_utils/config.py
`patch_rope_parameters_dict` (legacy `type`, su -> longrope, mrope -> default).
"""

from __future__ import annotations

from collections.abc import Mapping

from planner_svc.domain.errors import InvalidShape
from planner_svc.domain.hf_layers import KNOWN_LAYER_TYPES, ConfigView, describe, whole

_MAX_TOKENS = 1 << 32
_MAX_ROPE_FACTOR = 1024.0

# vllm/config/model.py `_get_and_verify_max_len`: every key it reads, the smallest present wins.
_CONTEXT_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# ... except these rope types, whose factor does not extend the derived length.
_ROPE_TYPES_NOT_EXTENDING = frozenset({"su", "longrope", "llama3"})


def trained_context(config: ConfigView) -> int:
    derived: int | None = None
    for key in _CONTEXT_KEYS:
        value = config.get(key)
        if value is None:
            continue
        number = config.int_at(key, value, minimum=1, maximum=_MAX_TOKENS)
        derived = number if derived is None else min(derived, number)
    # vLLM: "For Command-R / Cohere, Cohere2 / Aya Vision models" model_max_length wins.
    override = config.get("model_max_length")
    if override:
        derived = config.int_at("model_max_length", override, minimum=1, maximum=_MAX_TOKENS)
    if derived is None:
        config.notes.append(
            "config.json gives no context length (vLLM would assume 2048 tokens); the "
            "trained context is unknown."
        )
        return 0
    # vLLM: "Gemma3's max_model_len (128K) is already scaled by RoPE scaling".
    if "gemma3" in config.model_type:
        return derived
    scaled = float(derived)
    factor = 1.0
    longrope = False
    for params in _rope_parameters(config):
        rope_type = _rope_type(params)
        if rope_type == "longrope":
            longrope = True
        if rope_type in _ROPE_TYPES_NOT_EXTENDING:
            continue
        if params.get("factor") is not None:
            factor = _rope_factor(params["factor"])
        if rope_type == "yarn":
            original = params.get("original_max_position_embeddings")
            if original is None:
                original = config.get("original_max_position_embeddings")
            if original is not None:
                scaled = float(
                    config.int_at(
                        "rope original_max_position_embeddings",
                        original,
                        minimum=1,
                        maximum=_MAX_TOKENS,
                    )
                )
    trained = int(scaled * factor)
    if not 1 <= trained <= _MAX_TOKENS:
        raise InvalidShape(
            f"config.json's rope scaling gives an absurd context of {trained} tokens."
        )
    if longrope:
        original = whole(config.get("original_max_position_embeddings")) or trained
        config.notes.append(
            f"longrope: vLLM serves {original} tokens by default and up to {trained} when "
            "asked with --max-model-len."
        )
    return trained


def _rope_parameters(config: ConfigView) -> list[Mapping[str, object]]:
    """The rope dicts, flattened: transformers v5 `rope_parameters` (maybe per layer type)
    or the legacy `rope_scaling`."""
    key, value = config.first(("rope_parameters", "rope_scaling"))
    if value is None:
        return []
    if not isinstance(value, Mapping):
        raise InvalidShape(f"config.json's {key} must be an object, not {describe(value)}.")
    if value and set(value).issubset(KNOWN_LAYER_TYPES):
        nested = list(value.values())
        for params in nested:
            if not isinstance(params, Mapping):
                raise InvalidShape(f"config.json's {key} per layer type must hold objects.")
        return nested
    return [value]


def _rope_type(params: Mapping[str, object]) -> str:
    """The rope type as vLLM's patch_rope_parameters_dict leaves it."""
    value = params.get("rope_type", params.get("type", "default"))
    if not isinstance(value, str):
        raise InvalidShape(f"config.json's rope type must be text, not {describe(value)}.")
    if value == "su":
        return "longrope"
    if value == "mrope":
        return "default"
    return value


def _rope_factor(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidShape(f"config.json's rope factor is {describe(value)}, not a number.")
    factor = float(value)
    if not 0 < factor <= _MAX_ROPE_FACTOR:
        raise InvalidShape(f"config.json's rope factor {value} is out of range.")
    return factor
