"""Memory: what a replica of a model needs on each card, engine by engine.

Every figure is in bytes. The KV rules follow each engine's own allocator (vLLM's paged
blocks, SGLang's token pool, TensorRT-LLM's full-width blocks, llama.cpp's cells through
`llamacpp.py`); the overheads and budgets follow each engine's accounting of its memory
fraction. Each constant names where it comes from: an engine's source file, its documented
default, or a ground-truth row (tests/fixtures/ground_truth/observations.jsonl, "gt-NNN").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from planner_svc.domain import args as argv
from planner_svc.domain import errors
from planner_svc.domain.engines import CardSplit, Engine, engine_named
from planner_svc.domain.shape import Layer, LayerKind, ModelShape

MIB = 1 << 20
GIB = 1 << 30

# --- vLLM -------------------------------------------------------------------------------

VLLM_BLOCK_TOKENS = 16
"""Tokens per KV page: `--block-size` default on CUDA (vllm/config/cache.py); a page per layer
is block × kv_heads_per_rank × (head_dim_k + head_dim_v) × dtype (kv_cache_interface.py)."""

VLLM_UTILISATION = 0.90
"""`--gpu-memory-utilization` default (DESIGN §5; vllm/config/cache.py up to v0.20, whose later
docs say 0.92 with CUDA graphs subtracted; 0.90 with graphs subtracted is the safer reading)."""

VLLM_BATCHED_TOKENS_LARGE_CARD = 8192
VLLM_BATCHED_TOKENS_SMALL_CARD = 2048
VLLM_LARGE_CARD_BYTES = 70 * GIB
"""`--max-num-batched-tokens` defaults of `vllm serve`: 8192 on cards of 70 GiB or more, else
2048 (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults, OPENAI_API_SERVER). The
profile run that measures the activation peak uses this many tokens."""

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

VLLM_CACHE_DTYPES: dict[str, Fraction | None] = {
    "auto": None,
    "float16": Fraction(2),
    "bfloat16": Fraction(2),
    "fp8": Fraction(1),
    "fp8_e4m3": Fraction(1),
    "fp8_e5m2": Fraction(1),
    "fp8_inc": Fraction(1),
    "int8": Fraction(1),
}
"""`--kv-cache-dtype` values vLLM accepts (vllm/config/cache.py CacheDType) and their element
bytes; None is the model's dtype. fp8_ds_mla and the per-token-head/nvfp4 formats carry scales
the planner does not size: refused as unmodelled."""

# --- SGLang -----------------------------------------------------------------------------

SGLANG_CACHE_DTYPES: dict[str, Fraction | None] = {
    "auto": None,
    "bf16": Fraction(2),
    "bfloat16": Fraction(2),
    "fp8_e4m3": Fraction(1),
    "fp8_e5m2": Fraction(1),
    "fp4_e2m1": Fraction(9, 16),
}
"""`--kv-cache-dtype` choices of SGLang (docs/advanced_features/server_arguments.md).
fp4_e2m1 packs two elements a byte plus a 1-byte scale per 16 elements (cell // 2 +
cell / 16, model_runner_kv_cache_mixin.py get_cell_size_per_token)."""

SGLANG_SWA_FULL_TOKENS_RATIO = 0.8
"""`--swa-full-tokens-ratio` default: a sliding layer's pool holds this share of a full
layer's tokens (server_args.py; model_runner_kv_cache_mixin.py set_num_tokens_hybrid_swa)."""

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

# --- TensorRT-LLM -----------------------------------------------------------------------

TRTLLM_FREE_FRACTION = 0.9
"""KvCacheConfig.free_gpu_memory_fraction default (TensorRT-LLM docs, "How to Change KV Cache
Behavior"): the share of the memory free after weights and activations that the KV cache
takes; gt-052 prints "fraction is set 0.8999999761581421"."""

TRTLLM_TOKENS_PER_BLOCK = 32
"""KV block of the PyTorch backend: gt-052 "Number of tokens per block: 32"."""

TRTLLM_MAX_NUM_TOKENS = 8192
"""`trtllm-serve --max_num_tokens` default: the tokens of the profiling forward pass."""

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


