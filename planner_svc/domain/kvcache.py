"""The KV cache each engine allocates: per layer and card, and the tokens a memory holds.

vLLM keeps paged blocks (sliding layers capped by its hybrid allocator), SGLang a token pool
(sliding layers a share of it), TensorRT-LLM full-width blocks, llama.cpp its cells through
`llamacpp.py`. Under tensor parallel each card holds ceil(kv_heads / tp) heads; an MLA latent
is whole on every card.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from llmgw.shape import Layer, LayerKind, ModelShape
from planner_svc.domain import args as argv
from planner_svc.domain import errors
from planner_svc.domain.engine_memory import (
    SGLANG_SWA_FULL_TOKENS_RATIO,
    TRTLLM_TOKENS_PER_BLOCK,
    VLLM_BATCHED_TOKENS_LARGE_CARD,
    VLLM_BLOCK_TOKENS,
    cache_dtype_bytes,
    count_arg,
    engine_memory,
    fraction_arg,
    vllm_batched_tokens,
)
from planner_svc.domain.engines import LLAMACPP, CardSplit
from planner_svc.domain.llamacpp import llamacpp_kv_bytes

# --- KV per layer -----------------------------------------------------------------------


def _heads_on_card(layer: Layer, tp: int) -> int:
    """KV heads one card holds: an MLA latent whole on every card, otherwise
    ceil(kv_heads / tp) (heads replicated when tp > kv_heads)."""
    if layer.kind is LayerKind.MLA:
        return layer.kv_heads
    return -(-layer.kv_heads // tp)


def _token_bytes(layer: Layer, tp: int, dtype: Fraction) -> Fraction:
    """What one token adds to this layer's cache on one card."""
    return _heads_on_card(layer, tp) * (layer.head_dim_k + layer.head_dim_v) * dtype


