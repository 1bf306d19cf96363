"""A model's shape: per-layer cache geometry, heads, trained context and weights."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from llmgw.refusal import Refusal


@dataclass
class InvalidShape(Refusal):
    """A header, a config or an inline shape could not be read as a model's shape (malformed,
    hostile, absurd); `source` names where it came from."""

    source: str = ""

    def metadata(self) -> dict[str, str]:
        return {"source": self.source} if self.source else {}


class LayerKind(enum.Enum):
    """What a layer keeps in the cache."""

    FULL = "full"
    """Attends over the whole context: its KV grows with every token."""
    SLIDING = "sliding"
    """Attends over a window of `window_tokens`: its KV is capped at the window."""
    MLA = "mla"
    """Multi-head latent attention: one latent of `head_dim_k` per token, never split by TP."""
    RECURRENT = "recurrent"
    """Recurrent (SSM, linear attention): `state_bytes` per sequence, nothing per token."""
    NO_CACHE = "no_cache"
    """Keeps nothing of its own: reuses an earlier layer's KV, or has no attention."""


def indexer_token_bytes(dim: int) -> int:
    """What vLLM and SGLang cache per token for an indexer key of `dim` values: fp8 values and a
    4-byte scale per 128 of them (vLLM DeepseekV32IndexerCache, vllm/model_executor/models/
    deepseek_v2.py; SGLang NSATokenToKVPool, python/sglang/srt/mem_cache/memory_pool.py)."""
    return dim + dim // 128 * 4


@dataclass(frozen=True)
class Layer:
    """One layer's cache geometry.

    `kv_heads`, `head_dim_k` and `head_dim_v` are what the cache stores per token: for an MLA
    layer one "head" whose K width is the latent (kv_lora_rank + rope dims) and whose V width
    is 0 when the engine derives V from the latent. `state_bytes` is a recurrent layer's state
    per sequence (a hybrid layer such as Falcon-H1's may have both KV and state).
    """

    kind: LayerKind
    kv_heads: int = 0
    head_dim_k: int = 0
    head_dim_v: int = 0
    window_tokens: int = 0
    state_bytes: int = 0
    indexer_dim: int = 0
    """A sparse-attention indexer's key width, cached per token beside the K/V (DeepSeek V3.2's
    DSA: 128). Engines store it their own way (`indexer_token_bytes`; llama.cpp at the K type)."""
    fp8_token_bytes: int = 0
    """Bytes per token of the layer's K/V when the cache is fp8 and the engine packs it its own
    way (0: kv_heads x head dims x 1). DeepSeek V3.2's sparse MLA: 656 (see hf_shape)."""

    has_kv: bool = field(init=False, compare=False, repr=False)
    """Whether the layer keeps per-token KV (worked out once: sizing asks it per layer)."""

    def __post_init__(self) -> None:
        kv = self.kind in (LayerKind.FULL, LayerKind.SLIDING, LayerKind.MLA) and self.kv_heads > 0
        object.__setattr__(self, "has_kv", kv)


@dataclass(frozen=True)
class Compute:
    """What a forward pass of the model holds per token, for the engines' activation peaks
    (0: not known). `experts` > 0 marks a mixture of experts; `vision` a multimodal model
    whose engine also profiles its encoder."""

    hidden_size: int = 0
    intermediate_size: int = 0
    vocab_size: int = 0
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    shared_intermediate_size: int = 0
    dense_layers: int = 0
    vision: bool = False
    cross_attention_image_tokens: int = 0
    """A cross-attention vision-language model's encoder tokens for one image at its most
    tiles (mllama: max_num_tiles × ((image_size // 14)² + 1), vLLM's
    get_max_mllama_image_tokens); 0 for other models."""
    vision_tower: str = ""
    """The vision tower whose profile the engines' rules know by name (VISION_TOWER_INTERNVIT:
    an InternVL chat checkpoint's InternViT), "" for the others; the widths below are its."""
    vision_hidden_size: int = 0
    vision_image_size: int = 0
    """A tile's side in pixels (InternVL's force_image_size, else the tower's image_size)."""
    vision_item_tiles: int = 0
    """The tiles one image is cut into at most (InternVL: max_dynamic_patch, plus the thumbnail
    when it is used and there is more than one tile)."""
    vision_tile_tokens: int = 0
    """The tower's tokens for one tile: its patches and the class token."""
    vision_item_tokens: int = 0
    """The language model's tokens for one image at most tiles, as vLLM counts them
    (get_max_internvl_image_tokens: (max_dynamic_patch + thumbnail) x patches x
    downsample_ratio²)."""