@dataclass(frozen=True)
class EngineMemory:
    """How one engine accounts for its memory: the flags it reads and their defaults.

    The context and card flags, whether it takes a context and whether it runs on one card
    come from `engines.ENGINES` (`engine`); this adds what memory sizing needs.
    """

    engine: Engine
    tp_flags: tuple[str, ...] = ()
    pp_flags: tuple[str, ...] = ()
    utilisation_flags: tuple[str, ...] = ()
    default_utilisation: float | None = None
    """None: derived from the card (SGLang), or no fraction at all (llama.cpp, one-card)."""
    cache_dtype_flags: tuple[str, ...] = ()
    cache_dtypes: tuple[tuple[str, Fraction | None], ...] = ()

    @property
    def takes_context(self) -> bool:
        """Whether the engine takes a context through its arguments."""
        return bool(self.engine.context_flags)

    @property
    def single_card(self) -> bool:
        """Whether the engine runs on one card only."""
        return self.engine.split is CardSplit.SINGLE_CARD


def _memory_rules() -> dict[str, EngineMemory]:
    """The table of `EngineMemory` by engine name (flags as each engine's --help spells them)."""
    from planner_svc.domain.engines import ENGINES

    rules = {name: EngineMemory(engine=e) for name, e in ENGINES.items()}
    rules["vllm"] = EngineMemory(
        engine=ENGINES["vllm"],
        tp_flags=("--tensor-parallel-size", "-tp"),
        pp_flags=("--pipeline-parallel-size", "-pp"),
        utilisation_flags=("--gpu-memory-utilization",),
        default_utilisation=VLLM_UTILISATION,
        cache_dtype_flags=("--kv-cache-dtype",),
        cache_dtypes=tuple(VLLM_CACHE_DTYPES.items()),
    )
    rules["sglang"] = EngineMemory(
        engine=ENGINES["sglang"],
        tp_flags=("--tp-size", "--tp", "--tensor-parallel-size"),
        pp_flags=("--pp-size", "--pp", "--pipeline-parallel-size"),
        utilisation_flags=("--mem-fraction-static",),
        cache_dtype_flags=("--kv-cache-dtype",),
        cache_dtypes=tuple(SGLANG_CACHE_DTYPES.items()),
    )
    # trtllm-serve has no cache-dtype flag (it is set in the --config YAML, which the planner
    # does not read): the cache is sized at the model's dtype, the larger case.
    rules["trtllm"] = EngineMemory(
        engine=ENGINES["trtllm"],
        tp_flags=("--tp_size",),
        pp_flags=("--pp_size",),
        utilisation_flags=("--kv_cache_free_gpu_memory_fraction", "--free_gpu_memory_fraction"),
        default_utilisation=TRTLLM_FREE_FRACTION,
    )
    return rules


ENGINE_MEMORY: dict[str, EngineMemory] = _memory_rules()
"""Memory rules of every engine the planner knows, by `engines.ENGINES` name."""


def engine_memory(engine: str) -> EngineMemory:
    """The memory rules of an engine (aliases as `engines.engine_named` takes them).

    Raises:
        UnknownEngine: the planner does not know the engine.
    """
    known = engine_named(engine)
    if known is None or known.name not in ENGINE_MEMORY:
        raise errors.UnknownEngine(
            f"the planner does not know the engine {engine!r}: use one of "
            + ", ".join(sorted(ENGINE_MEMORY)),
            engine=engine,
        )
    return ENGINE_MEMORY[known.name]


# --- arguments --------------------------------------------------------------------------


def _refuse(rules: EngineMemory, message: str, detail: str) -> errors.EngineRefuses:
    """An EngineRefuses for `rules`' engine."""
    return errors.EngineRefuses(message, engine=rules.engine.name, detail=detail)


def _float_arg(rules: EngineMemory, args: Sequence[str], names: Sequence[str]) -> float | None:
    """A fraction flag's value in (0, 1], None when absent; refused when not such a number."""
    raw = argv.get_arg(args, names) if names else None
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise _refuse(
            rules,
            f"{rules.engine.name} refuses {names[0]} {raw!r}: give a fraction above 0, at most 1",
            f"{names[0]}={raw}",
        )
    return value


def _int_arg(
    rules: EngineMemory, args: Sequence[str], names: Sequence[str], minimum: int = 1
) -> int | None:
    """A whole-number flag's value (at least `minimum`), None when absent; refused otherwise."""
    raw = argv.get_arg(args, names) if names else None
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise _refuse(
            rules,
            f"{rules.engine.name} refuses {names[0]} {raw!r}: give a whole number of at least "
            f"{minimum}",
            f"{names[0]}={raw}",
        )
    return value