def _ceil_to(n: int, step: int) -> int:
    """`n` rounded up to a multiple of `step`."""
    return -(-n // step) * step


@dataclass(frozen=True)
class CachePool:
    """What decides how many tokens each layer's cache holds, for one engine."""

    engine: str
    tokens: int
    sequences: int
    block: int = 1
    batched_tokens: int = VLLM_BATCHED_TOKENS_LARGE_CARD
    swa_ratio: float | None = SGLANG_SWA_FULL_TOKENS_RATIO

    def held(self, layer: Layer) -> int:
        """Tokens the layer's cache holds over all sequences.

        vLLM: whole blocks; a sliding layer holds, per sequence, the window plus a batch of
        scheduled tokens in blocks, plus one (SlidingWindowSpec.max_memory_usage_bytes).
        SGLang: a sliding layer's pool is `swa_ratio` of the full pool (hybrid SWA), or all
        of it with `--disable-hybrid-swa-memory`. TensorRT-LLM: every layer at full length
        (gt-052). Others: min(tokens, window) per sequence.
        """
        per_seq = -(-self.tokens // self.sequences)
        full = self.sequences * _ceil_to(per_seq, self.block) if self.block > 1 else self.tokens
        if layer.kind is not LayerKind.SLIDING:
            return full
        if self.engine == "vllm":
            span = min(layer.window_tokens - 1 + self.batched_tokens, per_seq)
            return self.sequences * (_ceil_to(span, self.block) + self.block)
        if self.engine == "sglang":
            ratio = 1.0 if self.swa_ratio is None else self.swa_ratio
            return _ceil_to(math.ceil(self.tokens * ratio), self.block)
        if self.engine == "trtllm":
            return full
        return self.sequences * min(per_seq, layer.window_tokens)


def cache_pool(
    engine: str,
    args: Sequence[str],
    *,
    tokens: int,
    sequences: int,
    card_memory_bytes: int = 0,
) -> CachePool:
    """The pool rules of `engine` with its arguments (`card_memory_bytes` picks vLLM's
    batched-token default; 0 takes the larger)."""
    rules = engine_memory(engine)
    name = rules.engine.name
    if name == "vllm":
        return CachePool(
            name,
            tokens,
            sequences,
            block=count_arg(rules, args, ("--block-size",)) or VLLM_BLOCK_TOKENS,
            batched_tokens=vllm_batched_tokens(rules, args, card_memory_bytes),
        )
    if name == "sglang":
        ratio = fraction_arg(rules, args, ("--swa-full-tokens-ratio",))
        hybrid = not argv.has_flag(args, ("--disable-hybrid-swa-memory",))
        return CachePool(
            name,
            tokens,
            sequences,
            block=count_arg(rules, args, ("--page-size",)) or 1,
            swa_ratio=(ratio or SGLANG_SWA_FULL_TOKENS_RATIO) if hybrid else None,
        )
    if name == "trtllm":
        return CachePool(name, tokens, sequences, block=TRTLLM_TOKENS_PER_BLOCK)
    return CachePool(name, tokens, sequences)


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
            kv = math.ceil(pool.held(layer) * _token_bytes(layer, tp, dtype)) if layer.has_kv else 0
            bytes_ = sized[id(layer)] = kv + pool.sequences * -(-layer.state_bytes // tp)
        out.append(bytes_)
    return out


def check_pool(tokens: int, sequences: int, tp: int) -> None:
    """Refuse negative pools and counts below one."""
    if tokens < 0:
        raise errors.InvalidRequest(f"a pool of {tokens} tokens is not a size", field="tokens")
    if sequences < 1:
        raise errors.InvalidRequest(f"{sequences} sequences: give at least one", field="slots")
    if tp < 1:
        raise errors.InvalidRequest(f"tensor parallel {tp}: give at least one card", field="gpus")


def llamacpp_args(args: Sequence[str], *, tokens: int, sequences: int) -> list[str]:
    """llama-server's arguments with its pool set: `--ctx-size` tokens, `--parallel` slots."""
    out = argv.set_arg(args, LLAMACPP.context_flags, str(tokens))
    return argv.set_arg(out, LLAMACPP.slots_flags, str(sequences))


def kv_cache_bytes(
    engine: str,
    shape: ModelShape,
    *,
    tokens: int,
    sequences: int,
    tp: int,
    args: Sequence[str],
) -> int:
    """The KV cache (and recurrent state) of a whole replica holding a pool of `tokens`.

    Full and MLA layers hold every token; sliding layers what the engine keeps of a window
    (`CachePool.held`); recurrent layers a state per sequence. Each of the `tp` cards holds
    ceil(kv_heads / tp) heads (an MLA latent whole), so the replica total is a card's × tp.
    llama.cpp's cache is `llamacpp.llamacpp_kv_bytes` for `--ctx-size tokens --parallel
    sequences`; one-card embedding engines keep none.

    Args:
        engine: "vllm", "sglang", "trtllm", "llamacpp" or a one-card engine.
        shape: the model's shape.
        tokens: the pool (for vLLM, SGLang and TensorRT-LLM: one request's context).
        sequences: requests the pool is shared by.
        tp: tensor parallel size.
        args: the engine's arguments (cache dtype, block and batch sizes).
    Raises:
        UnknownEngine, EngineRefuses, InvalidRequest.
    """
    check_pool(tokens, sequences, tp)
    rules = engine_memory(engine)
    if rules.engine.split is CardSplit.LAYER_SPLIT:
        return llamacpp_kv_bytes(shape, llamacpp_args(args, tokens=tokens, sequences=sequences))
    if rules.single_card:
        return 0
    dtype = cache_dtype_bytes(engine, args, shape)
    pool = cache_pool(engine, args, tokens=tokens, sequences=sequences)
    return sum(layer_bytes_on_card(shape, pool, tp=tp, dtype=dtype)) * tp


def kv_bytes_per_token_per_card(
    engine: str, shape: ModelShape, tp: int, args: Sequence[str]
) -> int:
    """What one cached token takes on one card, every KV layer at full width.

    This is the divisor each engine turns free KV memory into tokens with: vLLM's page bytes
    over all layers ÷ block size (its hybrid allocator prints sliding layers' groups at full
    width too: blocks // groups × block size), SGLang's cell size, TensorRT-LLM's "kv size"
    (no sliding discount, gt-052). Recurrent state is not per token and is left out.

    Raises:
        UnknownEngine, EngineRefuses, InvalidRequest.
    """
    check_pool(0, 1, tp)
    dtype = cache_dtype_bytes(engine, args, shape)
    return math.ceil(sum(_token_bytes(la, tp, dtype) for la in shape.layers if la.has_kv))


# --- token capacities (what each engine prints for the memory it has) ------------------


def vllm_token_capacity(
    shape: ModelShape, *, available_kv_bytes: int, tp: int, args: Sequence[str]
) -> int:
    """The "GPU KV cache size: N tokens" vLLM prints for `available_kv_bytes` on each card.

    Whole blocks: available // (page bytes of every KV layer) × block size
    (vllm/v1/core/kv_cache_utils.py); 0 when nothing is available.
    """
    if available_kv_bytes <= 0:
        return 0
    per_token = kv_bytes_per_token_per_card("vllm", shape, tp, args)
    block = cache_pool("vllm", args, tokens=0, sequences=1).block
    if per_token == 0:
        return 0
    return available_kv_bytes // (per_token * block) * block


def sglang_available_kv_bytes(
    free_before_load_bytes: int, free_after_weights_bytes: int, mem_fraction_static: float
) -> int:
    """The memory SGLang gives its KV pool: what is free after the weights less the share of
    the memory free before loading that `--mem-fraction-static` leaves out
    (model_runner_kv_cache_mixin.py profile_max_num_token)."""
    return int(free_after_weights_bytes - free_before_load_bytes * (1 - mem_fraction_static))


def sglang_token_capacity(
    shape: ModelShape, *, available_kv_bytes: int, tp: int, args: Sequence[str]
) -> int:
    """SGLang's max_total_num_tokens for `available_kv_bytes` on each card.

    available // cell size (every KV layer at full width), in whole pages; with sliding
    layers and the hybrid SWA pool, the full layers' share: tokens × layers ÷ (ratio × sliding
    + full) (set_num_tokens_hybrid_swa). 0 when nothing is available.
    """
    if available_kv_bytes <= 0:
        return 0
    cell = kv_bytes_per_token_per_card("sglang", shape, tp, args)
    if cell == 0:
        return 0
    pool = cache_pool("sglang", args, tokens=0, sequences=1)
    tokens = available_kv_bytes // cell
    kv_layers = [la for la in shape.layers if la.has_kv]
    sliding = sum(1 for la in kv_layers if la.kind is LayerKind.SLIDING)
    if sliding and pool.swa_ratio is not None:
        full = len(kv_layers) - sliding
        tokens = int(tokens * len(kv_layers) / (pool.swa_ratio * sliding + full))
    return tokens // pool.block * pool.block


def trtllm_token_capacity(
    shape: ModelShape,
    *,
    available_kv_bytes: int,
    tp: int,
    args: Sequence[str],
    tokens_per_block: int = TRTLLM_TOKENS_PER_BLOCK,
) -> int:
    """The tokens TensorRT-LLM's paged KV cache gets from `available_kv_bytes` on each card:
    available // "kv size" (every layer at full width), in whole blocks; 0 when nothing is
    available."""
    if available_kv_bytes <= 0:
        return 0
    per_token = kv_bytes_per_token_per_card("trtllm", shape, tp, args)
    if per_token == 0:
        return 0
    return available_kv_bytes // per_token // tokens_per_block * tokens_per_block
