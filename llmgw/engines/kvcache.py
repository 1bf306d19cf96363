"""The KV cache layer by layer, as every engine lays it out: what a token costs each card, and
how many tokens a pool keeps in each layer (engines refine `CachePool` for sliding layers).

Under tensor parallel each card holds ceil(kv_heads / tp) heads; an MLA latent is whole on
every card.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from llmgw.engines.memo import sizing_memo
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
    return _costs(shape, tp, dtype).token_bytes


@dataclass(frozen=True)
class _LayerCosts:
    """Per distinct layer of a shape, for one tensor parallel size and cache type: a token's
    bytes on a card as the exact fraction num / den (0 / 1 for a layer without KV) and the
    recurrent state per sequence on a card; `token_bytes` the ceiling of their sum."""

    layers: tuple[tuple[Layer, int, int, int], ...]
    token_bytes: int


_COSTS_KEPT = 64
"""Settings remembered per shape (tensor parallel sizes x cache types asked of it)."""


def _costs(shape: ModelShape, tp: int, dtype: Fraction) -> _LayerCosts:
    """Per distinct layer, what a token and a sequence cost on one of `tp` cards: worked out
    once per shape and setting (a context changes none of it), so sizing a context multiplies
    integers instead of summing Fractions."""
    # The cache type by its exact numerator and denominator: a Fraction's own hash costs a
    # modular inverse, asked twice a sizing.
    key = ("kv", tp, dtype.numerator, dtype.denominator)
    memo = sizing_memo(shape)
    hit = memo.get(key)
    if isinstance(hit, _LayerCosts):
        return hit
    rows = []
    total = Fraction(0)
    for layer, count in shape.distinct_layers:
        num, den = 0, 1
        if layer.has_kv:
            per_token = Fraction(token_bytes(layer, tp, dtype))
            num, den = per_token.numerator, per_token.denominator
            total += per_token * count
        rows.append((layer, num, den, -(-layer.state_bytes // tp)))
    costs = _LayerCosts(tuple(rows), math.ceil(total))
    if len(memo) >= _COSTS_KEPT:
        memo.clear()
    memo[key] = costs
    return costs


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
    # Each distinct layer sized once (ModelShape shares one object per geometry), exactly:
    # ceil(held x num / den) in integers.
    sequences = pool.sequences
    sized = {
        id(layer): (-(-pool.held(layer) * num // den) if num else 0) + sequences * state
        for layer, num, den, state in _costs(shape, tp, dtype).layers
    }
    return [sized[id(layer)] for layer in shape.layers]


def fullest_stage(per_layer: list[int], stages: int) -> int:
    """The largest sum over `stages` runs of consecutive layers of ceil(layers / stages)."""
    if stages <= 1 or not per_layer:
        return sum(per_layer)
    size = -(-len(per_layer) // stages)
    return max(sum(per_layer[i : i + size]) for i in range(0, len(per_layer), size))


def stage_counts(shape: ModelShape, stages: int) -> tuple[tuple[int, ...], ...]:
    """Per pipeline stage (runs of ceil(layers / stages) consecutive layers, as
    `fullest_stage` cuts them; one stage when `stages` <= 1), how many of its layers have each
    distinct geometry, in `shape.distinct_layers`' order: worked out once per shape and stage
    count."""
    key = ("stages", max(stages, 1))
    memo = sizing_memo(shape)
    hit = memo.get(key)
    if isinstance(hit, tuple):
        return hit
    index = {id(layer): i for i, (layer, _) in enumerate(shape.distinct_layers)}
    layers = shape.layers
    size = -(-len(layers) // stages) if stages > 1 and layers else max(len(layers), 1)
    counts = []
    for start in range(0, max(len(layers), 1), size):
        row = [0] * len(index)
        for layer in layers[start : start + size]:
            row[index[id(layer)]] += 1
        counts.append(tuple(row))
    found = tuple(counts)
    if len(memo) >= _COSTS_KEPT:
        memo.clear()
    memo[key] = found
    return found


def layer_costs(
    shape: ModelShape, tp: int, dtype: Fraction
) -> tuple[tuple[Layer, int, int, int], ...]:
    """Per distinct layer of `shape` (in `distinct_layers`' order): the layer, what a token
    adds to it on one of `tp` cards as the exact fraction num / den (0 / 1 without KV), and
    its recurrent state per sequence on a card."""
    return _costs(shape, tp, dtype).layers
