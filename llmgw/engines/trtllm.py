"""TensorRT-LLM (`trtllm-serve`): its flags, full-width KV blocks, and a budget that leaves the
cache its free fraction of the memory after weights and activations.

Flags as `trtllm-serve --help` spells them (tensorrt_llm/commands/serve.py), with `_`; either
spelling is read as one flag.

The cache's dtype, its free fraction and block size can sit in the YAML that
`--extra_llm_api_options` (alias `--config`) names, under `kv_cache_config` (`dtype`,
`free_gpu_memory_fraction`, `tokens_per_block`). The planner cannot read files on the nodes,
so it reads that YAML only when the flag's value is the YAML itself (an inline mapping, e.g.
`--extra_llm_api_options 'kv_cache_config: {dtype: fp8}'`); when the value is a path, the cache
is sized at the model's dtype (the larger case) and the rules say so. The flag itself is
refused by the node agent (it names a file past the refusal table): the inline form is for
planning a profile another launcher runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from functools import lru_cache

import yaml

from llmgw.cardclass import GIB, MIB
from llmgw.engines.base import CardTotals, Overhead
from llmgw.engines.grammar import ADDRESS_FLAGS, AllowedFlag, Grammar, RefusedFlag
from llmgw.engines.interconnect import nvls_card
from llmgw.engines.kvcache import CachePool, token_bytes_on_card
from llmgw.engines.tensor_parallel import TensorParallelEngine
from llmgw.engines.torch_overhead import (
    NON_TORCH_BYTES,
    NON_TORCH_MARGIN_BYTES,
    SAMPLER_FALLBACK_BYTES,
    cuda_graph_bytes,
    forward_cost,
    layers_per_stage,
)
from llmgw.engines.vllm_memory import NON_TORCH_NCCL_BYTES
from llmgw.engines.vllm_rules import NVLINK_NON_TORCH_MARGIN_BYTES, NVLINK_NON_TORCH_V1
from llmgw.shape import Layer, ModelShape

GRAMMAR = Grammar("trtllm", folds_underscores=True, joined_ok=True, abbreviates=False)

MAX_SEQ_LEN = ("--max_seq_len",)
TP_SIZE = ("--tp_size",)
PP_SIZE = ("--pp_size",)
FREE_GPU_MEMORY_FRACTION = ("--kv_cache_free_gpu_memory_fraction", "--free_gpu_memory_fraction")
MAX_NUM_TOKENS = ("--max_num_tokens",)
EXTRA_OPTIONS = ("--extra_llm_api_options", "--config")
REVISION = ("--revision",)
"""The Hugging Face revision trtllm-serve loads (branch, tag or commit id:
tensorrt_llm/commands/serve.py, its `--revision` option, passed to the LLM API's `revision`)."""

TRTLLM_CACHE_DTYPES: dict[str, Fraction | None] = {
    "auto": None,
    "float16": Fraction(2),
    "fp16": Fraction(2),
    "bfloat16": Fraction(2),
    "bf16": Fraction(2),
    "fp8": Fraction(1),
    "int8": Fraction(1),
}
"""kv_cache_config.dtype values and their element bytes (None: the model's dtype);
TensorRT-LLM's KvCacheConfig.dtype ("auto" by default)."""

TRTLLM_FREE_FRACTION = 0.9
"""KvCacheConfig.free_gpu_memory_fraction default (TensorRT-LLM docs, "How to Change KV Cache
Behavior"): the share of the memory free after weights and activations that the KV cache
takes; gt-052 prints "fraction is set 0.8999999761581421"."""

TRTLLM_TOKENS_PER_BLOCK = 32
"""KV block of the PyTorch backend: gt-052 "Number of tokens per block: 32"."""

TRTLLM_MAX_NUM_TOKENS = 8192
"""`trtllm-serve --max_num_tokens` default: the tokens of the profiling forward pass."""

ALLREDUCE_WORKSPACE_BYTES_UP_TO_TP2 = 16_000_000
ALLREDUCE_WORKSPACE_BYTES_ABOVE_TP2 = 8_000_000
"""The `size` the PyTorch backend's all-reduce fusion workspace is built from: 16,000,000 bytes
at tp <= 2, 8,000,000 above (tensorrt_llm/plugin/plugin.py CustomAllReduceHelper
.max_workspace_size_auto, called by tensorrt_llm/_torch/distributed/ops.py
get_allreduce_workspace on the first all-reduce, i.e. during the profiling pass). Newer trees
take 64 MiB whatever the tp (the helper's rewrite, sized for max_num_tokens x hidden x 2); no
release is known to the planner for that change, so it is not applied."""

ALLREDUCE_BARRIER_BYTES_PER_RANK = 256
"""The fusion workspace's barrier buffer: 256 bytes a rank
(CustomAllReduceHelper.allocate_allreduce_fusion_workspace)."""


def allreduce_workspace_bytes(tp: int) -> int:
    """What TensorRT-LLM's all-reduce fusion workspace takes on each of `tp` ranks (0 at tp 1):
    `allocate_allreduce_fusion_workspace` maps through CUDA IPC (outside torch) one data buffer
    of size x tp, the barriers (256 B a rank) and three Lamport buffers of size x tp each."""
    if tp <= 1:
        return 0
    size = ALLREDUCE_WORKSPACE_BYTES_UP_TO_TP2 if tp <= 2 else ALLREDUCE_WORKSPACE_BYTES_ABOVE_TP2
    return size * tp + ALLREDUCE_BARRIER_BYTES_PER_RANK * tp + 3 * size * tp


def trtllm_collective_bytes(card: CardTotals | None, tp: int) -> tuple[int, int, str]:
    """What tensor parallel over `tp` ranks adds to each card's non-torch memory before
    TensorRT-LLM takes its free fraction, its margin, and the words for the rules.

    TensorRT-LLM reads the card's free memory after its profiling pass
    (tensorrt_llm/_torch/pyexecutor/_util.py: the peak is total less free, torch and non-torch
    alike, with no earlier snapshot taken off), so every collective buffer set up by then
    counts: the all-reduce fusion workspace (`allreduce_workspace_bytes`) and NCCL's
    communicator, which the profiling pass's all-reduces use past the workspace's size. NCCL's
    share is vLLM's measured step for the same library on the same cards (vllm_memory:
    NVLINK_NON_TORCH_V1 on NVLink-SHARP parts, NON_TORCH_NCCL_BYTES elsewhere, with as much
    again as margin since no TensorRT-LLM log at tp > 1 is in the fixtures)."""
    if tp <= 1:
        return 0, 0, ""
    return _collective_bytes(card.name if card is not None else "", tp)


@lru_cache(maxsize=64)
def _collective_bytes(card_name: str, tp: int) -> tuple[int, int, str]:
    """`trtllm_collective_bytes` for a card class and tp, worked out once (sizing asks it for
    every context)."""
    workspace = allreduce_workspace_bytes(tp)
    if card_name and nvls_card(CardTotals(name=card_name)):
        nccl, margin = NVLINK_NON_TORCH_V1, NVLINK_NON_TORCH_MARGIN_BYTES
    else:
        nccl, margin = NON_TORCH_NCCL_BYTES, NON_TORCH_NCCL_BYTES
    words = (
        f"tp {tp}: all-reduce workspace {workspace / MIB:.0f} MiB and NCCL "
        f"{nccl / GIB:.2f} GiB a rank"
    )
    return workspace + nccl, margin, words


# What the node agent refuses to pass (tensorrt_llm/commands/serve.py).
REFUSED: tuple[RefusedFlag, ...] = (
    ADDRESS_FLAGS,
    RefusedFlag(
        ("--trust-remote-code",),
        "it runs Python code shipped with the model repo; allow it in the agent config "
        "(allow_flags) for models you trust",
    ),
    RefusedFlag(
        ("--extra-llm-api-options", "--config"),
        "it reads engine options from a YAML file the caller names, past this refusal table",
    ),
)

# What the node agent passes to `trtllm-serve` (tensorrt_llm/commands/serve.py): the flags
# that size and tune the engine; any other is refused.
ALLOWED: tuple[AllowedFlag, ...] = (
    AllowedFlag(MAX_SEQ_LEN),
    AllowedFlag(TP_SIZE),
    AllowedFlag(PP_SIZE),
    AllowedFlag(("--ep_size",)),
    AllowedFlag(("--gpus_per_node",)),
    AllowedFlag(FREE_GPU_MEMORY_FRACTION),
    AllowedFlag(MAX_NUM_TOKENS),
    AllowedFlag(("--max_batch_size",)),
    AllowedFlag(("--max_beam_width",)),
    AllowedFlag(("--backend",)),
    AllowedFlag(("--num_postprocess_workers",)),
    AllowedFlag(("--reasoning_parser",)),
    AllowedFlag(("--log_level",)),
    AllowedFlag(REVISION),
)

# Flags that load other models: refused unless the agent config's `allow_flags` names them.
GATED: tuple[RefusedFlag, ...] = (
    RefusedFlag(("--tokenizer",), "it loads a tokenizer from another repo or folder"),
)


class FullWidthPool(CachePool):
    """TensorRT-LLM's blocks: every layer, sliding or not, at full length (gt-052)."""

    def sliding(self, layer: Layer) -> int:
        return self.full()


def extra_options(args: Sequence[str]) -> tuple[Mapping[str, object], str]:
    """`kv_cache_config` of an inline `--extra_llm_api_options` YAML, and what was read: empty
    when the flag is absent, names a file (which the planner cannot read) or is not YAML."""
    raw = GRAMMAR.get(args, EXTRA_OPTIONS)
    if raw is None:
        return {}, ""
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError:
        data = None
    if not isinstance(data, Mapping):
        return (
            {},
            f"{EXTRA_OPTIONS[0]} names a file the planner cannot read: cache at the model's dtype",
        )
    config = data.get("kv_cache_config")
    return (config if isinstance(config, Mapping) else {}), f"{EXTRA_OPTIONS[0]} read inline"


def trtllm_overhead_bytes(
    shape: ModelShape, args: Sequence[str], *, pp: int, tp: int = 1, card: CardTotals | None = None
) -> int:
    """What a TensorRT-LLM card needs beside weights and KV before its free fraction applies:
    the profiling pass over `--max_num_tokens` tokens, its sampler, non-torch memory (with
    what tensor parallel adds on `card`, `trtllm_collective_bytes`) and CUDA graphs, with the
    constants measured on vLLM (both run the model in PyTorch)."""
    batched = GRAMMAR.count(args, MAX_NUM_TOKENS) or TRTLLM_MAX_NUM_TOKENS
    forward = forward_cost(shape, tp=tp).bytes(batched)
    graphs = cuda_graph_bytes(shape, layers_per_stage(shape, pp))
    collective = trtllm_collective_bytes(card, tp)[0]
    return forward + SAMPLER_FALLBACK_BYTES + NON_TORCH_BYTES + collective + graphs


def trtllm_free_fraction(args: Sequence[str]) -> float:
    """The KV cache's share of the free memory: the flag, the inline YAML, else 0.9."""
    given = GRAMMAR.fraction(args, FREE_GPU_MEMORY_FRACTION)
    if given is not None:
        return given
    value = extra_options(args)[0].get("free_gpu_memory_fraction")
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1:
        return float(value)
    return TRTLLM_FREE_FRACTION


def trtllm_tokens_per_block(args: Sequence[str]) -> int:
    """Tokens per KV block: the inline YAML's `tokens_per_block`, else 32."""
    value = extra_options(args)[0].get("tokens_per_block")
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 1 << 16:
        return value
    return TRTLLM_TOKENS_PER_BLOCK


class TrtLlm(TensorParallelEngine):
    """TensorRT-LLM (PyTorch backend): the KV cache takes its fraction of what is free."""

    name = "trtllm"
    batch_flag = ("--max_batch_size",)
    """Concurrent requests at most (trtllm-serve's `--max_batch_size`)."""
    aliases = ("trtllm-serve", "tensorrt-llm", "tensorrt_llm")
    grammar = GRAMMAR
    default_utilisation = TRTLLM_FREE_FRACTION
    refused_flags = REFUSED
    context_flag = MAX_SEQ_LEN
    tp_flag = TP_SIZE
    pp_flag = PP_SIZE
    revision_flag = REVISION

    def cache_dtype_bytes(self, args: Sequence[str], shape: ModelShape) -> Fraction:
        """kv_cache_config.dtype of an inline `--extra_llm_api_options`, else the model's.

        Raises:
            EngineRefuses: a dtype the planner does not size.
        """
        raw = extra_options(args)[0].get("dtype")
        if raw is None:
            return Fraction(shape.kv_dtype_bytes)
        key = str(raw).strip().lower()
        if key not in TRTLLM_CACHE_DTYPES:
            raise GRAMMAR.refuse(
                f"trtllm kv_cache_config.dtype {raw!r} is not a cache type the planner can "
                f"size: use one of {', '.join(TRTLLM_CACHE_DTYPES)}",
                f"kv_cache_config.dtype={raw}",
            )
        size = TRTLLM_CACHE_DTYPES[key]
        return Fraction(shape.kv_dtype_bytes) if size is None else size

    def pool(
        self, args: Sequence[str], *, tokens: int, sequences: int, card_memory_bytes: int
    ) -> FullWidthPool:
        """Blocks of 32 tokens (or the inline YAML's), every layer at full length."""
        return FullWidthPool(tokens, sequences, block=trtllm_tokens_per_block(args))

    def overhead_and_budget(
        self,
        shape: ModelShape,
        args: Sequence[str],
        *,
        tokens: int,
        tp: int,
        pp: int,
        weights_card_bytes: int,
        card: CardTotals,
        engine_version: str,
    ) -> Overhead:
        """The profiling overhead; a budget that leaves the cache its free fraction f of the
        memory CUDA reports free after weights and overhead (TensorRT-LLM's
        `_cal_max_memory`: (total − peak + first-pass KV) × f, gt-052):
        f × total + (1 − f) × (weights + overhead)."""
        batched = GRAMMAR.count(args, MAX_NUM_TOKENS) or TRTLLM_MAX_NUM_TOKENS
        cost = forward_cost(shape, tp=tp)
        forward = cost.bytes(batched)
        graphs = cuda_graph_bytes(shape, layers_per_stage(shape, pp))
        collective, collective_margin, collective_words = trtllm_collective_bytes(card, tp)
        non_torch = NON_TORCH_BYTES + collective
        overhead = forward + SAMPLER_FALLBACK_BYTES + non_torch + graphs
        free = trtllm_free_fraction(args)
        total = card.cuda_bytes
        budget = int(free * total + (1 - free) * (weights_card_bytes + overhead))
        uncertain = (
            int(forward * cost.margin)
            + SAMPLER_FALLBACK_BYTES // 2
            + graphs // 2
            + collective_margin
        )
        margin = int(free * (uncertain + NON_TORCH_MARGIN_BYTES + card.cuda_margin_bytes))
        read = extra_options(args)[1]
        return Overhead(
            budget_bytes=budget,
            activation_bytes=forward + SAMPLER_FALLBACK_BYTES,
            non_torch_bytes=non_torch,
            cuda_graph_bytes=graphs,
            margin_bytes=margin,
            rules=(
                f"TensorRT-LLM: KV gets {free:g} of the memory free after weights and "
                f"activations (CUDA total {card.cuda_source or 'not known'})"
                + (f"; {collective_words}" if collective_words else "")
                + (f"; {read}" if read else "")
            ),
            card_total_bytes=total,
        )

    def token_capacity(
        self, shape: ModelShape, *, available_kv_bytes: int, tp: int, args: Sequence[str]
    ) -> int:
        """TensorRT-LLM's max tokens in its paged KV cache (`trtllm_token_capacity`).

        The pool here is the budget's remainder, f × (free after weights and overhead)."""
        return trtllm_token_capacity(
            shape,
            available_kv_bytes=available_kv_bytes,
            tp=tp,
            args=args,
            tokens_per_block=trtllm_tokens_per_block(args),
        )


TRTLLM = TrtLlm()


def trtllm_token_capacity(
    shape: ModelShape,
    *,
    available_kv_bytes: int,
    tp: int,
    args: Sequence[str],
    tokens_per_block: int = TRTLLM_TOKENS_PER_BLOCK,
) -> int:
    """The tokens TensorRT-LLM's paged KV cache gets from `available_kv_bytes` on each card:
    available // "kv size" (every layer at full width), in whole blocks; 0 when nothing is
    available."""
    if available_kv_bytes <= 0:
        return 0
    per_token = token_bytes_on_card(shape, tp, TRTLLM.cache_dtype_bytes(args, shape))
    if per_token == 0:
        return 0
    return available_kv_bytes // per_token // tokens_per_block * tokens_per_block
