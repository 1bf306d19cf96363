"""What engines that run the model in PyTorch (vLLM, SGLang, TensorRT-LLM's PyTorch backend)
hold beside weights and KV: the activation peak of a profiling forward pass and of the
sampler, memory outside torch, CUDA graphs. Each figure comes with its margin in bytes.

The forward pass's peak is a sum of the tensors alive at once per token, from the model's
widths (`llmgw.shape.Compute`):
- 3 × hidden × 2 B: the residual stream, the layer's input and its normed copy;
- the widest sublayer on the card: the dense MLP's gate/up projection and its activation
  (2 × I/tp + I/tp elements), the fused-expert buffers of a mixture of experts (per routed
  expert: 2 × I_e and I_e, plus its hidden-sized output; vLLM fused_moe.py's
  intermediate_cache1/2/3) with the router's fp32 logits, or attention's q, k, v and output.
gt-023/024 (vLLM V0, Llama-3.1-8B, 20000 and 29000 profiled tokens) measured 2.07 and 2.99
GiB; this sum gives 110,592 B a token: 2.06 and 2.99 GiB.

Each constant names where it comes from: a ground-truth row
(tests/fixtures/ground_truth/observations.jsonl, "gt-NNN"), an engine log or source file.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.cardclass import GIB, MIB
from llmgw.engines.memo import sizing_memo
from llmgw.shape import Compute, LayerKind, ModelShape

ACTIVATION_BYTES = 2
"""Bytes of an activation element (bf16/fp16 models)."""

HIDDEN_COPIES = 3
"""Hidden-sized tensors alive through a layer: residual, input, normed input (gt-023/024)."""

MLP_COPIES = 3
"""MLP elements per intermediate unit alive at once: gate and up (2) and the activation's
output (1) (gt-023/024)."""

ROUTER_LOGIT_BYTES = 4
"""A router logit per expert per token, fp32 (vLLM fused_moe topk softmax input)."""

FUSED_MOE_CHUNK_TOKENS = 32768
"""vLLM's fused_moe runs at most this many tokens at once (VLLM_FUSED_MOE_CHUNK_SIZE)."""

FALLBACK_WIDTH = 4096
"""Model width assumed when the shape gives neither widths nor attention heads (a 7-8B
model's hidden size)."""

FALLBACK_INTERMEDIATE_RATIO = 5.3
"""MLP width / hidden width assumed when the config does not say: the widest of the fixtures'
dense models (Qwen2.5-7B 18944 / 3584), so the peak errs large."""

FALLBACK_VOCAB = 152064
"""Vocabulary assumed when the config does not say: Qwen2.5's, among the largest common ones."""

VOCAB_PAD = 64
"""vLLM pads the vocabulary of its LM head to a multiple of 64 (vocab_parallel_embedding.py
DEFAULT_VOCAB_PADDING_SIZE)."""

MLA_VALUE_HEAD_DIM = 128
"""Value head size of DeepSeek-style MLA when the shape does not carry its expanded dims
(DeepSeek-V2/V3 v_head_dim, models/hf INDEX)."""

FORWARD_MARGIN = 0.10
"""The forward-pass term's uncertainty with the widths known (gt-023/024 agree within 1 %;
fused kernels and compiled graphs may keep more)."""

MOE_MARGIN = 0.30
"""Extra uncertainty of a mixture of experts' forward pass (quantised-expert buffers, expert
parallel all-to-all buffers): gt-039 peaked 1.4 GiB where this model gives about 1.2."""

VISION_MARGIN = 0.50
"""Extra uncertainty for a multimodal model: vLLM profiles its encoder on dummy items before
the language model (gpu_model_runner.py profile_run), whose peak the widths do not give."""

GUESSED_MARGIN = 0.50
"""Uncertainty of a forward pass whose widths were not read (fallback widths)."""


def activation_width(shape: ModelShape) -> int:
    """The model's hidden width: the config's, else attention heads × head size (MLA counts
    its value heads), else FALLBACK_WIDTH."""
    if shape.compute is not None and shape.compute.hidden_size > 0:
        return shape.compute.hidden_size
    for layer in shape.layers:
        if shape.attention_heads <= 0:
            break
        if layer.kind is LayerKind.MLA:
            value_dim = shape.mla_expanded[1] if shape.mla_expanded else MLA_VALUE_HEAD_DIM
            return shape.attention_heads * value_dim
        if layer.has_kv:
            return shape.attention_heads * max(layer.head_dim_k, layer.head_dim_v)
    return FALLBACK_WIDTH


