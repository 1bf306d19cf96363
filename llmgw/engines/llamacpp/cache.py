"""llama.cpp's cache: what llama-server allocates for a model's KV, sliding-window and recurrent
state, and what it refuses.

Every rule is written from reading llama.cpp as vendored in llama-cpp-python 0.3.36 (llama.cpp
commit 0c1e57098bba43ac29e6e3b677cdceebdd22334f); file:line references are to that tree. None is
copied. tests/oracle/ loads models in that llama.cpp and checks these numbers against what it
prints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from llmgw.engines.llamacpp.grammar import (
    CacheType,
    FlashAttn,
    LlamaCppSettings,
    known_type,
    refuse,
    settings_from_args,
)
from llmgw.shape import Layer, LayerKind, ModelShape

# src/llama-context.cpp:290 and src/llama-kv-cache-iswa.cpp:73 pad cache sizes to 256 cells.
CELL_PAD = 256
# src/llama-cparams.h:8: LLAMA_MAX_SEQ; src/llama-context.cpp:101 refuses more sequences.
MAX_SEQUENCES = 256
# Recurrent state (r and s) is allocated in f32 (src/llama-model.cpp:2669-2678, create_memory).
STATE_DTYPE_BYTES = 4

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
    {"minimax-m3", "glm-dsa", "glm5-next", "hy_v4", "dots3note", "deepseek4"}
)
# src/llama-model.cpp create_memory and src/llama-kv-cache-dsa.cpp: deepseek32's memory is its
# MLA cache plus an indexer cache of one K head of indexer_head_size per trunk layer (the layers'
# `indexer_dim`), at the K type, with as many cells.
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
    indexer_k_bytes: int = 0
    """The sparse-attention indexer's key cache (deepseek32), printed as a second cache."""

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
        return self.full_bytes + self.swa_bytes + self.recurrent_bytes + self.indexer_k_bytes


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
    type_k = known_type(settings.cache_type_k, "--cache-type-k")
    type_v = known_type(settings.cache_type_v, "--cache-type-v")
    seqs = settings.slots
    if not 1 <= seqs <= MAX_SEQUENCES:
        refuse(f"--parallel {seqs} is outside 1..{MAX_SEQUENCES}, the sequences llama.cpp holds")
    mla = any(la.kind is LayerKind.MLA for la in shape.layers)
    if (mla or shape.architecture in _SAME_KV_TYPE_ARCHS) and type_k.name != type_v.name:
        # src/llama-context.cpp:3835-3838.
        refuse(
            f"{shape.architecture} refuses different cache types for K ({type_k.name}) and V "
            f"({type_v.name}): give --cache-type-v {type_k.name}"
        )
    flash = _resolve_fa(shape, settings, type_k, type_v)

    n_ctx = settings.ctx_size_tokens
    if n_ctx == 0:
        if shape.trained_context <= 0:
            # src/llama-context.cpp:3811-3813.
            refuse("the model does not say its trained context: give --ctx-size")
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
    indexer = sum(type_k.row_bytes(la.indexer_dim) for la in full if la.indexer_dim)
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
        indexer_k_bytes=indexer * full_cells * streams,
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
            refuse("--split-mode tensor needs flash attention: drop --flash-attn off")
        fa = FlashAttn.ON
    if type_v.quantized:
        if shape.architecture in _NO_FLASH_ATTN_ARCHS:
            refuse(
                f"{shape.architecture} runs without flash attention, which a quantized V cache "
                f"({type_v.name}) needs: give --cache-type-v f16"
            )
        if fa is FlashAttn.OFF:
            refuse(
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
            refuse(
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


def llamacpp_layer_bytes(
    shape: ModelShape, settings: LlamaCppSettings, cache: LlamaCppCache | None = None
) -> list[int]:
    """Each layer's share of what `llamacpp_cache` allocates (its K and V rows in the full or
    SWA cache, and its recurrent state), in layer order; they sum to `total_bytes`.

    llama.cpp creates each layer's cache tensors in the buffer of the device the layer is
    assigned to (src/llama-kv-cache.cpp:212-219: `model.dev_layer(il)` when offloading KQV,
    the default), so a device's KV is the sum over its layers. `cache` is
    `llamacpp_cache(shape, settings)` when the caller has it already.

    Raises:
        EngineRefuses: settings llama.cpp refuses.
    """
    if cache is None:
        cache = llamacpp_cache(shape, settings)
    if shape.architecture in _NO_MEMORY_ARCHS:
        return [0] * shape.block_count
    type_k = known_type(settings.cache_type_k, "--cache-type-k")
    type_v = known_type(settings.cache_type_v, "--cache-type-v")
    cached = {id(la) for la in _cache_layers(shape)}
    v_max = max((_v_width(la) for la in shape.layers if la.has_kv), default=0)
    v_row = None if cache.flash_attn else v_max
    seqs = max(1, settings.slots)
    sized: dict[int, int] = {}  # by id: the shape shares one object per distinct layer
    out = []
    for la in shape.layers:
        bytes_ = sized.get(id(la))
        if bytes_ is None:
            bytes_ = la.state_bytes * seqs
            if id(la) in cached:
                cells = cache.swa_cells if la.kind is LayerKind.SLIDING else cache.full_cells
                k, v = _layer_bytes([la], cells * cache.streams, type_k, type_v, v_row)
                bytes_ += k + v
                if la.indexer_dim and la.kind is not LayerKind.SLIDING:
                    bytes_ += type_k.row_bytes(la.indexer_dim) * cells * cache.streams
            sized[id(la)] = bytes_
        out.append(bytes_)
    return out
