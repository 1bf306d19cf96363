"""Tensor parallel validity: which card counts vLLM and SGLang (and TensorRT-LLM, which shards
the same way) can load a model on.

Each check restates an assertion the engines make while building the model's layers (read in
vLLM and SGLang, nothing copied):

- attention heads: vllm/config/model.py `verify_with_parallel_config` ("Total number of
  attention heads (X) must be divisible by tensor parallel size (Y)"; ground truth gt-046,
  gt-048); SGLang's ModelConfig checks the same before loading.
- KV heads: `QKVParallelLinear` (vllm/model_executor/layers/linear.py, and SGLang's copy in
  python/sglang/srt/layers/linear.py): tp <= kv_heads gives each rank kv_heads / tp heads
  (`divide` asserts divisibility), tp > kv_heads replicates each head tp / kv_heads times
  (again `divide`), so tp must divide kv_heads or be a multiple of it.
- vocabulary: `VocabParallelEmbedding` (vllm/model_executor/layers/vocab_parallel_embedding.py)
  pads the vocabulary to a multiple of 64 (DEFAULT_VOCAB_PADDING_SIZE) and divides that by tp
  (Mixtral-8x22B's 32768 at tp 3: "32768 is not divisible by 3", vllm-project/vllm#6385).
- MLP widths: `MergedColumnParallelLinear` (gate/up, asserts every output size divides by
  tp) and `RowParallelLinear` (down, `divide(input_size, tp)`) for the dense MLP and shared
  experts; `FusedMoE` (vllm/model_executor/layers/fused_moe/layer.py,
  `intermediate_size_per_partition = divide(intermediate_size, tp)`; SGLang's fused_moe_triton
  likewise) for routed experts, unless expert parallel keeps experts whole.
- fp8 block quantization (`weight_block_size` [n, k]):
  vllm/model_executor/layers/quantization/utils/fp8_utils.py `validate_fp8_block_shape` (each
  column-parallel output shard a multiple of block_n; a row-parallel input shard, when tp > 1,
  of block_k) and quantization/fp8.py `Fp8MoEMethod.create_weights` ("The output_size of gate's
  and up's weight = 192 is not divisible by weight quantization block_n = 128", seen for
  Qwen3-235B-FP8 and MiniMax-M2 at TP8 in public reports); SGLang raises the same message.
- GPTQ/AWQ groups: quantization/gptq.py and awq.py refuse a row-parallel input shard that is
  not whole groups ("The input size is not aligned with the quantized weight shape. This can be
  caused by too large tensor parallel size."); the Marlin kernels vLLM converts them to on
  Ampere and newer (quantization/utils/marlin_utils.py `verify_marlin_supports_shape`) also need
  output shards of 64 and input shards of 128 channels (GPTQ_MARLIN_MIN_THREAD_N/K).
- vision encoders: the ViT attention of multimodal models (e.g. vllm/model_executor/models/
  qwen2_5_vl.py, `dist_utils.divide(num_heads, world_size)`; SGLang's layers/attention/
  vision.py VisionAttention the same) splits its own heads and MLP, unless the encoder runs
  data parallel (vLLM `--mm-encoder-tp-mode data`) or is InternViT, whose attention vLLM
  replicates on every rank when its heads do not divide (intern_vit.py InternSdpaAttention,
  vllm-project/vllm#8061; NVLM-D pads them with 7 dummy heads instead).
- recurrent mixers: Mamba-2 (vllm/model_executor/layers/mamba/mamba_mixer2.py: "Tensor
  parallel world size must divide num heads", groups divisible or exactly 1), Mamba-1 inner
  width (column-parallel in_proj), gated delta net (Qwen3-Next: key and value heads divided by
  tp, vllm/model_executor/models/qwen3_next.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.shape import LayerKind, ModelShape

DEFAULT_MAX_TP = 8
"""The largest count `valid_tp_counts` lists by default: eight cards is the largest common
node (DGX/HGX), and the counts a planner offers are counts of one node's cards."""