VISION_TOWER_INTERNVIT = "internvit"


@dataclass(frozen=True)
class WeightQuant:
    """How the checkpoint's linear weights are quantized, as far as tensor parallel cares.

    `block` is a block-quantized (fp8) checkpoint's (block_n, block_k): output and input
    channels per scale; `group` a GPTQ/AWQ checkpoint's input channels per scale. 0: none.
    """

    method: str = ""
    block: tuple[int, int] = (0, 0)
    group: int = 0


@dataclass(frozen=True)
class ParallelDims:
    """The sizes tensor parallel splits besides the attention heads (0: absent or unknown).

    `dense_intermediate` is the dense MLP's width when some layer has a dense MLP;
    `expert_intermediate` one routed expert's; `shared_intermediate` the shared expert(s)'
    merged width. `vision_heads`/`vision_intermediate` are a multimodal model's vision
    encoder's. `linear_k_heads`/`linear_v_heads` a gated-delta-net layer's (Qwen3-Next);
    `ssm_heads`/`ssm_groups` a Mamba-2 mixer's, `ssm_inner` a Mamba mixer's inner width.
    `q_head_dim`/`o_head_dim` are the query and attention-output head sizes (for the quant
    block of the projections' shards).
    """

    vocab: int = 0
    """The vocabulary (the embedding and LM head are split by rows of it)."""
    dense_intermediate: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    vision_heads: int = 0
    vision_intermediate: int = 0
    vision_pads_heads: bool = False
    """The engine takes any TP size for the vision heads (InternViT in vLLM: it replicates the
    attention, or pads the heads, when they do not divide)."""
    linear_k_heads: int = 0
    linear_v_heads: int = 0
    ssm_heads: int = 0
    ssm_groups: int = 0
    ssm_inner: int = 0
    q_head_dim: int = 0
    o_head_dim: int = 0
    quant: WeightQuant = field(default_factory=WeightQuant)


@dataclass(frozen=True)
class WeightsLayout:
    """Where a GGUF's tensor bytes sit, in llama.cpp's layers (src/llama-arch.cpp LLM_TENSOR_INFOS
    gives each tensor its layer: input, repeating or output).

    `layer_bytes[i]` is block i's tensors (`blk.i.*`); `input_bytes` the input layer's (token
    embeddings and their norm, position embeddings: always on the CPU) and of names llama.cpp's
    table does not list (counted there too); `output_bytes` the output layer's own tensors (the
    output norm, the head); `head_copy_bytes`, for a model whose head is tied to its token
    embeddings, the copy of them llama.cpp loads as the head on the output layer's device (0
    when untied; on the CPU it is the embeddings' own mapped bytes); `per_layer_copy_bytes`
    what every repeating layer's device holds a copy of (rope_freqs, rope_factors_*: created
    once per layer with TENSOR_DUPLICATED).
    """

    layer_bytes: tuple[int, ...]
    input_bytes: int = 0
    output_bytes: int = 0
    per_layer_copy_bytes: int = 0
    head_copy_bytes: int = 0


