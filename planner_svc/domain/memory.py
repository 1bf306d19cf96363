"""Memory: what a replica of a model needs on each card, engine by engine.

Every figure is in bytes: a card's share of the weights and of the KV cache (`kvcache.py`)
plus the engine's own overheads, against the budget its memory fraction leaves. Each
constant names where it comes from: an engine's source file, its documented default, or a
ground-truth row (tests/fixtures/ground_truth/observations.jsonl, "gt-NNN").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from llmgw.shape import LayerKind, ModelShape
from planner_svc.domain import args as argv
from planner_svc.domain import errors
from planner_svc.domain.engine_memory import (
    GIB,
    MIB,
    TRTLLM_FREE_FRACTION,
    TRTLLM_MAX_NUM_TOKENS,
    VLLM_UTILISATION,
    EngineMemory,
    cache_dtype_bytes,
    count_arg,
    engine_memory,
    fraction_arg,
    tensor_parallel,
    vllm_batched_tokens,
)
from planner_svc.domain.engines import CardSplit
from planner_svc.domain.kvcache import (
    CachePool,
    cache_pool,
    check_pool,
    kv_bytes_per_token_per_card,
    kv_cache_bytes,
    layer_bytes_on_card,
    llamacpp_args,
    sglang_available_kv_bytes,
    sglang_token_capacity,
    trtllm_token_capacity,
    vllm_token_capacity,
)
from planner_svc.domain.llamacpp import llamacpp_kv_bytes, llamacpp_overhead_bytes

__all__ = [
    "CardNeed",
    "EngineMemory",
    "cache_dtype_bytes",
    "card_need",
    "engine_memory",
    "kv_bytes_per_token_per_card",
    "kv_cache_bytes",
    "ram_need_bytes",
    "sglang_available_kv_bytes",
    "sglang_mem_fraction_static",
    "sglang_token_capacity",
    "tensor_parallel",
    "trtllm_overhead_bytes",
    "trtllm_token_capacity",
    "vllm_overhead_bytes",
    "vllm_token_capacity",
]

ACTIVATION_BYTES_PER_TOKEN_WIDTH = 32
"""Activation peak per profiled token per unit of model width (attention heads × head dim).
gt-023/024 (vLLM V0, Llama-3.1-8B, width 4096, profile = max_model_len): the peak grew 0.92
GiB from 20000 to 29000 tokens, 26.8 B per token per unit; rounded up."""

SAMPLER_BYTES = GIB
"""The part of the activation peak that does not scale with tokens (sampler over
max_num_seqs dummy requests, logits): gt-038 (vLLM V1, Qwen2.5-7B, 2048 batched tokens)
peaked at 1.04 GiB of which about 0.82 is beyond the per-token term; rounded up."""

NON_TORCH_BYTES = 512 * MIB
"""CUDA context, NCCL and allocator memory outside torch: 0.35 GiB in gt-023, 0.25 in gt-028,
0.21 in gt-039, 0.06 in gt-038; rounded up."""

CUDA_GRAPH_BYTES_PER_LAYER = 40 * MIB
"""CUDA graph memory per decoder layer on a card: gt-039 3.45 GiB over 94 layers (37.6 MiB),
gt-036 0.72 over 40 (18.4), gt-038 0.48 over 28 (17.6), gt-049 (SGLang) 0.93 over 64;
rounded up from the largest. vLLM >= 0.21 subtracts its estimate from the budget
(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS on by default)."""


SGLANG_PRELOAD_BYTES = GIB
"""Memory in use before SGLang measures the free memory its fraction applies to (CUDA
context, NCCL): gt-049 saw 21.63 GiB free of an L4's 22.49 (23034 MiB), 0.86 GiB; rounded up."""