VOCAB_PADDING = 64
"""DEFAULT_VOCAB_PADDING_SIZE: the vocabulary is padded to a multiple of this before the split."""
MARLIN_MIN_N = 64
"""GPTQ_MARLIN_MIN_THREAD_N: output channels a Marlin shard must be a multiple of."""
MARLIN_MIN_K = 128
"""GPTQ_MARLIN_MIN_THREAD_K: input channels a Marlin shard must be a multiple of."""


@dataclass(frozen=True)
class TpOptions:
    """What the serving arguments change about the checks."""

    expert_ranks: int = 1
    """Ranks the experts are dealt out to whole (vLLM --enable-expert-parallel: all of them;
    SGLang --ep-size N: N): the expert width is split over tp / expert_ranks."""
    vision_data_parallel: bool = False
    """The vision encoder replicated on every rank (vLLM --mm-encoder-tp-mode data)."""
    attention_dp: int = 1
    """Data-parallel attention groups (SGLang --enable-dp-attention --dp-size D): the heads are
    split over tp / D ranks, and tp must be a multiple of D."""


def splits_heads(tp: int, attention_heads: int, kv_heads: int) -> bool:
    """Whether tensor parallel over `tp` cards splits the attention and KV heads.

    Args:
        tp: the tensor parallel size (cards per replica).
        attention_heads: the model's query heads; 0 when unknown (then not checked).
        kv_heads: the model's KV heads; 0 when unknown or none (then not checked).
    Returns:
        True when `tp` divides the query heads and divides or is a multiple of the KV heads;
        False for `tp` < 1.
    """
    if tp < 1:
        return False
    return _heads_failure(tp, attention_heads, kv_heads) is None


def _heads_failure(tp: int, attention_heads: int, kv_heads: int) -> str | None:
    if attention_heads > 0 and attention_heads % tp:
        return f"its {attention_heads} attention heads do not divide by {tp}"
    if kv_heads > 0 and kv_heads % tp and tp % kv_heads:
        return (
            f"its {kv_heads} KV heads neither divide by {tp} nor replicate evenly over {tp} cards"
        )
    return None


