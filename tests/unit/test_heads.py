"""Tensor parallel held to the heads: the counts vLLM, SGLang and TensorRT-LLM accept."""

from __future__ import annotations

import pytest

from llmgw.engines.heads import splits_heads, valid_tp_counts


@pytest.mark.parametrize(
    ("tp", "attention_heads", "kv_heads", "splits"),
    [
        (1, 32, 8, True),  # Llama-3.1-8B on one card
        (8, 32, 8, True),  # one KV head a card
        (4, 64, 4, True),  # Qwen3-235B-A22B at TP4 (gt-039)
        (8, 64, 4, True),  # KV heads replicated on 2 cards each
        (3, 40, 40, False),  # Llama-2-13B at TP3: 40 heads do not split 3 ways (gt-046)
        (8, 28, 4, False),  # R1-Distill-Qwen-7B at TP8: 28 % 8 != 0 (gt-048)
        (7, 28, 4, False),  # 7 divides 28 heads but neither divides nor is a multiple of 4 KV
        (6, 48, 4, False),  # 6 splits the query heads; 4 KV heads cannot go 6 ways
        (16, 128, 128, True),  # DeepSeek-V3's 128 heads
        (0, 32, 8, False),  # no cards
        (-2, 32, 8, False),
        (3, 0, 0, True),  # unknown heads (a recurrent model) do not constrain
        (3, 24, 0, True),  # no KV heads: only the query heads count
    ],
)
def test_splits_heads(tp: int, attention_heads: int, kv_heads: int, splits: bool) -> None:
    """A count splits the heads iff it divides the query heads and divides or is a multiple
    of the KV heads."""
    assert splits_heads(tp, attention_heads, kv_heads) is splits


@pytest.mark.parametrize(
    ("attention_heads", "kv_heads", "max_count", "counts"),
    [
        (32, 8, 8, (1, 2, 4, 8)),
        (28, 4, 8, (1, 2, 4)),  # gt-048's model: "KV heads=4 further limits TP"
        (40, 40, 8, (1, 2, 4, 5, 8)),  # gt-046's model
        (64, 4, 16, (1, 2, 4, 8, 16)),
        (14, 2, 8, (1, 2)),  # Qwen2.5-1.5B-style: 7 heads a pair, 2 KV heads
        (0, 0, 3, (1, 2, 3)),
        (32, 8, 0, ()),
    ],
)
def test_valid_tp_counts(
    attention_heads: int, kv_heads: int, max_count: int, counts: tuple[int, ...]
) -> None:
    """The counts offered are exactly those up to the node's size that split the heads."""
    assert valid_tp_counts(attention_heads, kv_heads, max_count) == counts


def test_valid_tp_counts_default_is_one_node() -> None:
    """Without a maximum the counts stop at eight cards, the largest common node."""
    assert valid_tp_counts(128, 128) == (1, 2, 4, 8)