@dataclass(frozen=True)
class ModelShape:
    """What sizes a model's memory and decides its tensor parallel.

    `attention_heads` and `kv_heads` are the counts tensor parallel must split (`kv_heads` is
    the largest over attention layers). `trained_context` and `weights_bytes` are 0 when not
    known. `kv_dtype_bytes` is the cache element size at the model's own dtype (2 for
    f16/bf16). `notes` say what the reader noticed (an ignored window, a placeholder context).
    """

    architecture: str
    layers: tuple[Layer, ...]
    attention_heads: int
    kv_heads: int
    trained_context: int = 0
    weights_bytes: int = 0
    kv_dtype_bytes: int = 2
    format: str = "inline"
    notes: tuple[str, ...] = field(default_factory=tuple)
    mla_expanded: tuple[int, int] | None = None
    """For an MLA model: the (key, value) head dims of its decompressed heads, for engines that
    expand it (e.g. an old-format llama.cpp file)."""
    compute: Compute | None = None
    """Widths the engines' activation peaks follow (None: not read)."""
    parallel: ParallelDims = field(default_factory=ParallelDims)
    """What tensor parallel splits besides the attention heads (`engines.heads`)."""
    weights_layout: WeightsLayout | None = None
    """A GGUF's tensor bytes by llama.cpp layer (None: not read; weights are then spread evenly)."""

    distinct_layers: tuple[tuple[Layer, int], ...] = field(init=False, compare=False, repr=False)
    """Each distinct layer geometry (first appearance first) and how many layers have it."""
    has_recurrent: bool = field(init=False, compare=False, repr=False)
    """Whether some layer keeps recurrent state (a hybrid or recurrent model)."""

    def __post_init__(self) -> None:
        # Models repeat a few layer geometries many times: share one object per geometry, so
        # per-layer sizing can remember each by identity instead of hashing every layer.
        shared: dict[Layer, Layer] = {}
        by_id: dict[int, Layer] = {}
        counts: dict[int, int] = {}
        layers = []
        for la in self.layers:
            one = by_id.get(id(la))
            if one is None:
                one = by_id[id(la)] = shared.setdefault(la, la)
            layers.append(one)
            counts[id(one)] = counts.get(id(one), 0) + 1
        object.__setattr__(self, "layers", tuple(layers))
        distinct = {id(la): la for la in layers}
        object.__setattr__(
            self, "distinct_layers", tuple((la, counts[i]) for i, la in distinct.items())
        )
        object.__setattr__(
            self, "has_recurrent", any(la.kind is LayerKind.RECURRENT for la in layers)
        )

    @property
    def block_count(self) -> int:
        """Number of layers."""
        return len(self.layers)

    @property
    def head_dim_k(self) -> int:
        """The key head size of the first layer with KV (0 when none has)."""
        return next((la.head_dim_k for la in self.layers if la.has_kv), 0)

    @property
    def head_dim_v(self) -> int:
        """The value head size of the first layer with KV (0 when none has)."""
        return next((la.head_dim_v for la in self.layers if la.has_kv), 0)

    @property
    def sliding_window(self) -> int:
        """The largest window of a sliding layer (0 when none slides)."""
        return max(
            (la.window_tokens for la in self.layers if la.kind is LayerKind.SLIDING), default=0
        )

    def kv_bytes_per_token(self) -> int:
        """What one more token adds to the cache at the model's dtype, past every window."""
        return sum(
            la.kv_heads * (la.head_dim_k + la.head_dim_v) * self.kv_dtype_bytes
            + indexer_token_bytes(la.indexer_dim)
            for la in self.layers
            if la.has_kv and la.kind is not LayerKind.SLIDING
        )

    def kv_bytes_fixed(self) -> int:
        """Sliding layers' cache at their full window, per sequence, at the model's dtype."""
        return sum(
            la.window_tokens * la.kv_heads * (la.head_dim_k + la.head_dim_v) * self.kv_dtype_bytes
            for la in self.layers
            if la.has_kv and la.kind is LayerKind.SLIDING
        )

    def state_bytes_per_sequence(self) -> int:
        """Recurrent state of one sequence over all layers."""
        return sum(la.state_bytes for la in self.layers)