def tp_failure(tp: int, shape: ModelShape, options: TpOptions = TpOptions()) -> str | None:
    """The first check tensor parallel over `tp` cards fails for `shape`, in words; None when
    every check passes (see the module's docstring for each rule's source).

    Args:
        tp: the tensor parallel size.
        shape: the model's shape (its `parallel` dims; 0 fields are not checked).
        options: what the serving arguments change.
    Returns:
        A phrase naming the failed check ("its 14336 MLP channels do not divide by 3"), or None.
    """
    if tp < 1:
        return f"{tp} is not a card count"
    if tp == 1:
        return None
    dims = shape.parallel
    dp = max(options.attention_dp, 1)
    if tp % dp:
        return f"{tp} cards are not a multiple of the {dp} data-parallel attention groups"
    attn_tp = tp // dp
    # In the order the engine meets them: the config's heads, the embedding, then each layer.
    if shape.attention_heads > 0 and shape.attention_heads % attn_tp:
        return f"its {shape.attention_heads} attention heads do not divide by {attn_tp}"
    vocab = -(-dims.vocab // VOCAB_PADDING) * VOCAB_PADDING
    if vocab % tp:
        return f"its vocabulary of {dims.vocab} rows (padded to {vocab}) does not divide by {tp}"
    failure = _heads_failure(attn_tp, shape.attention_heads, shape.kv_heads)
    if failure is not None:
        return failure
    expert_tp = max(tp // max(options.expert_ranks, 1), 1)
    checks: list[tuple[str, int]] = [
        ("dense MLP channels (intermediate_size)", dims.dense_intermediate),
        ("shared-expert channels", dims.shared_intermediate),
    ]
    if not options.vision_data_parallel:
        if not dims.vision_pads_heads:
            checks.append(("vision encoder heads", dims.vision_heads))
        checks.append(("vision encoder MLP channels", dims.vision_intermediate))
    checks += [
        ("linear-attention key heads", dims.linear_k_heads),
        ("linear-attention value heads", dims.linear_v_heads),
        ("Mamba heads", dims.ssm_heads),
        ("Mamba inner channels", dims.ssm_inner),
    ]
    for what, size in checks:
        if size > 0 and size % tp:
            return f"its {size} {what} do not divide by {tp}"
    if dims.expert_intermediate > 0 and dims.expert_intermediate % expert_tp:
        return (
            f"its {dims.expert_intermediate} expert MLP channels (moe_intermediate_size) do not "
            f"divide by {expert_tp}"
        )
    if dims.ssm_groups > 1 and dims.ssm_groups % tp:
        return f"its {dims.ssm_groups} Mamba groups neither divide by {tp} nor are 1"
    return _quant_failure(tp, shape, options)


def _quant_failure(tp: int, shape: ModelShape, options: TpOptions) -> str | None:
    """The quantized weights' shard checks (fp8 blocks, GPTQ/AWQ groups and Marlin tiles)."""
    dims = shape.parallel
    quant = dims.quant
    # (what, column-parallel output shards, row-parallel input shard) of each sharded linear.
    expert_tp = max(tp // max(options.expert_ranks, 1), 1)
    linears: list[tuple[str, tuple[int, ...], int, int]] = []
    for what, width, ranks in (
        ("dense MLP", dims.dense_intermediate, tp),
        ("shared-expert MLP", dims.shared_intermediate, tp),
        ("expert MLP", dims.expert_intermediate, expert_tp),
    ):
        if width > 0 and ranks > 1:
            linears.append((what, (width // ranks,), width // ranks, ranks))
    attn_tp = max(tp // max(options.attention_dp, 1), 1)
    if shape.attention_heads > 0 and dims.q_head_dim > 0 and attn_tp > 1:
        q = shape.attention_heads // attn_tp * dims.q_head_dim
        o = shape.attention_heads // attn_tp * (dims.o_head_dim or dims.q_head_dim)
        outputs: tuple[int, ...] = (q,)
        if shape.kv_heads > 0 and not any(la.kind is LayerKind.MLA for la in shape.layers):
            # QKVParallelLinear's K and V shards: kv_heads / tp heads, at least one.
            outputs += (max(shape.kv_heads // attn_tp, 1) * dims.q_head_dim,) * 2
        linears.append(("attention", outputs, o, attn_tp))
    block_n, block_k = quant.block
    for what, outputs, inputs, ranks in linears:
        if block_n > 0:
            for size in outputs:
                if size % block_n:
                    return (
                        f"its {what} shard of {size} output channels is not whole fp8 blocks "
                        f"of {block_n} split {ranks} ways"
                    )
        if block_k > 0 and inputs % block_k:
            return (
                f"its {what} shard of {inputs} input channels is not whole fp8 blocks of "
                f"{block_k} split {ranks} ways"
            )
        marlin = quant.method in ("gptq", "awq")
        if marlin and (any(size % MARLIN_MIN_N for size in outputs) or inputs % MARLIN_MIN_K):
            return (
                f"its {what} shard ({outputs[0]} out, {inputs} in) is not the Marlin "
                f"kernel's {MARLIN_MIN_N}x{MARLIN_MIN_K} tiles split {ranks} ways"
            )
        if quant.group > 0 and inputs % quant.group:
            return (
                f"its {what} shard of {inputs} input channels is not whole {quant.method} "
                f"groups of {quant.group} split {ranks} ways"
            )
    return None


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


def valid_counts(
    shape: ModelShape, max_count: int = DEFAULT_MAX_TP, options: TpOptions = TpOptions()
) -> tuple[int, ...]:
    """The tensor parallel sizes from 1 to `max_count` that pass every check of `tp_failure`."""
    return tuple(n for n in range(1, max_count + 1) if tp_failure(n, shape, options) is None)