# SGLang's default --mem-fraction-static (server_args.py, _handle_gpu_memory_settings): card
# memory in MiB less a reserve of 512 MiB of metadata + 1.5 MiB per chunked-prefill token
# + 2 MiB per CUDA-graph batch size + 1024 MiB per 8 ranks, at least 10240 MiB on cards
# over 60 GiB, plus 2048 MiB for EAGLE drafts (6144 for a standalone draft).
SGLANG_RESERVE_BASE_MIB = 512
SGLANG_RESERVE_PER_CHUNK_TOKEN_MIB = 1.5
SGLANG_RESERVE_PER_GRAPH_BS_MIB = 2
SGLANG_RESERVE_PER_8_RANKS_MIB = 1024
SGLANG_RESERVE_FLOOR_MIB = 10240
SGLANG_RESERVE_FLOOR_ABOVE_MIB = 60 * 1024
SGLANG_RESERVE_EAGLE_MIB = 2048
SGLANG_RESERVE_STANDALONE_MIB = 6144
SGLANG_MAX_PREFILL_TOKENS = 16384
"""`--max-prefill-tokens` default, used in the reserve when chunked prefill is off."""

# (cards up to this many MiB, chunked-prefill size, CUDA-graph max bs below tp 4, at tp >= 4)
SGLANG_GPU_BUCKETS: tuple[tuple[float, int, int, int], ...] = (
    (20 * 1024, 2048, 8, 8),
    (35 * 1024, 2048, 24, 80),
    (60 * 1024, 4096, 32, 160),
    (90 * 1024, 8192, 256, 512),
    (160 * 1024, 8192, 256, 512),
    (math.inf, 16384, 512, 512),
)


# --- llama.cpp and one-card engines -----------------------------------------------------

LLAMACPP_RESERVE_BYTES = 1024 * MIB
"""What a llama-server card keeps free: `--fit-target` "target margin per device ...
default: 1024" MiB (llama-server --help, quoted in ggml-org/llama.cpp#18390)."""

SINGLE_CARD_RESERVE_BYTES = GIB
"""What an embeddings server's card keeps for the CUDA context and runtime (gt-049: 0.86 GiB
in use before loading); rounded up."""

# --- CPU --------------------------------------------------------------------------------

RAM_RESERVE_BYTES = GIB
RAM_WEIGHTS_SHARE = 20
"""A CPU profile's RAM: weights + KV + 1 GiB + weights / 20 (the reference's resizeProfile,
DESIGN §5)."""

FALLBACK_WIDTH = 4096
"""Model width assumed for activations when the shape has no attention heads (recurrent
models): a 7-8B model's hidden size."""

MLA_VALUE_HEAD_DIM = 128
"""Value head size of DeepSeek-style MLA when the shape does not carry its expanded dims
(DeepSeek-V2/V3 v_head_dim, models/hf INDEX)."""


# --- overheads and budgets --------------------------------------------------------------


def _activation_width(shape: ModelShape) -> int:
    """The model's width for activations: attention heads × head size (the hidden size of
    most models, more for Qwen3 and gpt-oss; MLA counts its value heads)."""
    for layer in shape.layers:
        if shape.attention_heads <= 0:
            break
        if layer.kind is LayerKind.MLA:
            value_dim = shape.mla_expanded[1] if shape.mla_expanded else MLA_VALUE_HEAD_DIM
            return shape.attention_heads * value_dim
        if layer.has_kv:
            return shape.attention_heads * max(layer.head_dim_k, layer.head_dim_v)
    return FALLBACK_WIDTH


def _torch_overhead(shape: ModelShape, *, batch_tokens: int, layers: int, eager: bool) -> int:
    """Activation peak of a `batch_tokens` forward pass + non-torch memory + CUDA graphs of
    `layers` layers (none when `eager`)."""
    activation = batch_tokens * _activation_width(shape) * ACTIVATION_BYTES_PER_TOKEN_WIDTH
    graphs = 0 if eager else layers * CUDA_GRAPH_BYTES_PER_LAYER
    return activation + SAMPLER_BYTES + NON_TORCH_BYTES + graphs