def vocab_size(shape: ModelShape) -> int:
    """The vocabulary, padded as vLLM's LM head pads it (FALLBACK_VOCAB when not known)."""
    vocab = shape.compute.vocab_size if shape.compute and shape.compute.vocab_size else 0
    vocab = vocab or FALLBACK_VOCAB
    return -(-vocab // VOCAB_PAD) * VOCAB_PAD


def _cdiv(a: int, b: int) -> int:
    return -(-a // max(b, 1))


@dataclass(frozen=True)
class ForwardCost:
    """Bytes a profiled token holds at the forward pass's peak on one card, split into the
    part every token pays and the expert part (capped by the fused-MoE chunk), and the
    relative margin of the figure."""

    per_token: int
    expert_per_token: int
    margin: float

    def bytes(self, tokens: int) -> int:
        """The forward pass's peak over `tokens` tokens."""
        return tokens * self.per_token + min(tokens, FUSED_MOE_CHUNK_TOKENS) * (
            self.expert_per_token
        )


_COSTS_KEPT = 64
"""Settings remembered per shape (tensor parallel sizes x expert parallel asked of it)."""


def forward_cost(shape: ModelShape, *, tp: int, expert_parallel: bool = False) -> ForwardCost:
    """What a token of the profiling pass holds on one of `tp` cards (see the module text).

    Worked out once per shape and setting (the context changes none of it): kept in the
    shape's `sizing_memo` (`llmgw.engines.memo`), bounded."""
    key = ("forward", tp, expert_parallel)
    memo = sizing_memo(shape)
    hit = memo.get(key)
    if isinstance(hit, ForwardCost):
        return hit
    cost = _forward_cost(shape, tp=tp, expert_parallel=expert_parallel)
    if len(memo) >= _COSTS_KEPT:
        memo.clear()
    memo[key] = cost
    return cost


def _forward_cost(shape: ModelShape, *, tp: int, expert_parallel: bool) -> ForwardCost:
    """`forward_cost` itself."""
    compute = shape.compute or Compute()
    hidden = activation_width(shape)
    known = compute.hidden_size > 0
    margin = FORWARD_MARGIN if known else GUESSED_MARGIN
    base = HIDDEN_COPIES * hidden * ACTIVATION_BYTES
    heads = _cdiv(shape.attention_heads, tp)
    kv_layer = next((la for la in shape.layers if la.has_kv), None)
    attention = 0
    if kv_layer is not None and shape.attention_heads > 0:
        head = max(kv_layer.head_dim_k, kv_layer.head_dim_v, 1)
        kv = 1 if kv_layer.kind is LayerKind.MLA else _cdiv(kv_layer.kv_heads, tp)
        attention = (2 * heads + 2 * kv) * head * ACTIVATION_BYTES
    dense = 0
    expert = 0
    if compute.experts > 0 and compute.expert_intermediate_size > 0:
        per_rank = (
            compute.expert_intermediate_size
            if expert_parallel
            else _cdiv(compute.expert_intermediate_size, tp)
        )
        routed = compute.experts_per_token or 1
        expert = routed * (MLP_COPIES * per_rank + hidden) * ACTIVATION_BYTES
        expert += compute.experts * ROUTER_LOGIT_BYTES
        if compute.shared_intermediate_size:
            expert += MLP_COPIES * _cdiv(compute.shared_intermediate_size, tp) * ACTIVATION_BYTES
        if compute.dense_layers and compute.intermediate_size:
            dense = MLP_COPIES * _cdiv(compute.intermediate_size, tp) * ACTIVATION_BYTES
        margin += MOE_MARGIN
    else:
        width = compute.intermediate_size or int(hidden * FALLBACK_INTERMEDIATE_RATIO)
        dense = MLP_COPIES * _cdiv(width, tp) * ACTIVATION_BYTES
    if compute.vision:
        margin += VISION_MARGIN
    if expert > max(attention, dense):
        return ForwardCost(base, expert, margin)
    return ForwardCost(base + max(attention, dense), 0, margin)


NON_TORCH_BYTES = 256 * MIB
"""Memory outside torch that grows while the engine loads and profiles (cuBLAS and NCCL
workspaces, the allocator): gt-038 0.06 GiB, gt-039 0.21, gt-023 0.35, gt-028 0.25, vLLM 0.10.2
on an H100 0.07, vLLM v0.31.0 on an A100 15.26 − 15.0 = 0.26 (consumed less weights); the
figure most of them stay under."""

NON_TORCH_MARGIN_BYTES = 192 * MIB
"""How far non-torch memory strays from NON_TORCH_BYTES (0.06 to 0.35 GiB seen)."""

CUDA_GRAPH_BYTES_PER_LAYER = 20 * MIB
"""CUDA graph memory per decoder layer of a dense model as captured: gt-036 0.72 GiB over 40
layers (18.4 MiB), gt-038 0.48 over 28 (17.6), vLLM 0.10.2 llava-v1.6-mistral-7b 0.67 over 32
(21.4)."""

CUDA_GRAPH_BYTES_PER_MOE_LAYER = 40 * MIB
"""The same for a mixture of experts: gt-039 3.45 GiB over 94 layers (37.6 MiB); gt-049
(SGLang, dense) 0.93 over 64 lies between."""


def layers_per_stage(shape: ModelShape, pp: int) -> int:
    """Decoder layers of the fullest of `pp` pipeline stages."""
    return -(-shape.block_count // max(pp, 1))


def is_moe(shape: ModelShape) -> bool:
    """Whether the shape is a mixture of experts."""
    return shape.compute is not None and shape.compute.experts > 0


def cuda_graph_bytes(shape: ModelShape, layers: int, per_layer_dense: int = 0) -> int:
    """CUDA graphs as captured for `layers` decoder layers."""
    if is_moe(shape):
        return layers * CUDA_GRAPH_BYTES_PER_MOE_LAYER
    return layers * (per_layer_dense or CUDA_GRAPH_BYTES_PER_LAYER)


SAMPLER_FALLBACK_BYTES = GIB
"""The sampler's share of a profiling pass for an engine whose sampler is not modelled
(TensorRT-LLM): about what vLLM's takes over 256 requests of a 152k vocabulary (gt-038)."""
