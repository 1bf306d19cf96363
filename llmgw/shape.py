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

    def __post_init__(self) -> None:
        # Models repeat a few layer geometries many times: share one object per geometry, so
        # per-layer sizing can remember each by identity instead of hashing every layer.
        shared: dict[Layer, Layer] = {}
        by_id: dict[int, Layer] = {}
        layers = []
        for la in self.layers:
            one = by_id.get(id(la))
            if one is None:
                one = by_id[id(la)] = shared.setdefault(la, la)
            layers.append(one)
        object.__setattr__(self, "layers", tuple(layers))

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
