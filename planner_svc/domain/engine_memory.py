"""Each engine's memory settings: the flags it reads, their defaults, its cache element sizes.

Constants name their source: the engine's source file or documented default, or a
ground-truth row (tests/fixtures/ground_truth/observations.jsonl, "gt-NNN").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from llmgw.shape import ModelShape
from planner_svc.domain import args as argv
from planner_svc.domain import errors
from planner_svc.domain.engines import ENGINES, CardSplit, Engine, engine_named

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


# --- TensorRT-LLM -----------------------------------------------------------------------

TRTLLM_FREE_FRACTION = 0.9
"""KvCacheConfig.free_gpu_memory_fraction default (TensorRT-LLM docs, "How to Change KV Cache
Behavior"): the share of the memory free after weights and activations that the KV cache
takes; gt-052 prints "fraction is set 0.8999999761581421"."""

TRTLLM_TOKENS_PER_BLOCK = 32
"""KV block of the PyTorch backend: gt-052 "Number of tokens per block: 32"."""

TRTLLM_MAX_NUM_TOKENS = 8192
"""`trtllm-serve --max_num_tokens` default: the tokens of the profiling forward pass."""


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


def refuse(rules: EngineMemory, message: str, detail: str) -> errors.EngineRefuses:
    """An EngineRefuses for `rules`' engine."""
    return errors.EngineRefuses(message, engine=rules.engine.name, detail=detail)


def fraction_arg(rules: EngineMemory, args: Sequence[str], names: Sequence[str]) -> float | None:
    """A fraction flag's value in (0, 1], None when absent; refused when not such a number."""
    raw = argv.get_arg(args, names) if names else None
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise refuse(
            rules,
            f"{rules.engine.name} refuses {names[0]} {raw!r}: give a fraction above 0, at most 1",
            f"{names[0]}={raw}",
        )
    return value


def count_arg(
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
        raise refuse(
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
        raise refuse(
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
    tp_arg = count_arg(rules, args, rules.tp_flags)
    pp_arg = count_arg(rules, args, rules.pp_flags)
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


def vllm_batched_tokens(rules: EngineMemory, args: Sequence[str], card_memory_bytes: int) -> int:
    """vLLM's tokens per batch: `--max-num-batched-tokens`, else its default for the card."""
    given = count_arg(rules, args, ("--max-num-batched-tokens",))
    if given is not None:
        return given
    if 0 < card_memory_bytes < VLLM_LARGE_CARD_BYTES:
        return VLLM_BATCHED_TOKENS_SMALL_CARD
    return VLLM_BATCHED_TOKENS_LARGE_CARD
