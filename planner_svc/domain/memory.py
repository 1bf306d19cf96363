"""Memory: what a replica of a model needs on each card, and a CPU profile's RAM.

Every figure is in bytes. The card's share of the weights and KV cache, the engine's
overheads and its budget are the engine's (llmgw.engines, each engine's module citing where
its constants come from); this module checks the request and asks the registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from llmgw.engines import registry
from llmgw.engines.base import CardNeed, SizingRequest
from llmgw.engines.kvcache import CachePool, layer_bytes_on_card
from llmgw.shape import ModelShape
from planner_svc.domain import errors
from planner_svc.domain.kvcache import check_pool, kv_bytes_per_token_per_card, kv_cache_bytes

__all__ = [
    "CardNeed",
    "RamNeed",
    "SizingRequest",
    "cache_dtype_bytes",
    "card_need",
    "kv_bytes_per_token_per_card",
    "kv_cache_bytes",
    "ram_need",
    "ram_need_bytes",
    "tensor_parallel",
]

RAM_RESERVE_BYTES = 1 << 30
RAM_WEIGHTS_SHARE = 20
"""A CPU profile's RAM: weights + KV + 1 GiB + weights / 20 (the reference's resizeProfile,
DESIGN §5)."""


def cache_dtype_bytes(engine: str, args: Sequence[str], shape: ModelShape) -> Fraction:
    """Bytes of one cached K or V element for an engine and its arguments.

    Returns:
        The element size, exact (SGLang's fp4 is 9/16 of a byte with its scales).
    Raises:
        UnknownEngine: the engine is not known.
        EngineRefuses: the engine does not accept the value, or the planner does not size it.
    """
    return registry.get(engine).cache_dtype_bytes(args, shape)


def tensor_parallel(engine: str, args: Sequence[str], cards: int) -> tuple[int, int]:
    """The (tensor, pipeline) parallel sizes a replica on `cards` cards runs with (0: the
    arguments decide).

    Raises:
        UnknownEngine, EngineRefuses (a tp or pp flag that is not a positive whole number),
        InvalidRequest (a negative card count).
    """
    if cards < 0:
        raise errors.InvalidRequest(f"a replica needs at least one card, not {cards}", field="gpus")
    return registry.get(engine).tensor_parallel(args, cards)


def card_need(engine: str, shape: ModelShape, asked: SizingRequest) -> CardNeed:
    """What a replica of `engine` serving `shape` needs on each of its cards, for what `asked`
    says (`SizingRequest`: the arguments set for its context and card count, tokens, slots,
    cards, the card and the engine version).

    Raises:
        UnknownEngine, EngineRefuses (arguments the engine refuses), EngineSingleCard,
        InvalidRequest (negative numbers).
    """
    found = registry.get(engine)
    tokens, slots, cards, memory = asked.tokens, asked.slots, asked.cards, asked.card_memory_bytes
    if tokens < 0 or slots < 0 or memory < 0 or cards < 0:
        raise errors.InvalidRequest(
            f"tokens ({tokens}), slots ({slots}), cards ({cards}) and card memory "
            f"({memory}) cannot be negative",
            field="tokens"
            if tokens < 0
            else "slots"
            if slots < 0
            else "gpus"
            if cards < 0
            else "inventory",
        )
    return found.card_need(shape, asked)


@dataclass(frozen=True)
class RamNeed:
    """A CPU profile's RAM, broken down like a card: weights, KV (and recurrent state), and
    the rest (the 1 GiB reserve and 5 % of the weights)."""

    weights_bytes: int
    kv_bytes: int
    other_bytes: int

    @property
    def total_bytes(self) -> int:
        """All of it."""
        return self.weights_bytes + self.kv_bytes + self.other_bytes


def ram_need(shape: ModelShape, pool_tokens: int, *, sequences: int = 1) -> RamNeed:
    """RAM a CPU profile needs: weights + the KV of `pool_tokens` (sliding layers capped at
    their window per sequence, recurrent state per sequence) + 1 GiB + 5 % of the weights
    (the reference's formula, DESIGN §5). Rounding to whole GB is `fit.ram_gb`'s.

    Raises:
        InvalidRequest: a negative pool or fewer than one sequence.
    """
    check_pool(pool_tokens, sequences, 1)
    pool = CachePool(pool_tokens, sequences)
    kv = sum(layer_bytes_on_card(shape, pool, tp=1, dtype=Fraction(shape.kv_dtype_bytes)))
    w = shape.weights_bytes
    return RamNeed(w, kv, RAM_RESERVE_BYTES + w // RAM_WEIGHTS_SHARE)


def ram_need_bytes(shape: ModelShape, pool_tokens: int, *, sequences: int = 1) -> int:
    """The whole of `ram_need`.

    Raises:
        InvalidRequest: a negative pool or fewer than one sequence.
    """
    return ram_need(shape, pool_tokens, sequences=sequences).total_bytes
