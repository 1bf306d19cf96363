"""llama.cpp's memory beyond weights and caches on each card: its compute buffers, and the
margin llama-server keeps free on a card."""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.engines.llamacpp.cache import LlamaCppCache, llamacpp_cache
from llmgw.engines.llamacpp.grammar import MIB, settings_from_args
from llmgw.shape import ModelShape

LLAMACPP_RESERVE_BYTES = 1024 * MIB
"""What a llama-server card keeps free: `--fit-target` "target margin per device ...
default: 1024" MiB (llama-server --help, quoted in ggml-org/llama.cpp#18390)."""

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


def llamacpp_overhead_bytes(
    shape: ModelShape, args: Sequence[str], cards: int, *, cache: LlamaCppCache | None = None
) -> int:
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
        cache: `llamacpp_cache` for `args`, when the caller has it.
    Returns:
        Bytes to reserve on each card (in RAM for a CPU profile).
    Raises:
        EngineRefuses: settings llama.cpp refuses.
    """
    del cards  # one layer's worst case on every card, see above
    if cache is None:
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