def cache_dtype_bytes(engine: str, args: Sequence[str], shape: ModelShape) -> Fraction:
    """Bytes of one cached K or V element for an engine and its arguments.

    vLLM and SGLang read `--kv-cache-dtype` ("auto" is the model's own, `shape.kv_dtype_bytes`);
    TensorRT-LLM, llama.cpp (whose K and V types `llamacpp.py` sizes) and one-card engines
    are taken at the model's dtype.

    Returns:
        The element size, exact (SGLang's fp4 is 9/16 of a byte with its scales).
    Raises:
        UnknownEngine: the engine is not known.
        EngineRefuses: the engine does not accept the value, or the planner does not size it.
    """
    rules = engine_memory(engine)
    raw = argv.get_arg(args, rules.cache_dtype_flags) if rules.cache_dtype_flags else None
    if raw is None:
        return Fraction(shape.kv_dtype_bytes)
    table = dict(rules.cache_dtypes)
    key = raw.strip().lower()
    if key not in table:
        raise _refuse(
            rules,
            f"{rules.engine.name} --kv-cache-dtype {raw!r} is not a cache type the planner can "
            f"size: use one of {', '.join(table)}",
            f"--kv-cache-dtype={raw}",
        )
    size = table[key]
    return Fraction(shape.kv_dtype_bytes) if size is None else size


def tensor_parallel(engine: str, args: Sequence[str], cards: int) -> tuple[int, int]:
    """The (tensor, pipeline) parallel sizes a replica on `cards` cards runs with.

    The arguments decide when their tp × pp is `cards` (or `cards` is 0), and a tp alone
    that divides the cards leaves the rest to pipeline stages (vLLM across nodes); otherwise
    the cards do: tp = cards / pp when pp divides them, else tp = cards and pp = 1.

    Raises:
        EngineRefuses: a tp or pp flag that is not a positive whole number.
        InvalidRequest: a negative card count.
    """
    if cards < 0:
        raise errors.InvalidRequest(f"a replica needs at least one card, not {cards}", field="gpus")
    rules = engine_memory(engine)
    tp_arg = _int_arg(rules, args, rules.tp_flags)
    pp_arg = _int_arg(rules, args, rules.pp_flags)
    pp = pp_arg or 1
    if cards == 0:
        return tp_arg or 1, pp
    if tp_arg is not None and tp_arg * pp == cards:
        return tp_arg, pp
    if tp_arg is not None and pp_arg is None and cards % tp_arg == 0:
        return tp_arg, cards // tp_arg
    if cards % pp == 0:
        return cards // pp, pp
    return cards, 1


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
class _Pool:
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


def _pool(
    engine: str,
    args: Sequence[str],
    *,
    tokens: int,
    sequences: int,
    card_memory_bytes: int = 0,
) -> _Pool:
    """The pool rules of `engine` with its arguments (`card_memory_bytes` picks vLLM's
    batched-token default; 0 takes the larger)."""
    rules = engine_memory(engine)
    name = rules.engine.name
    if name == "vllm":
        return _Pool(
            name,
            tokens,
            sequences,
            block=_int_arg(rules, args, ("--block-size",)) or VLLM_BLOCK_TOKENS,
            batched_tokens=_vllm_batched_tokens(rules, args, card_memory_bytes),
        )
    if name == "sglang":
        ratio = _float_arg(rules, args, ("--swa-full-tokens-ratio",))
        hybrid = not argv.has_flag(args, ("--disable-hybrid-swa-memory",))
        return _Pool(
            name,
            tokens,
            sequences,
            block=_int_arg(rules, args, ("--page-size",)) or 1,
            swa_ratio=(ratio or SGLANG_SWA_FULL_TOKENS_RATIO) if hybrid else None,
        )
    if name == "trtllm":
        return _Pool(name, tokens, sequences, block=TRTLLM_TOKENS_PER_BLOCK)
    return _Pool(name, tokens, sequences)


def _vllm_batched_tokens(rules: EngineMemory, args: Sequence[str], card_memory_bytes: int) -> int:
    """vLLM's tokens per batch: `--max-num-batched-tokens`, else its default for the card."""
    given = _int_arg(rules, args, ("--max-num-batched-tokens",))
    if given is not None:
        return given
    if 0 < card_memory_bytes < VLLM_LARGE_CARD_BYTES:
        return VLLM_BATCHED_TOKENS_SMALL_CARD
    return VLLM_BATCHED_TOKENS_LARGE_CARD


