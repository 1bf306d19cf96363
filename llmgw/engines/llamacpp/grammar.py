"""llama-server's flag grammar: the flags that size its cache, their aliases and values, and
the settings they come to after llama-server's own defaults.

llama-server parses flags exactly (no abbreviations), reads `--a_b` as `--a-b` in long flags
(common/arg.cpp:823-825) and has no `=` split (common_params_parse_ex), so `--ctx-size=4096`
stops it at start: flags the planner writes are always written apart. The project's argument
convention reads `--flag=value` too.

Every rule is written from reading llama.cpp as vendored in llama-cpp-python 0.3.36 (llama.cpp
commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f, `LLAMACPP_VERSION`); file:line references are
to that tree. None is copied.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

from llmgw.engines.args import get_arg, has_flag
from llmgw.engines.errors import EngineRefuses
from llmgw.engines.grammar import Grammar

LLAMACPP_VERSION = "llama.cpp 0c1e570 (llama-cpp-python 0.3.36)"
"""The llama.cpp whose rules this package models."""

ENGINE = "llamacpp"

GRAMMAR = Grammar(ENGINE, folds_underscores=True, joined_ok=False, abbreviates=False)

MIB = 1 << 20

# tools/server/server.cpp:156-160: with --parallel unset (-1, "auto") llama-server runs 4 slots
# and forces the unified cache.
AUTO_SLOTS = 4
# common/common.h:453-454: logical and physical batch defaults.
DEFAULT_BATCH_TOKENS = 2048
DEFAULT_UBATCH_TOKENS = 512


@dataclass(frozen=True)
class CacheType:
    """A `--cache-type-k/-v` value: `block_bytes` bytes store `block_elements` elements."""

    name: str
    block_elements: int
    block_bytes: int

    @property
    def quantized(self) -> bool:
        """Whether the type is block-quantized (ggml_is_quantized)."""
        return self.block_elements > 1

    def row_bytes(self, elements: int) -> int:
        """Bytes of one cache row of `elements` values (ggml_row_size, ggml/src/ggml.c:1339)."""
        return self.block_bytes * elements // self.block_elements


# common/arg.cpp:304-314 (kv_cache_types): the types llama-server accepts; block sizes and bytes
# from ggml/src/ggml.c type_traits (QK8_0 = QK4_0 = QK4_1 = QK5_0 = QK5_1 = QK4_NL = 32;
# block_q8_0 = 2 + 32, block_q4_0 = 2 + 16, block_q4_1 = 4 + 16, block_q5_0 = 2 + 4 + 16,
# block_q5_1 = 4 + 4 + 16, block_iq4_nl = 2 + 16 bytes).
CACHE_TYPES: dict[str, CacheType] = {
    t.name: t
    for t in (
        CacheType("f32", 1, 4),
        CacheType("f16", 1, 2),
        CacheType("bf16", 1, 2),
        CacheType("q8_0", 32, 34),
        CacheType("q4_0", 32, 18),
        CacheType("q4_1", 32, 20),
        CacheType("iq4_nl", 32, 18),
        CacheType("q5_0", 32, 22),
        CacheType("q5_1", 32, 24),
    )
}


class FlashAttn(enum.Enum):
    """llama-server's `--flash-attn` setting (common/arg.cpp:1754-1767)."""

    ON = "on"
    """Written on/enabled/true/1: flash attention is used, or the context is refused."""
    OFF = "off"
    """Written off/disabled/false/0: never used."""
    AUTO = "auto"
    """Written auto/-1, or absent: used where the device supports it (see `_resolve_fa`)."""


# common/arg.cpp:1334-1344: is_truthy / is_falsey / is_autoy.
_FLASH_ATTN_WORDS = {
    **dict.fromkeys(("on", "enabled", "true", "1"), FlashAttn.ON),
    **dict.fromkeys(("off", "disabled", "false", "0"), FlashAttn.OFF),
    **dict.fromkeys(("auto", "-1"), FlashAttn.AUTO),
}

