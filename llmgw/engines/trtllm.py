"""TensorRT-LLM (`trtllm-serve`): its flags, full-width KV blocks, and a budget that leaves the
cache its free fraction of the memory after weights and activations.

Flags as `trtllm-serve --help` spells them (tensorrt_llm/commands/serve.py), with `_`; either
spelling is read as one flag. It has no cache-dtype flag (that is set in the --config YAML,
which the planner does not read): the cache is sized at the model's dtype, the larger case.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.engines.grammar import ADDRESS_FLAGS, AllowedFlag, Grammar, RefusedFlag
from llmgw.engines.kvcache import CachePool, token_bytes_on_card
from llmgw.engines.tensor_parallel import TensorParallelEngine
from llmgw.engines.torch_overhead import layers_per_stage, torch_overhead_bytes
from llmgw.shape import Layer, ModelShape

GRAMMAR = Grammar("trtllm", folds_underscores=True, joined_ok=True, abbreviates=False)

MAX_SEQ_LEN = ("--max_seq_len",)
TP_SIZE = ("--tp_size",)
PP_SIZE = ("--pp_size",)
FREE_GPU_MEMORY_FRACTION = ("--kv_cache_free_gpu_memory_fraction", "--free_gpu_memory_fraction")
MAX_NUM_TOKENS = ("--max_num_tokens",)

TRTLLM_FREE_FRACTION = 0.9
"""KvCacheConfig.free_gpu_memory_fraction default (TensorRT-LLM docs, "How to Change KV Cache
Behavior"): the share of the memory free after weights and activations that the KV cache
takes; gt-052 prints "fraction is set 0.8999999761581421"."""

TRTLLM_TOKENS_PER_BLOCK = 32
"""KV block of the PyTorch backend: gt-052 "Number of tokens per block: 32"."""

TRTLLM_MAX_NUM_TOKENS = 8192
"""`trtllm-serve --max_num_tokens` default: the tokens of the profiling forward pass."""

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
)

# Flags that load other models: refused unless the agent config's `allow_flags` names them.
GATED: tuple[RefusedFlag, ...] = (
    RefusedFlag(("--tokenizer",), "it loads a tokenizer from another repo or folder"),
)


class FullWidthPool(CachePool):
    """TensorRT-LLM's blocks: every layer, sliding or not, at full length (gt-052)."""

    def sliding(self, layer: Layer) -> int:
        return self.full()


def trtllm_overhead_bytes(shape: ModelShape, args: Sequence[str], *, pp: int) -> int:
    """What a TensorRT-LLM card needs beside weights and KV before its free fraction applies:
    the profiling pass over `--max_num_tokens` tokens, non-torch memory and CUDA graphs,
    with the constants measured on vLLM (both run the model in PyTorch)."""
    batched = GRAMMAR.count(args, MAX_NUM_TOKENS) or TRTLLM_MAX_NUM_TOKENS
    return torch_overhead_bytes(
        shape, batch_tokens=batched, layers=layers_per_stage(shape, pp), eager=False
    )


class TrtLlm(TensorParallelEngine):
    """TensorRT-LLM (PyTorch backend): the KV cache takes its fraction of what is free."""

    name = "trtllm"
    aliases = ("trtllm-serve", "tensorrt-llm", "tensorrt_llm")
    grammar = GRAMMAR
    default_utilisation = TRTLLM_FREE_FRACTION
    refused_flags = REFUSED
    context_flag = MAX_SEQ_LEN
    tp_flag = TP_SIZE
    pp_flag = PP_SIZE

    def pool(
        self, args: Sequence[str], *, tokens: int, sequences: int, card_memory_bytes: int
    ) -> FullWidthPool:
        """Blocks of 32 tokens, every layer at full length."""
        return FullWidthPool(tokens, sequences, block=TRTLLM_TOKENS_PER_BLOCK)

    def overhead_and_budget(
        self,
        shape: ModelShape,
        args: Sequence[str],
        *,
        tokens: int,
        tp: int,
        pp: int,
        weights_card_bytes: int,
        card_memory_bytes: int,
    ) -> tuple[int, int]:
        """The profiling overhead; a budget that leaves the cache its free fraction f of the
        memory after weights and overhead: f × card + (1 − f) × (weights + overhead)."""
        overhead = trtllm_overhead_bytes(shape, args, pp=pp)
        free = GRAMMAR.fraction(args, FREE_GPU_MEMORY_FRACTION) or TRTLLM_FREE_FRACTION
        budget = int(free * card_memory_bytes + (1 - free) * (weights_card_bytes + overhead))
        return overhead, budget


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
