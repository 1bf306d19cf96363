"""The widths a forward pass follows, read from a Hugging Face config.json: hidden size, MLP
and expert widths, vocabulary, whether a vision encoder comes with it. The engines' activation
peaks (llmgw.engines.torch_overhead) are built from these.

Keys as the transformers config classes name them: `hidden_size` (`n_embd`, `d_model`),
`intermediate_size` (`ffn_dim`, `n_inner`), `vocab_size`; experts as `num_experts` (Qwen-MoE),
`num_local_experts` (Mixtral, gpt-oss) or `n_routed_experts` (DeepSeek); the routed per token
as `num_experts_per_tok` (`num_experts_per_token`, gpt-oss); an expert's width as
`moe_intermediate_size`, else `intermediate_size` (Mixtral and gpt-oss give no other); shared
experts as `shared_expert_intermediate_size` (Qwen2-MoE, Qwen3-Next) or `n_shared_experts` ×
`moe_intermediate_size` (DeepSeek); dense leading layers as `first_k_dense_replace`.
"""

from __future__ import annotations

from collections.abc import Mapping

from llmgw.shape import VISION_TOWER_INTERNVIT, Compute

_TEXT_KEYS = ("text_config", "llm_config", "language_config")
_VISION_KEYS = ("vision_config", "visual", "vision_tower", "mm_vision_tower")
_LIMIT = 1 << 24


def _whole(value: object) -> int:
    """A positive whole number below 2^24, else 0 (a width the reader does not trust)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    number = int(value)
    return number if number == value and 0 < number < _LIMIT else 0


def _first(config: Mapping[str, object], keys: tuple[str, ...]) -> int:
    for key in keys:
        number = _whole(config.get(key))
        if number:
            return number
    return 0


def compute_from_hf_config(config: Mapping[str, object]) -> Compute:
    """The forward pass's widths of a config.json (0 where it does not say)."""
    text: Mapping[str, object] = config
    for key in _TEXT_KEYS:
        sub = config.get(key)
        if isinstance(sub, Mapping):
            text = sub
            break
    else:
        thinker = config.get("thinker_config")
        if isinstance(thinker, Mapping) and isinstance(thinker.get("text_config"), Mapping):
            text = thinker["text_config"]

    def get(keys: tuple[str, ...]) -> int:
        return _first(text, keys) or _first(config, keys)

    hidden = get(("hidden_size", "n_embd", "d_model"))
    intermediate = get(("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size"))
    experts = get(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"))
    per_token = get(("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k"))
    expert_width = get(("moe_intermediate_size", "expert_intermediate_size"))
    if experts and not expert_width:
        expert_width = intermediate
    shared = get(("shared_expert_intermediate_size",))
    if not shared and experts:
        shared = get(("n_shared_experts",)) * expert_width
    dense_layers = get(("first_k_dense_replace",)) if experts else 0
    vision = any(isinstance(config.get(k), Mapping | str) and config.get(k) for k in _VISION_KEYS)
    tower = _internvit(config)
    return Compute(
        vision_tower=VISION_TOWER_INTERNVIT if tower else "",
        vision_hidden_size=tower[0] if tower else 0,
        vision_image_size=tower[1] if tower else 0,
        vision_item_tiles=tower[2] if tower else 0,
        vision_tile_tokens=tower[3] if tower else 0,
        vision_item_tokens=tower[4] if tower else 0,
        cross_attention_image_tokens=_mllama_image_tokens(config),
        hidden_size=hidden,
        intermediate_size=intermediate,
        vocab_size=get(("vocab_size", "padded_vocab_size")),
        experts=experts if experts > 1 else 0,
        experts_per_token=per_token if experts > 1 else 0,
        expert_intermediate_size=expert_width if experts > 1 else 0,
        shared_intermediate_size=shared,
        dense_layers=dense_layers,
        vision=vision,
    )


MLLAMA_PATCH = 14
"""vLLM counts an mllama tile's tokens with a 14-pixel patch (mllama.py get_max_mllama_image_tokens
divides `image_size` by 14)."""


def _mllama_image_tokens(config: Mapping[str, object]) -> int:
    """An mllama config's encoder tokens for one image at its most tiles (0 for other models):
    max_num_tiles × ((image_size // 14)² + 1), 4 × 1601 for Llama-3.2-Vision."""
    vision = config.get("vision_config")
    if config.get("model_type") != "mllama" or not isinstance(vision, Mapping):
        return 0
    tiles = _whole(vision.get("max_num_tiles")) or 4
    size = _whole(vision.get("image_size")) or 560
    return tiles * ((size // MLLAMA_PATCH) ** 2 + 1)


INTERNVL_MODEL_TYPES = frozenset({"internvl_chat"})
"""The configs whose vision tower vLLM builds as InternViT with InternVL's tiling
(vllm/model_executor/models/internvl.py InternVLChatModel, the OpenGVLab remote-code
checkpoints of InternVL 1.5 to 3)."""


def _internvit(config: Mapping[str, object]) -> tuple[int, int, int, int, int] | None:
    """An InternVL chat config's tower width, tile side, tiles an image, tower tokens a tile and
    language-model tokens an image, as Compute's `vision_*` fields (None for other models).
    The tiles of the largest image follow vLLM's internvl.py: a dummy image max_dynamic_patch
    tiles wide is cut into max_dynamic_patch tiles, plus a thumbnail when
    use_thumbnail is set and there is more than one; the tower sees (side // patch)² patches and
    a class token a tile, and the language model downsample_ratio² of the patches."""
    vision = config.get("vision_config")
    if config.get("model_type") not in INTERNVL_MODEL_TYPES or not isinstance(vision, Mapping):
        return None
    hidden = _whole(vision.get("hidden_size"))
    side = _whole(config.get("force_image_size")) or _whole(vision.get("image_size"))
    patch = _whole(vision.get("patch_size"))
    most = _whole(config.get("max_dynamic_patch")) or 1
    ratio = config.get("downsample_ratio", 0.5)
    if not (hidden and side and patch and side >= patch):
        return None
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio <= 1:
        return None
    patches = (side // patch) ** 2
    thumbnail = config.get("use_thumbnail") is True
    tiles = most + (1 if thumbnail and most > 1 else 0)
    counted = (most + (1 if thumbnail else 0)) * int(patches * ratio**2)
    return hidden, side, tiles, patches + 1, counted
