"""Heads and tensor parallel: which card counts split a model's attention and KV heads (the
rule vLLM, SGLang and TensorRT-LLM share)."""

from __future__ import annotations

DEFAULT_MAX_TP = 8
"""The largest count `valid_tp_counts` lists by default: eight cards is the largest common
node (DGX/HGX), and the counts a planner offers are counts of one node's cards."""


def splits_heads(tp: int, attention_heads: int, kv_heads: int) -> bool:
    """Whether tensor parallel over `tp` cards splits the heads the way the engines require.

    vLLM refuses a `tp` that does not divide the attention heads ("Total number of attention
    heads (X) must be divisible by tensor parallel size (Y)", vllm/config/parallel.py, seen in
    ground truth gt-046 and gt-048); its QKV projection then either gives each card
    kv_heads / tp KV heads (tp divides kv_heads) or replicates each KV head on tp / kv_heads
    cards (tp a multiple of kv_heads), and refuses any other count
    (vllm/model_executor/layers/linear.py, QKVParallelLinear). SGLang and TensorRT-LLM shard
    the same way.

    Args:
        tp: the tensor parallel size (cards per replica).
        attention_heads: the model's query heads; 0 when unknown (then not checked).
        kv_heads: the model's KV heads; 0 when unknown or when no layer has KV heads (then
            not checked).
    Returns:
        True when `tp` splits both counts; False for `tp` < 1.
    """
    if tp < 1:
        return False
    if attention_heads > 0 and attention_heads % tp != 0:
        return False
    return kv_heads <= 0 or kv_heads % tp == 0 or tp % kv_heads == 0


def valid_tp_counts(
    attention_heads: int, kv_heads: int, max_count: int = DEFAULT_MAX_TP
) -> tuple[int, ...]:
    """The tensor parallel sizes from 1 to `max_count` that split the heads, ascending.

    Args:
        attention_heads: the model's query heads (0: unknown).
        kv_heads: the model's KV heads (0: unknown).
        max_count: the largest count to consider (e.g. the cards of the largest node).
    Returns:
        The counts for which `splits_heads` holds; always includes 1 when `max_count` >= 1.
    """
    return tuple(n for n in range(1, max_count + 1) if splits_heads(n, attention_heads, kv_heads))