def vllm_overhead_bytes(
    shape: ModelShape, args: Sequence[str], *, tokens: int, pp: int, card_memory_bytes: int
) -> int:
    """What a vLLM card needs beside weights and KV, inside its utilisation budget.

    The profile run's activation peak over `--max-num-batched-tokens` (with chunked prefill,
    V1's default; without it, over max(batched tokens, the context), as gt-023/024 show),
    non-torch memory, and CUDA graphs (none with `--enforce-eager`). Monotonic in `tokens`.
    """
    rules = engine_memory("vllm")
    batched = vllm_batched_tokens(rules, args, card_memory_bytes)
    if argv.has_flag(args, ("--no-enable-chunked-prefill",)):
        batched = max(batched, tokens)
    layers = -(-shape.block_count // max(pp, 1))
    eager = argv.has_flag(args, ("--enforce-eager",))
    return _torch_overhead(shape, batch_tokens=batched, layers=layers, eager=eager)


def trtllm_overhead_bytes(shape: ModelShape, args: Sequence[str], *, pp: int) -> int:
    """What a TensorRT-LLM card needs beside weights and KV before its free fraction applies:
    the profiling pass over `--max_num_tokens` tokens, non-torch memory and CUDA graphs,
    with the constants measured on vLLM (both run the model in PyTorch)."""
    rules = engine_memory("trtllm")
    batched = count_arg(rules, args, ("--max_num_tokens",)) or TRTLLM_MAX_NUM_TOKENS
    layers = -(-shape.block_count // max(pp, 1))
    return _torch_overhead(shape, batch_tokens=batched, layers=layers, eager=False)


def sglang_mem_fraction_static(
    card_memory_bytes: int, args: Sequence[str], *, tp: int, pp: int
) -> float:
    """SGLang's `--mem-fraction-static`: the flag, else the default SGLang derives from the
    card's memory (server_args.py _handle_gpu_memory_settings): (card − reserve) / card,
    rounded to 3 places; 0.88 when the card's memory is not known.
    """
    rules = engine_memory("sglang")
    given = fraction_arg(rules, args, rules.utilisation_flags)
    if given is not None:
        return given
    if card_memory_bytes <= 0:
        return 0.88
    gpu_mib = card_memory_bytes / MIB
    _, chunk_default, graphs_small, graphs_large = next(
        b for b in SGLANG_GPU_BUCKETS if gpu_mib < b[0]
    )
    chunk = count_arg(rules, args, ("--chunked-prefill-size",), minimum=-1) or chunk_default
    graphs = count_arg(rules, args, ("--cuda-graph-max-bs",)) or (
        graphs_small if tp < 4 else graphs_large
    )
    prefill = count_arg(rules, args, ("--max-prefill-tokens",)) or SGLANG_MAX_PREFILL_TOKENS
    reserved = SGLANG_RESERVE_BASE_MIB + SGLANG_RESERVE_PER_CHUNK_TOKEN_MIB * max(
        chunk if chunk > 0 else prefill, 2048
    )
    reserved += graphs * SGLANG_RESERVE_PER_GRAPH_BS_MIB
    reserved += tp * pp / 8 * SGLANG_RESERVE_PER_8_RANKS_MIB
    if gpu_mib > SGLANG_RESERVE_FLOOR_ABOVE_MIB:
        reserved = max(reserved, SGLANG_RESERVE_FLOOR_MIB)
    draft = (argv.get_arg(args, ("--speculative-algorithm",)) or "").upper()
    if draft == "STANDALONE":
        reserved += SGLANG_RESERVE_STANDALONE_MIB
    elif draft and draft != "NGRAM":
        reserved += SGLANG_RESERVE_EAGLE_MIB
    return round((gpu_mib - reserved) / gpu_mib, 3)


# --- what a replica needs on its cards --------------------------------------------------


@dataclass(frozen=True)
class CardNeed:
    """What one replica needs on its cards and what the fullest card may use.

    `weights_bytes` and `kv_bytes` are the whole replica's; `per_card_bytes` is the fullest
    card's share of weights and KV plus `overhead_bytes` (activations, CUDA graphs, runtime),
    to compare with `budget_bytes` (0 when the card's memory is not known).
    """

    weights_bytes: int
    kv_bytes: int
    per_card_bytes: int
    overhead_bytes: int
    budget_bytes: int
    cards: int
    weights_per_card_bytes: int = 0
    kv_per_card_bytes: int = 0

    @property
    def fits(self) -> bool:
        """Whether the fullest card holds it (an unknown budget is taken as room)."""
        return self.budget_bytes <= 0 or self.per_card_bytes <= self.budget_bytes


def _fullest_stage(per_layer: Sequence[int], stages: int) -> int:
    """The largest sum over `stages` runs of consecutive layers of ceil(layers / stages)."""
    if stages <= 1 or not per_layer:
        return sum(per_layer)
    size = -(-len(per_layer) // stages)
    return max(sum(per_layer[i : i + size]) for i in range(0, len(per_layer), size))


def card_need(
    engine: str,
    shape: ModelShape,
    *,
    args: Sequence[str],
    tokens: int,
    slots: int,
    cards: int,
    card_memory_bytes: int,
) -> CardNeed:
    """What a replica of `engine` serving `shape` needs on each of its cards.

    vLLM, SGLang and TensorRT-LLM split every layer over tp cards (pipeline stages over pp):
    a card holds ceil(weights / cards) and its heads' KV, plus the engine's overhead; the
    budget is the card × `--gpu-memory-utilization` (vLLM), × `--mem-fraction-static`
    (SGLang, whose activations and graphs live outside it), or what leaves the KV cache its
    free fraction of the memory after weights and activations (TensorRT-LLM:
    f × card + (1 − f) × (weights + overhead)). llama.cpp splits whole layers: the fullest card
    holds ceil(offloaded layers / cards) of them, its budget the card less
    `LLAMACPP_RESERVE_BYTES`. One-card engines hold their weights.

    Args:
        engine: the engine's name (aliases as `engines.engine_named`).
        shape: the model's shape.
        args: the engine's arguments, set for this context and card count.
        tokens: one request's context (llama.cpp: per slot).
        slots: requests held at full length at once (llama.cpp's `--parallel`; 1 elsewhere).
        cards: cards of one replica (0: from the arguments).
        card_memory_bytes: one card's memory; 0 when not known (budget 0).
    Raises:
        UnknownEngine, EngineRefuses (arguments the engine refuses), EngineSingleCard,
        InvalidRequest (negative numbers).
    """
    rules = engine_memory(engine)
    if tokens < 0 or slots < 0 or card_memory_bytes < 0:
        raise errors.InvalidRequest(
            f"tokens ({tokens}), slots ({slots}) and card memory ({card_memory_bytes}) "
            "cannot be negative",
            field="tokens" if tokens < 0 else "slots" if slots < 0 else "inventory",
        )
    sequences = max(slots, 1)
    if rules.single_card:
        if cards > 1:
            raise errors.EngineSingleCard(
                f"{rules.engine.name} runs on one card only, not {cards}: serve it on one",
                engine=rules.engine.name,
            )
        budget = max(card_memory_bytes - SINGLE_CARD_RESERVE_BYTES, 1) if card_memory_bytes else 0
        w = shape.weights_bytes
        return CardNeed(w, 0, w, 0, budget, 1, weights_per_card_bytes=w)
    if rules.engine.split is CardSplit.LAYER_SPLIT:
        return _llamacpp_need(
            shape, args, tokens=tokens, sequences=sequences, cards=cards, card=card_memory_bytes
        )
    tp, pp = tensor_parallel(engine, args, cards)
    dtype = cache_dtype_bytes(engine, args, shape)
    pool = cache_pool(
        engine,
        args,
        tokens=tokens * sequences,
        sequences=sequences,
        card_memory_bytes=card_memory_bytes,
    )
    per_layer = layer_bytes_on_card(shape, pool, tp=tp, dtype=dtype)
    kv_card = _fullest_stage(per_layer, pp)
    weights_card = -(-shape.weights_bytes // (tp * pp))
    card = card_memory_bytes
    if rules.engine.name == "vllm":
        overhead = vllm_overhead_bytes(shape, args, tokens=tokens, pp=pp, card_memory_bytes=card)
        util = fraction_arg(rules, args, rules.utilisation_flags) or VLLM_UTILISATION
        budget = int(card * util)
    elif rules.engine.name == "sglang":
        mfs = sglang_mem_fraction_static(card, args, tp=tp, pp=pp)
        # Its fraction applies to the memory free before loading, the preload already gone.
        overhead = math.ceil(mfs * SGLANG_PRELOAD_BYTES)
        budget = int(card * mfs)
    else:
        overhead = trtllm_overhead_bytes(shape, args, pp=pp)
        free = fraction_arg(rules, args, rules.utilisation_flags) or TRTLLM_FREE_FRACTION
        budget = int(free * card + (1 - free) * (weights_card + overhead))
    return CardNeed(
        weights_bytes=shape.weights_bytes,
        kv_bytes=sum(per_layer) * tp,
        per_card_bytes=weights_card + kv_card + overhead,
        overhead_bytes=overhead,
        budget_bytes=budget if card > 0 else 0,
        cards=tp * pp,
        weights_per_card_bytes=weights_card,
        kv_per_card_bytes=kv_card,
    )


def _gpu_layers(shape: ModelShape, args: Sequence[str]) -> int:
    """Layers llama-server offloads: `--n-gpu-layers`, all when absent, "all"/"auto" or
    more than the model has."""
    raw = argv.get_arg(args, ("--n-gpu-layers", "--gpu-layers", "-ngl"))
    try:
        n = int(raw) if raw is not None else -1
    except ValueError:
        n = -1
    return shape.block_count if n < 0 or n > shape.block_count else n


def _llamacpp_need(
    shape: ModelShape, args: Sequence[str], *, tokens: int, sequences: int, cards: int, card: int
) -> CardNeed:
    """llama.cpp's layer split: the last `--n-gpu-layers` layers over `cards` cards, the
    fullest holding ceil(offloaded / cards) layers' weights and KV (llama.cpp offloads the
    last layers first). The whole cache is `llamacpp_kv_bytes`; a card's share of it is its
    layers' share of the cache by this module's per-layer rule."""
    n = max(cards, 1)
    full_args = llamacpp_args(args, tokens=tokens * sequences, sequences=sequences)
    kv_total = llamacpp_kv_bytes(shape, full_args)
    layers = shape.block_count
    offloaded = _gpu_layers(shape, args)
    per_layer = layer_bytes_on_card(
        shape,
        CachePool("llamacpp", tokens * sequences, sequences),
        tp=1,
        dtype=Fraction(shape.kv_dtype_bytes),
    )
    on_gpus = per_layer[layers - offloaded :]
    fullest = _fullest_stage(on_gpus, n)
    total = sum(per_layer)
    layers_card = -(-offloaded // n)
    kv_card = -(-kv_total * fullest // total) if total else 0
    weights_card = -(-shape.weights_bytes * layers_card // layers) if layers else 0
    overhead = llamacpp_overhead_bytes(shape, full_args, n)
    return CardNeed(
        weights_bytes=shape.weights_bytes,
        kv_bytes=kv_total,
        per_card_bytes=weights_card + kv_card + overhead,
        overhead_bytes=overhead,
        budget_bytes=max(card - LLAMACPP_RESERVE_BYTES, 1) if card > 0 else 0,
        cards=n,
        weights_per_card_bytes=weights_card,
        kv_per_card_bytes=kv_card,
    )


def ram_need_bytes(shape: ModelShape, pool_tokens: int, *, sequences: int = 1) -> int:
    """RAM a CPU profile needs: weights + the KV of `pool_tokens` (sliding layers capped at
    their window per sequence, recurrent state per sequence) + 1 GiB + 5 % of the weights
    (the reference's formula, DESIGN §5). Rounding to whole GB is `fit.ram_gb`'s.

    Raises:
        InvalidRequest: a negative pool or fewer than one sequence.
    """
    check_pool(pool_tokens, sequences, 1)
    pool = CachePool("cpu", pool_tokens, sequences)
    kv = sum(layer_bytes_on_card(shape, pool, tp=1, dtype=Fraction(shape.kv_dtype_bytes)))
    w = shape.weights_bytes
    return w + kv + RAM_RESERVE_BYTES + w // RAM_WEIGHTS_SHARE
