"""The overheads of engines that run the model in PyTorch (vLLM, SGLang, TensorRT-LLM's
PyTorch backend): the activation peak of a profiling pass, memory outside torch, CUDA graphs.

Each constant names where it comes from: a ground-truth row
(tests/fixtures/ground_truth/observations.jsonl, "gt-NNN") or an engine's source file.
"""

from __future__ import annotations

from llmgw.cardclass import GIB, MIB
from llmgw.shape import LayerKind, ModelShape

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

FALLBACK_WIDTH = 4096
"""Model width assumed for activations when the shape has no attention heads (recurrent
models): a 7-8B model's hidden size."""

MLA_VALUE_HEAD_DIM = 128
"""Value head size of DeepSeek-style MLA when the shape does not carry its expanded dims
(DeepSeek-V2/V3 v_head_dim, models/hf INDEX)."""


def activation_width(shape: ModelShape) -> int:
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


def torch_overhead_bytes(shape: ModelShape, *, batch_tokens: int, layers: int, eager: bool) -> int:
    """Activation peak of a `batch_tokens` forward pass + non-torch memory + CUDA graphs of
    `layers` layers (none when `eager`)."""
    activation = batch_tokens * activation_width(shape) * ACTIVATION_BYTES_PER_TOKEN_WIDTH
    graphs = 0 if eager else layers * CUDA_GRAPH_BYTES_PER_LAYER
    return activation + SAMPLER_BYTES + NON_TORCH_BYTES + graphs


def layers_per_stage(shape: ModelShape, pp: int) -> int:
    """Decoder layers of the fullest of `pp` pipeline stages."""
    return -(-shape.block_count // max(pp, 1))