# Flags as llama-server spells them (common/arg.cpp); the first name is the canonical one.
CTX_SIZE = ("--ctx-size", "-c")
PARALLEL = ("--parallel", "-np")
CACHE_TYPE_K = ("--cache-type-k", "-ctk")
CACHE_TYPE_V = ("--cache-type-v", "-ctv")
FLASH_ATTN = ("--flash-attn", "-fa")
UBATCH_SIZE = ("--ubatch-size", "-ub")
BATCH_SIZE = ("--batch-size", "-b")
SWA_FULL = ("--swa-full",)
KV_UNIFIED = ("--kv-unified", "-kvu")
NO_KV_UNIFIED = ("--no-kv-unified", "-no-kvu")
KV_UNIFIED_PER_SLOT = ("--kv-unified-per-slot",)
N_GPU_LAYERS = ("--n-gpu-layers", "--gpu-layers", "-ngl")
SPLIT_MODE = ("--split-mode", "-sm")
FIT = ("--fit", "-fit")

# Flags the planner sets or drops when it moves a profile to other cards.
TENSOR_SPLIT = ("--tensor-split", "-ts")
LAYER_SPLIT = "layer"


@dataclass(frozen=True)
class LlamaCppSettings:
    """The llama-server settings that size its cache, after llama-server's own defaults.

    `ctx_size_tokens` is what `--ctx-size` asked for (0: the model's trained context);
    `slots` the number of server slots (= the context's sequences, n_seq_max); `kv_unified`
    whether all slots share one cache of `ctx_size_tokens` cells (else each slot gets its own
    stream of ctx_size / slots cells); `n_gpu_layers` -1 for auto, -2 for all.
    """

    ctx_size_tokens: int = 0
    slots: int = AUTO_SLOTS
    kv_unified: bool = True
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: FlashAttn = FlashAttn.AUTO
    ubatch_tokens: int = DEFAULT_UBATCH_TOKENS
    batch_tokens: int = DEFAULT_BATCH_TOKENS
    swa_full: bool = False
    n_gpu_layers: int = -1
    split_mode: str = "layer"
    fit: bool = True
    kv_unified_per_slot_tokens: int = 0


def settings_from_args(args: Sequence[str]) -> LlamaCppSettings:
    """llama-server's cache settings from its arguments, with its defaults where absent.

    Defaults (common/common.h:452-575, tools/server/server.cpp:156-160): context 0 (the
    model's trained context), `--parallel` auto = 4 slots with a unified cache, explicit
    `--parallel N` with a per-slot (non-unified) cache unless `--kv-unified`, f16 caches, flash
    attention auto, ubatch 512, batch 2048, no `--swa-full`, `--fit on`.

    llama-server also takes `--ctx_size` for `--ctx-size` (common/arg.cpp:823-825 turns `_`
    into `-` in long flags), read here too; it does not take `--flag=value` (no `=` split in
    common_params_parse_ex), which is read here as the project's argument convention.

    Args:
        args: llama-server's arguments; `--flag value` and `--flag=value`, short aliases.
    Returns:
        The settings.
    Raises:
        EngineRefuses: a value llama-server itself rejects (unknown cache type, `--parallel 0`,
            a flash-attention word it does not know), or a number that is not a whole number
            (llama-server's std::stoi would read "4k" as 4).
    """
    args = [_long_flag(arg) for arg in args]
    parallel = _int_arg(args, PARALLEL, -1)
    if parallel == 0 or parallel < -1:
        # common/arg.cpp:2547-2549 rejects 0; any other negative is auto like -1.
        if parallel == 0:
            refuse("--parallel 0 is not accepted by llama-server: give 1 or more slots")
        parallel = -1
    unified = _kv_unified_flag(args)
    if parallel == -1:
        # tools/server/server.cpp:156-160: auto slots force the unified cache.
        parallel, unified = AUTO_SLOTS, True
    ctx = _int_arg(args, CTX_SIZE, 0)
    if ctx < 0:
        refuse(f"--ctx-size {ctx} is negative: give a context in tokens (0 = trained)")
    per_slot = _int_arg(args, KV_UNIFIED_PER_SLOT, 0)
    fit = _on_off(args, FIT, True)
    if per_slot > 0 and get_arg(args, CTX_SIZE) is None:
        # tools/server/server.cpp:166-173: --kv-unified-per-slot without -c sizes the pool.
        ctx = parallel * per_slot
    return LlamaCppSettings(
        ctx_size_tokens=ctx,
        slots=parallel,
        kv_unified=unified,
        cache_type_k=_cache_type(args, CACHE_TYPE_K),
        cache_type_v=_cache_type(args, CACHE_TYPE_V),
        flash_attn=_flash_attn(args),
        ubatch_tokens=_positive(args, UBATCH_SIZE, DEFAULT_UBATCH_TOKENS),
        batch_tokens=_positive(args, BATCH_SIZE, DEFAULT_BATCH_TOKENS),
        swa_full=has_flag(args, SWA_FULL),
        n_gpu_layers=_gpu_layers(args),
        split_mode=(get_arg(args, SPLIT_MODE) or "layer").strip().lower(),
        fit=fit,
        kv_unified_per_slot_tokens=per_slot,
    )


