"""The KV cache layer by layer, as every engine lays it out: what a token costs each card, and
how many tokens a pool keeps in each layer (engines refine `CachePool` for sliding layers).

Under tensor parallel each card holds ceil(kv_heads / tp) heads; an MLA latent is whole on
every card.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from llmgw.shape import Layer, LayerKind, ModelShape, indexer_token_bytes


def heads_on_card(layer: Layer, tp: int) -> int:
    """KV heads one card holds: an MLA latent whole on every card, otherwise
    ceil(kv_heads / tp) (heads replicated when tp > kv_heads)."""
    if layer.kind is LayerKind.MLA:
        return layer.kv_heads
    return -(-layer.kv_heads // tp)


def token_bytes(layer: Layer, tp: int, dtype: Fraction) -> Fraction:
    """What one token adds to this layer's cache on one card: its heads' K/V at `dtype` (or
    the engine's packed fp8 row, when the layer has one and the cache is fp8), plus what it
    caches beside them (an indexer key)."""
    if dtype == 1 and layer.fp8_token_bytes:
        kv = Fraction(layer.fp8_token_bytes)
    else:
        kv = heads_on_card(layer, tp) * (layer.head_dim_k + layer.head_dim_v) * dtype
    return kv + indexer_token_bytes(layer.indexer_dim)


def token_bytes_on_card(shape: ModelShape, tp: int, dtype: Fraction) -> int:
    """What one cached token takes on one card, every KV layer at full width (recurrent
    state is not per token and is left out)."""
    # Each distinct layer sized once, times how often it recurs (ModelShape shares one object
    # per distinct layer): exact, as the sum is of Fractions.
    counts: dict[int, tuple[Layer, int]] = {}
    for la in shape.layers:
        if la.has_kv:
            seen = counts.get(id(la))
            counts[id(la)] = (la, seen[1] + 1 if seen else 1)
    return math.ceil(sum(token_bytes(la, tp, dtype) * n for la, n in counts.values()))


def ceil_to(n: int, step: int) -> int:
    """`n` rounded up to a multiple of `step`."""
    return -(-n // step) * step


@dataclass(frozen=True)
class CachePool:
    """A pool of `tokens` shared by `sequences` requests, in blocks of `block` tokens.

    Full and MLA layers hold every token (whole blocks per sequence); a sliding layer holds,
    per sequence, at most its window. Engines whose sliding layers keep something else
    override `sliding`.
    """

    tokens: int
    sequences: int
    block: int = 1

    @property
    def per_sequence(self) -> int:
        """Tokens of one sequence (rounded up)."""
        return -(-self.tokens // self.sequences)

    def full(self) -> int:
        """Tokens a full-attention layer holds over all sequences."""
        if self.block > 1:
            return self.sequences * ceil_to(self.per_sequence, self.block)
        return self.tokens

    def sliding(self, layer: Layer) -> int:
        """Tokens a sliding layer holds over all sequences: min(tokens, window) each."""
        return self.sequences * min(self.per_sequence, layer.window_tokens)

    def held(self, layer: Layer) -> int:
        """Tokens the layer's cache holds over all sequences."""
        if layer.kind is LayerKind.SLIDING:
            return self.sliding(layer)
        return self.full()


def layer_bytes_on_card(
    shape: ModelShape, pool: CachePool, *, tp: int, dtype: Fraction
) -> list[int]:
    """Each layer's KV and recurrent state on one card (state split by tp like its heads)."""
    # Models repeat a few layer geometries many times: size each distinct layer once (the
    # Fraction arithmetic is most of a SizeContext's time otherwise).
    sized: dict[int, int] = {}  # by id: ModelShape shares one object per distinct layer
    out = []
    for layer in shape.layers:
        bytes_ = sized.get(id(layer))
        if bytes_ is None:
            kv = math.ceil(pool.held(layer) * token_bytes(layer, tp, dtype)) if layer.has_kv else 0
            bytes_ = sized[id(layer)] = kv + pool.sequences * -(-layer.state_bytes // tp)
        out.append(bytes_)
    return out


def fullest_stage(per_layer: list[int], stages: int) -> int:
    """The largest sum over `stages` runs of consecutive layers of ceil(layers / stages)."""
    if stages <= 1 or not per_layer:
        return sum(per_layer)
    size = -(-len(per_layer) // stages)
    return max(sum(per_layer[i : i + size]) for i in range(0, len(per_layer), size))