def _layer_bytes_on_card(shape: ModelShape, pool: _Pool, *, tp: int, dtype: Fraction) -> list[int]:
    """Each layer's KV and recurrent state on one card (state split by tp like its heads)."""
    out = []
    for layer in shape.layers:
        kv = math.ceil(pool.held(layer) * _token_bytes(layer, tp, dtype)) if layer.has_kv else 0
        state = pool.sequences * -(-layer.state_bytes // tp)
        out.append(kv + state)
    return out


def _check_pool(tokens: int, sequences: int, tp: int) -> None:
    """Refuse negative pools and counts below one."""
    if tokens < 0:
        raise errors.InvalidRequest(f"a pool of {tokens} tokens is not a size", field="tokens")
    if sequences < 1:
        raise errors.InvalidRequest(f"{sequences} sequences: give at least one", field="slots")
    if tp < 1:
        raise errors.InvalidRequest(f"tensor parallel {tp}: give at least one card", field="gpus")


def _llamacpp_args(args: Sequence[str], *, tokens: int, sequences: int) -> list[str]:
    """llama-server's arguments with its pool set: `--ctx-size` tokens, `--parallel` slots."""
    from planner_svc.domain.engines import LLAMACPP

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
    (`_Pool.held`); recurrent layers a state per sequence. Each of the `tp` cards holds
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
    _check_pool(tokens, sequences, tp)
    rules = engine_memory(engine)
    if rules.engine.split is CardSplit.LAYER_SPLIT:
        from planner_svc.domain.llamacpp import llamacpp_kv_bytes

        return llamacpp_kv_bytes(shape, _llamacpp_args(args, tokens=tokens, sequences=sequences))
    if rules.single_card:
        return 0
    dtype = cache_dtype_bytes(engine, args, shape)
    pool = _pool(engine, args, tokens=tokens, sequences=sequences)
    return sum(_layer_bytes_on_card(shape, pool, tp=tp, dtype=dtype)) * tp


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
    _check_pool(0, 1, tp)
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
    block = _pool("vllm", args, tokens=0, sequences=1).block
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
    pool = _pool("sglang", args, tokens=0, sequences=1)
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
    batched = _vllm_batched_tokens(rules, args, card_memory_bytes)
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
    batched = _int_arg(rules, args, ("--max_num_tokens",)) or TRTLLM_MAX_NUM_TOKENS
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
    given = _float_arg(rules, args, rules.utilisation_flags)
    if given is not None:
        return given
    if card_memory_bytes <= 0:
        return 0.88
    gpu_mib = card_memory_bytes / MIB
    _, chunk_default, graphs_small, graphs_large = next(
        b for b in SGLANG_GPU_BUCKETS if gpu_mib < b[0]
    )
    chunk = _int_arg(rules, args, ("--chunked-prefill-size",), minimum=-1) or chunk_default
    graphs = _int_arg(rules, args, ("--cuda-graph-max-bs",)) or (
        graphs_small if tp < 4 else graphs_large
    )
    prefill = _int_arg(rules, args, ("--max-prefill-tokens",)) or SGLANG_MAX_PREFILL_TOKENS
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
    pool = _pool(
        engine,
        args,
        tokens=tokens * sequences,
        sequences=sequences,
        card_memory_bytes=card_memory_bytes,
    )
    per_layer = _layer_bytes_on_card(shape, pool, tp=tp, dtype=dtype)
    kv_card = _fullest_stage(per_layer, pp)
    weights_card = -(-shape.weights_bytes // (tp * pp))
    card = card_memory_bytes
    if rules.engine.name == "vllm":
        overhead = vllm_overhead_bytes(shape, args, tokens=tokens, pp=pp, card_memory_bytes=card)
        util = _float_arg(rules, args, rules.utilisation_flags) or VLLM_UTILISATION
        budget = int(card * util)
    elif rules.engine.name == "sglang":
        mfs = sglang_mem_fraction_static(card, args, tp=tp, pp=pp)
        # Its fraction applies to the memory free before loading, the preload already gone.
        overhead = math.ceil(mfs * SGLANG_PRELOAD_BYTES)
        budget = int(card * mfs)
    else:
        overhead = trtllm_overhead_bytes(shape, args, pp=pp)
        free = _float_arg(rules, args, rules.utilisation_flags) or TRTLLM_FREE_FRACTION
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
    from planner_svc.domain.llamacpp import llamacpp_kv_bytes, llamacpp_overhead_bytes

    n = max(cards, 1)
    full_args = _llamacpp_args(args, tokens=tokens * sequences, sequences=sequences)
    kv_total = llamacpp_kv_bytes(shape, full_args)
    layers = shape.block_count
    offloaded = _gpu_layers(shape, args)
    per_layer = _layer_bytes_on_card(
        shape,
        _Pool("llamacpp", tokens * sequences, sequences),
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
    _check_pool(pool_tokens, sequences, 1)
    pool = _Pool("cpu", pool_tokens, sequences)
    kv = sum(_layer_bytes_on_card(shape, pool, tp=1, dtype=Fraction(shape.kv_dtype_bytes)))
    w = shape.weights_bytes
    return w + kv + RAM_RESERVE_BYTES + w // RAM_WEIGHTS_SHARE
