"""llama.cpp's memory beyond weights and caches on each card: its compute buffers, and the
margin llama-server keeps free on a card."""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.engines.llamacpp.cache import LlamaCppCache, llamacpp_cache
from llmgw.engines.llamacpp.grammar import MIB, settings_from_args
from llmgw.shape import Compute, ModelShape

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
# With the model's widths known (`ModelShape.compute`: a GGUF's embedding_length,
# feed_forward_length, expert counts and widths): hidden-size rows (residual, norm, attention
# output and its projection, the FFN's output, the expert-weighted sum) beside the FFN's gate,
# up and activation at its width on the card: the dense MLP's, or the routed experts' together
# (src/llama-graph.cpp build_ffn / build_moe_ffn: [n_ff, tokens] f32 each, for every routed
# expert of each token in build_moe_ffn) with the shared expert and the router's logits; the
# larger of that and ACTIVATION_ROWS hidden rows.
HIDDEN_ROWS = 6
MLP_ROWS = 3
# Logits of one ubatch: ubatch x vocab x f32. Without the vocabulary in the shape, 262144
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
    the mask, activations (`activation_width`: from the model's widths when the shape has
    them), logits over its vocabulary (262144 tokens when not known; counted on every card),
    and a fixed 64 MiB.

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
    compute = shape.compute or Compute()
    hidden = compute.hidden_size or max(heads * max(shape.head_dim_k, shape.head_dim_v), 1)
    # src/llama-context.cpp:628-629 (sched_reserve): the worst case is one ubatch over the
    # widest cache (the full one; the SWA cache is never wider) of each stream; splitting the
    # ubatch over the streams rounds each share up.
    cell_tokens = max(cache.full_cells, cache.swa_cells) * (ubatch + cache.streams)
    scores = 0 if cache.flash_attn else cell_tokens * heads * SCORE_BYTES
    mask = cell_tokens * MASK_BYTES
    activations = activation_width(compute, hidden) * ubatch * SCORE_BYTES
    logits = ubatch * (compute.vocab_size or VOCAB_BOUND) * SCORE_BYTES
    return scores + mask + activations + logits + FIXED_OVERHEAD_BYTES


def activation_width(compute: Compute, hidden: int) -> int:
    """f32 values per ubatch token alive at a layer's peak: ACTIVATION_ROWS hidden rows, or,
    with the FFN's widths known, HIDDEN_ROWS hidden rows beside MLP_ROWS rows of the widest
    FFN (dense, or the routed experts' with the shared expert and the router), whichever is
    larger."""
    dense = compute.intermediate_size if not compute.experts or compute.dense_layers else 0
    routed = 0
    if compute.experts:
        width = compute.expert_intermediate_size or compute.intermediate_size
        routed = max(compute.experts_per_token, 1) * width + compute.shared_intermediate_size
        routed += compute.experts  # the router's logits (and probabilities beside them)
    ffn = max(dense, routed)
    return max(ACTIVATION_ROWS * hidden, HIDDEN_ROWS * hidden + MLP_ROWS * ffn)
