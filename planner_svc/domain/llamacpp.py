"""llama.cpp's cache: what llama-server allocates for a model's KV, sliding-window and recurrent
state, and what it refuses.

Every rule is written from reading llama.cpp as vendored in llama-cpp-python 0.3.36 (llama.cpp
commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f); file:line references are to that tree. None is
copied. tests/oracle/ loads models in that llama.cpp and checks these numbers against what it
prints.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from llmgw.shape import Layer, LayerKind, ModelShape
from planner_svc.domain.args import get_arg, has_flag
from planner_svc.domain.errors import EngineRefuses

LLAMACPP_VERSION = "llama.cpp 0c1e570 (llama-cpp-python 0.3.36)"
"""The llama.cpp whose rules this module models."""

_ENGINE = "llamacpp"

MIB = 1 << 20

# src/llama-context.cpp:290 and src/llama-kv-cache-iswa.cpp:73 pad cache sizes to 256 cells.
CELL_PAD = 256
# src/llama-cparams.h:8: LLAMA_MAX_SEQ; src/llama-context.cpp:101 refuses more sequences.
MAX_SEQUENCES = 256
# tools/server/server.cpp:156-160: with --parallel unset (-1, "auto") llama-server runs 4 slots
# and forces the unified cache.
AUTO_SLOTS = 4
# common/common.h:453-454: logical and physical batch defaults.
DEFAULT_BATCH_TOKENS = 2048
DEFAULT_UBATCH_TOKENS = 512
# Recurrent state (r and s) is allocated in f32 (src/llama-model.cpp:2669-2678, create_memory).
STATE_DTYPE_BYTES = 4


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

# src/llama-model.cpp:2358-2374 (create_memory): encoders and diffusion models keep no cache.
_NO_MEMORY_ARCHS = frozenset(
    {
        "bert",
        "jina-bert-v2",
        "jina-bert-v3",
        "nomic-bert",
        "nomic-bert-moe",
        "neo-bert",
        "eurobert",
        "wavtokenizer-dec",
        "modern-bert",
        "gemma-embedding",
        "dream",
        "llada",
        "llada-moe",
        "rnd1",
    }
)
# src/llama-model.cpp:2375-2535: caches with an extra indexer or compressed cache that a
# ModelShape does not describe; their KV part is counted, the rest is named in `notes`.
_EXTRA_CACHE_ARCHS = frozenset(
    {"minimax-m3", "glm-dsa", "deepseek32", "glm5-next", "hy_v4", "dots3note", "deepseek4"}
)
# src/llama-arch.cpp:1071-1109 (llm_arch_is_recurrent / llm_arch_is_hybrid): their KV cache
# holds only the attention layers (src/llama-model.cpp:2679-2776, filter_attn).
_RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
_HYBRID_ARCHS = frozenset(
    {
        "jamba",
        "falcon-h1",
        "plamo2",
        "granitehybrid",
        "lfm2",
        "lfm2moe",
        "nemotron_h",
        "nemotron_h_moe",
        "qwen3next",
        "kimi-linear",
        "bailingmoe3",
        "kimi-k3",
        "glm5-next",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "deepseek4",
        "minimax-01",
    }
)
# src/llama-hparams.cpp:321-332 (has_kv) with n_layer_kv_from_start: their trailing layers
# reuse earlier layers' KV and are not in the cache.
_SHARED_KV_ARCHS = frozenset({"gemma3n", "gemma4"})
# src/llama-context.cpp:3816-3819: flash attention is forced off for Grok.
_NO_FLASH_ATTN_ARCHS = frozenset({"grok"})
# src/llama-context.cpp:3835-3838: these refuse different K and V cache types.
_SAME_KV_TYPE_ARCHS = frozenset({"deepseek4"})


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
            _refuse("--parallel 0 is not accepted by llama-server: give 1 or more slots")
        parallel = -1
    unified = _kv_unified_flag(args)
    if parallel == -1:
        # tools/server/server.cpp:156-160: auto slots force the unified cache.
        parallel, unified = AUTO_SLOTS, True
    ctx = _int_arg(args, CTX_SIZE, 0)
    if ctx < 0:
        _refuse(f"--ctx-size {ctx} is negative: give a context in tokens (0 = trained)")
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


@dataclass(frozen=True)
class LlamaCppCache:
    """What llama.cpp allocates for one context.

    A cache has `streams` streams of its cells (1 when unified, one per slot otherwise):
    `full_cells` per stream for full-attention and MLA layers, `swa_cells` for sliding
    layers (0 when the model has none). `k_bytes`/`v_bytes` are the full cache's, printed by
    llama.cpp as "K (type): … MiB, V (type): … MiB"; `swa_k_bytes`/`swa_v_bytes` the SWA
    cache's; `recurrent_bytes` the recurrent state of `slots` sequences.
    """

    n_ctx_tokens: int
    """The context after padding and per-slot rounding (llama.cpp's printed n_ctx)."""
    n_ctx_seq_tokens: int
    """Tokens one slot can hold (llama.cpp's printed n_ctx_seq)."""
    streams: int
    full_cells: int
    swa_cells: int
    k_bytes: int
    v_bytes: int
    swa_k_bytes: int
    swa_v_bytes: int
    recurrent_bytes: int
    flash_attn: bool
    """Whether flash attention ends up on (auto resolved as on a CPU, see `_resolve_fa`)."""
    ubatch_tokens: int
    """The physical batch after llama.cpp clamps it to the batch and the context."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def full_bytes(self) -> int:
        """The full-attention (and MLA) cache."""
        return self.k_bytes + self.v_bytes

    @property
    def swa_bytes(self) -> int:
        """The sliding-window cache."""
        return self.swa_k_bytes + self.swa_v_bytes

    @property
    def total_bytes(self) -> int:
        """Everything the context's memory module allocates."""
        return self.full_bytes + self.swa_bytes + self.recurrent_bytes


def llamacpp_cache(shape: ModelShape, settings: LlamaCppSettings) -> LlamaCppCache:
    """What llama.cpp allocates for `shape` under `settings`, or its refusal.

    Args:
        shape: the model's shape (GGUF header through `shape_from_gguf`, or built inline).
        settings: llama-server's settings (`settings_from_args`).
    Returns:
        The cache, cell counts and bytes as llama.cpp computes them.
    Raises:
        EngineRefuses: settings llama.cpp refuses to create a context with.
    """
    type_k = _known_type(settings.cache_type_k, "--cache-type-k")
    type_v = _known_type(settings.cache_type_v, "--cache-type-v")
    seqs = settings.slots
    if not 1 <= seqs <= MAX_SEQUENCES:
        _refuse(f"--parallel {seqs} is outside 1..{MAX_SEQUENCES}, the sequences llama.cpp holds")
    mla = any(la.kind is LayerKind.MLA for la in shape.layers)
    if (mla or shape.architecture in _SAME_KV_TYPE_ARCHS) and type_k.name != type_v.name:
        # src/llama-context.cpp:3835-3838.
        _refuse(
            f"{shape.architecture} refuses different cache types for K ({type_k.name}) and V "
            f"({type_v.name}): give --cache-type-v {type_k.name}"
        )
    flash = _resolve_fa(shape, settings, type_k, type_v)

    n_ctx = settings.ctx_size_tokens
    if n_ctx == 0:
        if shape.trained_context <= 0:
            # src/llama-context.cpp:3811-3813.
            _refuse("the model does not say its trained context: give --ctx-size")
        n_ctx = shape.trained_context
        if settings.fit and not settings.kv_unified:
            # common/fit.cpp:196-272: with --fit on and per-slot caches an unset context
            # becomes the trained context for every slot.
            n_ctx = shape.trained_context * seqs
    # src/llama-context.cpp:246-248: with causal attention the batch is capped by the context
    # as asked (before padding), and the ubatch by the batch.
    batch = min(n_ctx, settings.batch_tokens)
    ubatch = min(batch, settings.ubatch_tokens)

    # src/llama-context.cpp:290-306: pad to 256; per-slot caches split it and pad each slot.
    n_ctx = _pad(n_ctx, CELL_PAD)
    if settings.kv_unified:
        n_ctx_seq, streams = n_ctx, 1
    else:
        n_ctx_seq, streams = _pad(n_ctx // seqs, CELL_PAD), seqs
        n_ctx = n_ctx_seq * seqs

    notes: list[str] = []
    if shape.architecture in _NO_MEMORY_ARCHS:
        return LlamaCppCache(
            n_ctx_tokens=n_ctx,
            n_ctx_seq_tokens=n_ctx_seq,
            streams=streams,
            full_cells=0,
            swa_cells=0,
            k_bytes=0,
            v_bytes=0,
            swa_k_bytes=0,
            swa_v_bytes=0,
            recurrent_bytes=0,
            flash_attn=flash,
            ubatch_tokens=ubatch,
            notes=(f"{shape.architecture}: llama.cpp keeps no cache for this model",),
        )
    if shape.architecture in _EXTRA_CACHE_ARCHS:
        notes.append(
            f"{shape.architecture}: llama.cpp keeps an indexer or compressed cache beside the "
            "KV cache that is not counted here"
        )

    cached = _cache_layers(shape)
    sliding = [la for la in cached if la.kind is LayerKind.SLIDING]
    full = [la for la in cached if la.kind is not LayerKind.SLIDING]
    # src/llama-kv-cache.cpp:158 and 210 ([TAG_V_CACHE_VARIABLE]): without flash attention V is
    # stored transposed and every layer's V row is the widest of all layers.
    v_max = max((_v_width(la) for la in shape.layers if la.has_kv), default=0)
    v_row = None if flash else v_max

    full_cells = n_ctx_seq
    k_bytes, v_bytes = _layer_bytes(full, full_cells * streams, type_k, type_v, v_row)
    swa_cells = 0
    swa_k = swa_v = 0
    if sliding:
        window = max(la.window_tokens for la in sliding)
        # src/llama-kv-cache-iswa.cpp:71-81: the SWA cache holds the window of every sequence
        # sharing a stream plus one ubatch, padded to 256, never more than the full cache.
        per_stream = seqs if settings.kv_unified else 1
        swa_cells = (
            n_ctx_seq
            if settings.swa_full
            else _pad(min(n_ctx_seq, window * per_stream + ubatch), CELL_PAD)
        )
        swa_k, swa_v = _layer_bytes(sliding, swa_cells * streams, type_k, type_v, v_row)
    # src/llama-model.cpp:2669-2678: the recurrent memory has max(1, n_seq_max) rows of
    # f32 state (n_rs_seq extra rows only for speculative rollback, not modelled).
    recurrent = shape.state_bytes_per_sequence() * max(1, seqs)
    return LlamaCppCache(
        n_ctx_tokens=n_ctx,
        n_ctx_seq_tokens=n_ctx_seq,
        streams=streams,
        full_cells=full_cells if full else 0,
        swa_cells=swa_cells,
        k_bytes=k_bytes,
        v_bytes=v_bytes,
        swa_k_bytes=swa_k,
        swa_v_bytes=swa_v,
        recurrent_bytes=recurrent,
        flash_attn=flash,
        ubatch_tokens=ubatch,
        notes=tuple(notes),
    )


def llamacpp_kv_bytes(shape: ModelShape, args: Sequence[str]) -> int:
    """Bytes of every cache llama-server allocates for `shape` run with `args`.

    Args:
        shape: the model's shape.
        args: llama-server's arguments.
    Returns:
        KV (full and sliding) plus recurrent state, summed over all cards.
    Raises:
        EngineRefuses: settings llama.cpp refuses.
    """
    return llamacpp_cache(shape, settings_from_args(args)).total_bytes


# Compute-buffer model (see llamacpp_overhead_bytes). Every constant is an upper bound on what
# llama.cpp printed: the oracle's CPU runs (tests/oracle: per cell and ubatch token it adds
# heads x 4 B of f32 scores plus a 4 B f32 mask without flash attention, a 2 B f16 mask with
# it) and the ground-truth GPU rows gt-001/002/003/011/013/016/017/020/021
# (tests/fixtures/ground_truth/observations.jsonl; gt-001 on CUDA: 9240 MiB at 131072 cells,
# ubatch 512, 32 heads, no flash attention = 8192 MiB of scores + ~11 B per cell-token + logits).
# Without flash attention each layer's scores are materialised in f32: KQ [cells, tokens, heads]
# (src/llama-graph.cpp:2688, build_attn_mha).
SCORE_BYTES = 4
# The KQ mask and what backends keep beside it, per cell and ubatch token (CPU 2-4 B, CUDA ~11).
MASK_BYTES = 12
# Rows of hidden-size f32 activations alive at once in a layer's graph, per ubatch token,
# beside the scores (norms, Q/K/V, attention output, FFN gate/up/act at up to ~4x hidden).
ACTIVATION_ROWS = 12
# Logits of one ubatch: ubatch x vocab x f32. The shape does not carry the vocabulary; 262144
# (Gemma 3's, the largest in common use) bounds it.
VOCAB_BOUND = 262_144
# Fixed allowance per card: the backend's own buffers, graph metadata, host staging.
FIXED_OVERHEAD_BYTES = 64 * MIB


def llamacpp_overhead_bytes(shape: ModelShape, args: Sequence[str], cards: int) -> int:
    """llama.cpp's memory beyond weights and caches on each card: its compute buffers.

    With `--split-mode layer` every card runs its own layers' graph one layer at a time, so
    each card's compute buffer is sized for one layer's worst case whatever the card count
    (all cards print about the same size: ground truth gt-002, gt-003). The estimate is an
    upper bound: attention scores when flash attention is off (cells x ubatch x heads x 4 B,
    the dominant term at long contexts; per stream, as the ubatch is split over the streams),
    the mask, activations, logits for a 262144-token vocabulary (counted on every card), and
    a fixed 64 MiB.

    Args:
        shape: the model's shape.
        args: llama-server's arguments.
        cards: cards the model is split over (0 or 1 for one card or a CPU); the per-card
            figure does not depend on it.
    Returns:
        Bytes to reserve on each card (in RAM for a CPU profile).
    Raises:
        EngineRefuses: settings llama.cpp refuses.
    """
    del cards  # one layer's worst case on every card, see above
    cache = llamacpp_cache(shape, settings_from_args(args))
    ubatch = cache.ubatch_tokens
    heads = max(shape.attention_heads, 1)
    hidden = max(heads * max(shape.head_dim_k, shape.head_dim_v), 1)
    # src/llama-context.cpp:628-629 (sched_reserve): the worst case is one ubatch over the
    # widest cache (the full one; the SWA cache is never wider) of each stream; splitting the
    # ubatch over the streams rounds each share up.
    cell_tokens = max(cache.full_cells, cache.swa_cells) * (ubatch + cache.streams)
    scores = 0 if cache.flash_attn else cell_tokens * heads * SCORE_BYTES
    mask = cell_tokens * MASK_BYTES
    activations = ACTIVATION_ROWS * ubatch * hidden * SCORE_BYTES
    logits = ubatch * VOCAB_BOUND * SCORE_BYTES
    return scores + mask + activations + logits + FIXED_OVERHEAD_BYTES


def _resolve_fa(
    shape: ModelShape, settings: LlamaCppSettings, type_k: CacheType, type_v: CacheType
) -> bool:
    """Whether flash attention ends up on, or the refusal llama.cpp gives.

    src/llama-context.cpp:3816-3862 (llama_init_from_model) in order: Grok forces it off;
    tensor split forces auto on and refuses off; a quantized V cache forces auto on and
    refuses off; with flash attention not off, a quantized K (V) cache needs every layer's
    K (V) head size divisible by the type's block. What is left of auto is resolved at
    src/llama-context.cpp:506-559 (resolve_fused_ops): on when the device that runs the layer
    also runs its flash-attention op, which the CPU backend does for every head size (the
    oracle shows it), as CUDA does for the head sizes of released models.
    """
    fa = settings.flash_attn
    if shape.architecture in _NO_FLASH_ATTN_ARCHS:
        fa = FlashAttn.OFF
    if settings.split_mode == "tensor":
        if fa is FlashAttn.OFF:
            _refuse("--split-mode tensor needs flash attention: drop --flash-attn off")
        fa = FlashAttn.ON
    if type_v.quantized:
        if shape.architecture in _NO_FLASH_ATTN_ARCHS:
            _refuse(
                f"{shape.architecture} runs without flash attention, which a quantized V cache "
                f"({type_v.name}) needs: give --cache-type-v f16"
            )
        if fa is FlashAttn.OFF:
            _refuse(
                f"a quantized V cache ({type_v.name}) needs flash attention: give --flash-attn "
                "on (or auto), or --cache-type-v f16"
            )
        fa = FlashAttn.ON
    if type_k.quantized:
        # With flash attention on (or auto) llama.cpp refuses the context
        # (src/llama-context.cpp:3851-3860). With it off it does not check, but each head is a
        # view of whole blocks: the oracle shows it aborting in ggml when the K row is not
        # whole blocks (one KV head of 80) and decoding NaN logits when only the heads are
        # not (two of 80), so the planner refuses both.
        _check_blocks(shape, type_k, "K", "--cache-type-k", lambda la: la.head_dim_k)
    if fa is not FlashAttn.OFF and type_v.quantized:
        _check_blocks(shape, type_v, "V", "--cache-type-v", _v_head)
    return fa is not FlashAttn.OFF


def _cache_layers(shape: ModelShape) -> list[Layer]:
    """The layers llama.cpp gives a row in its KV cache.

    src/llama-kv-cache.cpp:164-244: every layer for which has_kv(il) holds (all of them,
    except the shared-KV tail of gemma3n/gemma4) and that the memory's filter keeps (the
    attention layers of a hybrid; none in a recurrent model) gets K and V tensors, even a
    layer with no KV heads (deci's attention-free layers): its K row is 0 wide, its V row is
    the widest V row when V is stored transposed.
    """
    arch = shape.architecture
    if arch in _RECURRENT_ARCHS:
        return []
    keep_empty = arch not in _HYBRID_ARCHS and arch not in _SHARED_KV_ARCHS
    return [
        la for la in shape.layers if la.has_kv or (keep_empty and la.kind is LayerKind.NO_CACHE)
    ]


def _check_blocks(
    shape: ModelShape, ctype: CacheType, which: str, flag: str, dim: Callable[[Layer], int]
) -> None:
    """Refuse when a layer's head size is not a whole number of `ctype` blocks."""
    for la in shape.layers:
        size = dim(la)
        if la.has_kv and size % ctype.block_elements:
            _refuse(
                f"{flag} {ctype.name} stores blocks of {ctype.block_elements} but the model's "
                f"{which} head size is {size}: use f16, bf16 or f32 for {flag}"
            )


def _v_head(la: Layer) -> int:
    """The V head size checked against a quantized V type. llama.cpp checks an MLA layer's
    value_length (kv_lora_rank, 512 in released models); the shape keeps no V for it (0)."""
    return la.head_dim_v


def _v_width(la: Layer) -> int:
    """A layer's V row in elements (0 for MLA, which stores only K)."""
    return 0 if la.kind is LayerKind.MLA else la.kv_heads * la.head_dim_v


def _layer_bytes(
    layers: Sequence[Layer], rows: int, type_k: CacheType, type_v: CacheType, v_row: int | None
) -> tuple[int, int]:
    """K and V bytes of `layers` with `rows` cells (cells x streams) each.

    src/llama-kv-cache.cpp:208-234: K is [kv_heads x head_dim_k, cells, streams] of type_k,
    V likewise (or the widest V row when `v_row` is given); MLA layers have no V (has_v =
    !is_mla). Sizes are ggml_nbytes, i.e. row bytes x rows.
    """
    k = sum(type_k.row_bytes(la.kv_heads * la.head_dim_k) for la in layers) * rows
    v = 0
    for la in layers:
        if la.kind is LayerKind.MLA:
            continue
        width = la.kv_heads * la.head_dim_v if v_row is None else v_row
        v += type_v.row_bytes(width)
    return k, v * rows


def _pad(value: int, multiple: int) -> int:
    """GGML_PAD: `value` rounded up to a multiple."""
    return -(-value // multiple) * multiple


def _refuse(detail: str) -> NoReturn:
    """Raise llama.cpp's refusal."""
    raise EngineRefuses(message=f"llama.cpp refuses: {detail}.", engine=_ENGINE, detail=detail)


def _known_type(name: str, flag: str) -> CacheType:
    """The cache type called `name`, or the refusal llama-server gives."""
    ctype = CACHE_TYPES.get(name)
    if ctype is None:
        _refuse(
            f"{flag} {name} is not a cache type llama-server takes: use one of "
            + ", ".join(CACHE_TYPES)
        )
    return ctype


def _cache_type(args: Sequence[str], names: Sequence[str]) -> str:
    """A cache-type flag's value (f16 when absent), checked against llama-server's list."""
    value = get_arg(args, names)
    if value is None:
        return "f16"
    _known_type(value, names[0])
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
        _refuse(
            "--flash-attn needs a value in this llama-server: give --flash-attn on, off or auto"
        )
    fa = _FLASH_ATTN_WORDS.get(value.strip().lower())
    if fa is None:
        _refuse(f"--flash-attn {value!r} is not on, off or auto")
    return fa


def _int_arg(args: Sequence[str], names: Sequence[str], default: int) -> int:
    """A flag's whole-number value; `default` when absent; refused when not a number."""
    value = get_arg(args, names)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        _refuse(f"{names[0]} {value!r} is not a whole number")


def _positive(args: Sequence[str], names: Sequence[str], default: int) -> int:
    """A whole-number flag that must be at least 1."""
    value = _int_arg(args, names, default)
    if value < 1:
        _refuse(f"{names[0]} {value} must be at least 1")
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
        _refuse(f"{names[0]} {value!r} is not on or off")
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