def refuse(detail: str) -> NoReturn:
    """Raise llama.cpp's refusal."""
    raise EngineRefuses(message=f"llama.cpp refuses: {detail}.", engine=ENGINE, detail=detail)


def known_type(name: str, flag: str) -> CacheType:
    """The cache type called `name`, or the refusal llama-server gives."""
    ctype = CACHE_TYPES.get(name)
    if ctype is None:
        refuse(
            f"{flag} {name} is not a cache type llama-server takes: use one of "
            + ", ".join(CACHE_TYPES)
        )
    return ctype


def _cache_type(args: Sequence[str], names: Sequence[str]) -> str:
    """A cache-type flag's value (f16 when absent), checked against llama-server's list."""
    value = get_arg(args, names)
    if value is None:
        return "f16"
    known_type(value, names[0])
    return value


def _flash_attn(args: Sequence[str]) -> FlashAttn:
    """`--flash-attn`'s value; absent is auto.

    This llama-server wants a value; a bare `-fa` (older builds' switch) makes it take the
    next argument as the value and exit, so it is refused.
    """
    value = get_arg(args, FLASH_ATTN)
    if value is None:
        return FlashAttn.AUTO
    if value == "":
        refuse("--flash-attn needs a value in this llama-server: give --flash-attn on, off or auto")
    fa = _FLASH_ATTN_WORDS.get(value.strip().lower())
    if fa is None:
        refuse(f"--flash-attn {value!r} is not on, off or auto")
    return fa


def _int_arg(args: Sequence[str], names: Sequence[str], default: int) -> int:
    """A flag's whole-number value; `default` when absent; refused when not a number."""
    value = get_arg(args, names)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        refuse(f"{names[0]} {value!r} is not a whole number")


def _positive(args: Sequence[str], names: Sequence[str], default: int) -> int:
    """A whole-number flag that must be at least 1."""
    value = _int_arg(args, names, default)
    if value < 1:
        refuse(f"{names[0]} {value} must be at least 1")
    return value


def _gpu_layers(args: Sequence[str]) -> int:
    """`--n-gpu-layers`: a count, auto (-1) or all (-2) (common/arg.cpp:2789-2800)."""
    value = get_arg(args, N_GPU_LAYERS)
    if value is None or value.strip() == "auto":
        return -1
    if value.strip() == "all":
        return -2
    return _int_arg(args, N_GPU_LAYERS, -1)


def _on_off(args: Sequence[str], names: Sequence[str], default: bool) -> bool:
    """An on/off flag's value."""
    value = get_arg(args, names)
    if value is None:
        return default
    word = _FLASH_ATTN_WORDS.get(value.strip().lower())
    if word is FlashAttn.AUTO or word is None:
        refuse(f"{names[0]} {value!r} is not on or off")
    return word is FlashAttn.ON


def _long_flag(arg: str) -> str:
    """A long flag with `_` written as `-`, as llama-server reads it; anything else as is."""
    if not arg.startswith("--"):
        return arg
    name, sep, value = arg.partition("=")
    return name.replace("_", "-") + sep + value


def _kv_unified_flag(args: Sequence[str]) -> bool:
    """Whether the last of `--kv-unified` / `--no-kv-unified` given asks for a unified cache."""
    unified = False
    for arg in args:
        name = arg.split("=", 1)[0]
        if name in KV_UNIFIED:
            unified = True
        elif name in NO_KV_UNIFIED:
            unified = False
    return unified
