"""vLLM (`vllm serve`): its flags, paged KV blocks, profiling overhead and utilisation budget.

Flags as `vllm serve --help` spells them (vllm/engine/arg_utils.py); its FlexibleArgumentParser
reads `--a_b` as `--a-b` and, being argparse, takes `--flag=value` and unambiguous prefixes.
Constants name their source: vLLM's source file or documented default, or a ground-truth row
(tests/fixtures/ground_truth/observations.jsonl, "gt-NNN").
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

from llmgw.cardclass import GIB
from llmgw.engines.base import CardTotals, Overhead
from llmgw.engines.gang import GangLaunch, GangMember, vllm_launch
from llmgw.engines.grammar import ADDRESS_FLAGS, AllowedFlag, Grammar, RefusedFlag, switch
from llmgw.engines.heads import TpOptions
from llmgw.engines.kvcache import CachePool, ceil_to, token_bytes_on_card
from llmgw.engines.tensor_parallel import MarginWidener, TensorParallelEngine
from llmgw.engines.versions import in_a_range
from llmgw.engines.vllm_memory import (
    GPU_MEMORY_UTILIZATION,
    vllm_central_overhead,
    vllm_overhead,
    vllm_overhead_tokens,
)
from llmgw.engines.vllm_offload import CPU_OFFLOAD_GB, offloaded_per_card
from llmgw.engines.vllm_peak import (
    ENFORCE_EAGER,
    EXPERT_PARALLEL,
    MAX_NUM_BATCHED_TOKENS,
    NO_CHUNKED_PREFILL,
)
from llmgw.engines.vllm_rules import VLLM_RULES
from llmgw.engines.vllm_unknown import unknown_margin_tokens, widen_unknown_margin
from llmgw.shape import Layer, ModelShape

GRAMMAR = Grammar("vllm", folds_underscores=True, joined_ok=True, abbreviates=True)

MAX_MODEL_LEN = ("--max-model-len",)
TENSOR_PARALLEL_SIZE = ("--tensor-parallel-size", "-tp")
PIPELINE_PARALLEL_SIZE = ("--pipeline-parallel-size", "-pp")
KV_CACHE_DTYPE = ("--kv-cache-dtype",)
BLOCK_SIZE = ("--block-size",)
MM_ENCODER_TP_MODE = ("--mm-encoder-tp-mode",)
REVISION = ("--revision",)
"""The Hugging Face revision vLLM loads, its tokenizer's too unless --tokenizer-revision says
otherwise (vllm/engine/arg_utils.py EngineArgs.revision; vllm/config/model.py sets
tokenizer_revision to it)."""

VLLM_BLOCK_TOKENS = 16
"""Tokens per KV page: `--block-size` default on CUDA (vllm/config/cache.py); a page per layer
is block × kv_heads_per_rank × (head_dim_k + head_dim_v) × dtype (kv_cache_interface.py)."""

VLLM_UTILISATION = VLLM_RULES[-1].utilisation
"""`--gpu-memory-utilization` default of the newest vLLM the planner knows (0.92 since 0.21,
0.90 before: `vllm_rules.VLLM_RULES`, keyed by the profile's engine_version)."""

VLLM_BATCHED_TOKENS_LARGE_CARD = 8192
VLLM_BATCHED_TOKENS_SMALL_CARD = 2048
VLLM_LARGE_CARD_BYTES = 70 * GIB
"""`--max-num-batched-tokens` defaults of `vllm serve`: 8192 on cards of 70 GiB or more, else
2048 (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults, OPENAI_API_SERVER). The
profile run that measures the activation peak uses this many tokens."""

VLLM_CACHE_DTYPES: dict[str, Fraction | None] = {
    "auto": None,
    "float16": Fraction(2),
    "bfloat16": Fraction(2),
    "fp8": Fraction(1),
    "fp8_e4m3": Fraction(1),
    "fp8_e5m2": Fraction(1),
    "fp8_inc": Fraction(1),
    "int8": Fraction(1),
}
"""`--kv-cache-dtype` values vLLM accepts (vllm/config/cache.py CacheDType) and their element
bytes; None is the model's dtype. fp8_ds_mla and the per-token-head/nvfp4 formats carry scales
the planner does not size: refused as unmodelled."""

# What the node agent refuses to pass (vllm/engine/arg_utils.py,
# vllm/entrypoints/openai/cli_args.py).
REFUSED: tuple[RefusedFlag, ...] = (
    ADDRESS_FLAGS,
    RefusedFlag(
        ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless"),
        "the agent sets a gang's launch flags itself (a profile spans nodes with `nodes`)",
    ),
    RefusedFlag(
        ("--worker-cls", "--worker-extension-cls"),
        "it makes vLLM import and run a Python class the caller names",
    ),
    RefusedFlag(
        ("--trust-remote-code",),
        "it runs Python code shipped with the model repo; allow it in the agent config "
        "(allow_flags) for models you trust",
    ),
    RefusedFlag(
        (
            "--logits-processors",
            "--middleware",
            "--tool-parser-plugin",
            "--reasoning-parser-plugin",
        ),
        "it makes vLLM import Python code from a module or file the caller names",
    ),
    RefusedFlag(
        ("--config",),
        "it reads more arguments from a file, past this refusal table",
    ),
    RefusedFlag(
        ("--allowed-local-media-path",),
        "it lets API callers read files of the node",
    ),
    RefusedFlag(
        ("--chat-template",),
        "a chat template is read from a path the caller names; give the template inline or "
        "ship it with the model",
        only_paths=True,
    ),
)

# What the node agent passes to vLLM (`vllm serve --help`; vllm/engine/arg_utils.py,
# vllm/entrypoints/openai/cli_args.py): the flags that size and tune the engine. A flag that is
# on no list is refused with its name; the agent config's `allow_flags` adds one.
ALLOWED: tuple[AllowedFlag, ...] = (
    AllowedFlag(MAX_MODEL_LEN),
    AllowedFlag(TENSOR_PARALLEL_SIZE),
    AllowedFlag(PIPELINE_PARALLEL_SIZE),
    AllowedFlag(("--data-parallel-size", "-dp")),
    switch("--enable-expert-parallel"),
    AllowedFlag(GPU_MEMORY_UTILIZATION),
    AllowedFlag(("--kv-cache-memory-bytes",)),
    AllowedFlag(KV_CACHE_DTYPE),
    switch("--calculate-kv-scales"),
    AllowedFlag(BLOCK_SIZE),
    AllowedFlag(("--num-gpu-blocks-override",)),
    AllowedFlag(("--swap-space",)),
    AllowedFlag(CPU_OFFLOAD_GB),
    AllowedFlag(MAX_NUM_BATCHED_TOKENS),
    AllowedFlag(("--max-num-seqs",)),
    AllowedFlag(("--max-num-partial-prefills",)),
    AllowedFlag(("--max-long-partial-prefills",)),
    AllowedFlag(("--long-prefill-token-threshold",)),
    switch("--enable-chunked-prefill"),
    switch(*NO_CHUNKED_PREFILL),
    switch("--enable-prefix-caching"),
    switch("--no-enable-prefix-caching"),
    AllowedFlag(("--prefix-caching-hash-algo",)),
    switch(*ENFORCE_EAGER),
    AllowedFlag(("--max-seq-len-to-capture",)),
    AllowedFlag(("--cuda-graph-sizes",)),
    switch("--disable-custom-all-reduce"),
    switch("--disable-sliding-window"),
    switch("--disable-cascade-attn"),
    AllowedFlag(("--dtype",)),
    AllowedFlag(("--quantization", "-q")),
    AllowedFlag(("--load-format",)),
    AllowedFlag(REVISION),
    AllowedFlag(("--tokenizer-mode",)),
    AllowedFlag(("--max-parallel-loading-workers",)),
    AllowedFlag(("--seed",)),
    AllowedFlag(("--max-logprobs",)),
    AllowedFlag(("--rope-scaling",)),
    AllowedFlag(("--rope-theta",)),
    AllowedFlag(("--override-generation-config",)),
    AllowedFlag(("--limit-mm-per-prompt",)),
    switch("--language-model-only"),
    switch("--skip-mm-profiling"),
    AllowedFlag(("--scheduling-policy",)),
    switch("--async-scheduling"),
    AllowedFlag(("--chat-template",)),
    AllowedFlag(("--chat-template-content-format",)),
    AllowedFlag(("--tool-call-parser",)),
    switch("--enable-auto-tool-choice"),
    AllowedFlag(("--reasoning-parser",)),
    AllowedFlag(("--guided-decoding-backend",)),
    switch("--disable-log-requests"),
    switch("--enable-log-requests"),
    switch("--disable-log-stats"),
    switch("--disable-fastapi-docs"),
    switch("--enable-force-include-usage"),
    AllowedFlag(("--uvicorn-log-level",)),
)

# Flags that load code or other models: refused unless the agent config's `allow_flags` names
# them (beside REFUSED's --worker-cls, --trust-remote-code, the plugins and processors).
GATED: tuple[RefusedFlag, ...] = (
    RefusedFlag(
        ("--scheduler-cls",),
        "it makes vLLM import and run a scheduler class the caller names",
    ),
    RefusedFlag(
        ("--kv-transfer-config", "--kv-events-config", "--ec-transfer-config"),
        "its JSON names a connector module (kv_connector_module_path) vLLM imports and runs",
    ),
    RefusedFlag(
        ("--speculative-config", "--speculative-model"),
        "it loads a second (drafter) model the caller names",
    ),
    RefusedFlag(
        ("--enable-lora", "--lora-modules", "--qlora-adapter-name-or-path"),
        "it loads adapter weights the caller names",
    ),
    RefusedFlag(
        ("--tokenizer", "--hf-overrides", "--generation-config", "--override-pooler-config"),
        "it loads files or model configuration from another repo or folder",
    ),
    RefusedFlag(
        ("--model-loader-extra-config", "--distributed-executor-backend"),
        "it can name a loader or an executor class vLLM imports",
    ),
    RefusedFlag(
        ("--compilation-config", "-O"),
        "its JSON can name compiler passes vLLM imports",
    ),
)


@dataclass(frozen=True)
class VllmPool(CachePool):
    """vLLM's paged pool: whole blocks; a sliding layer holds, per sequence, the window plus
    a batch of scheduled tokens in blocks, plus one (SlidingWindowSpec.max_memory_usage_bytes)."""

    batched_tokens: int = VLLM_BATCHED_TOKENS_LARGE_CARD

    def sliding(self, layer: Layer) -> int:
        span = min(layer.window_tokens - 1 + self.batched_tokens, self.per_sequence)
        return self.sequences * (ceil_to(span, self.block) + self.block)


def vllm_batched_tokens(args: Sequence[str], card_memory_bytes: int) -> int:
    """vLLM's tokens per batch: `--max-num-batched-tokens`, else its default for the card."""
    given = GRAMMAR.count(args, MAX_NUM_BATCHED_TOKENS)
    if given is not None:
        return given
    if 0 < card_memory_bytes < VLLM_LARGE_CARD_BYTES:
        return VLLM_BATCHED_TOKENS_SMALL_CARD
    return VLLM_BATCHED_TOKENS_LARGE_CARD


class Vllm(TensorParallelEngine):
    """vLLM: paged KV blocks, a budget of `--gpu-memory-utilization` of the card."""

    name = "vllm"
    batch_flag = ("--max-num-seqs",)
    """Concurrent requests at most (vllm/engine/arg_utils.py `--max-num-seqs`)."""
    grammar = GRAMMAR
    default_utilisation = VLLM_UTILISATION
    refused_flags = REFUSED
    context_flag = MAX_MODEL_LEN
    tp_flag = TENSOR_PARALLEL_SIZE
    pp_flag = PIPELINE_PARALLEL_SIZE
    revision_flag = REVISION
    cache_dtype_flag = KV_CACHE_DTYPE
    cache_dtypes: ClassVar[Mapping[str, Fraction | None]] = VLLM_CACHE_DTYPES

    def gang_launch(self, args: Sequence[str], member: GangMember) -> GangLaunch:
        """`--nnodes/--node-rank/--master-addr/--master-port`, `--headless` off the head
        (`llmgw.engines.gang.vllm_launch`)."""
        return vllm_launch(member)

    def tp_options(self, args: Sequence[str]) -> TpOptions:
        """--enable-expert-parallel deals experts out whole to every rank (FusedMoE then does
        not split their width, vllm/model_executor/layers/fused_moe/config.py
        FusedMoEParallelConfig); --mm-encoder-tp-mode data replicates the vision encoder."""
        mode = (GRAMMAR.get(args, MM_ENCODER_TP_MODE) or "").strip().lower()
        return TpOptions(
            expert_ranks=(1 << 30) if GRAMMAR.has(args, EXPERT_PARALLEL) else 1,
            vision_data_parallel=mode == "data",
        )

    def pool(
        self, args: Sequence[str], *, tokens: int, sequences: int, card_memory_bytes: int
    ) -> VllmPool:
        """Blocks of `--block-size` (16), sliding layers capped by its batch."""
        return VllmPool(
            tokens,
            sequences,
            block=GRAMMAR.count(args, BLOCK_SIZE) or VLLM_BLOCK_TOKENS,
            batched_tokens=vllm_batched_tokens(args, card_memory_bytes),
        )

    def offloaded_per_card(self, shape: ModelShape, args: Sequence[str], tp: int, pp: int) -> int:
        """`--cpu-offload-gb` per card, up to the card's decoder layers (`vllm_offload`)."""
        return offloaded_per_card(GRAMMAR, shape, args, tp, pp)

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
        """The profiling overhead, inside CUDA's total × `--gpu-memory-utilization`, by the
        rules of the profile's vLLM version (`vllm_memory`)."""
        return vllm_overhead(
            GRAMMAR,
            shape,
            args,
            tokens=tokens,
            tp=tp,
            pp=pp,
            card=card,
            engine_version=engine_version,
        )

    def overhead_tokens(
        self, args: Sequence[str], *, card: CardTotals, engine_version: str
    ) -> Callable[[int], Hashable] | None:
        """What of a context vLLM's overhead reads (`vllm_overhead_tokens`); its token
        capacity reads none of it (`vllm_token_capacity`)."""
        return vllm_overhead_tokens(GRAMMAR, args, card=card, engine_version=engine_version)

    def central_overhead(
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
        """The version's range's figures, before an unknown version's spread
        (`vllm_central_overhead`)."""
        return vllm_central_overhead(
            GRAMMAR,
            shape,
            args,
            tokens=tokens,
            tp=tp,
            pp=pp,
            card=card,
            engine_version=engine_version,
        )

    def margin_widener(
        self, args: Sequence[str], *, card: CardTotals, engine_version: str
    ) -> tuple[Callable[[int], Hashable], MarginWidener] | None:
        """A version in no known range carries the spread of every range's figures in its
        margin (`widen_unknown_margin`), which reads of the context the batch V0 would
        profile (`unknown_margin_tokens`); a known one nothing."""
        if in_a_range(VLLM_RULES, engine_version):
            return None
        return unknown_margin_tokens(GRAMMAR, args, card=card), _widen_unknown

    def token_capacity(
        self, shape: ModelShape, *, available_kv_bytes: int, tp: int, args: Sequence[str]
    ) -> int:
        """vLLM's "GPU KV cache size" (`vllm_token_capacity`)."""
        return vllm_token_capacity(shape, available_kv_bytes=available_kv_bytes, tp=tp, args=args)


def _widen_unknown(
    shape: ModelShape,
    args: Sequence[str],
    over: Overhead,
    tokens: int,
    tp: int,
    pp: int,
    card: CardTotals,
) -> Overhead:
    """`widen_unknown_margin` under vLLM's grammar (a `MarginWidener`)."""
    return widen_unknown_margin(GRAMMAR, shape, args, over, tokens=tokens, tp=tp, pp=pp, card=card)


VLLM = Vllm()


def vllm_token_capacity(
    shape: ModelShape, *, available_kv_bytes: int, tp: int, args: Sequence[str]
) -> int:
    """The "GPU KV cache size: N tokens" vLLM prints for `available_kv_bytes` on each card.

    Whole blocks: available // (page bytes of every KV layer) × block size
    (vllm/v1/core/kv_cache_utils.py); 0 when nothing is available.
    """
    if available_kv_bytes <= 0:
        return 0
    per_token = token_bytes_on_card(shape, tp, VLLM.cache_dtype_bytes(args, shape))
    block = GRAMMAR.count(args, BLOCK_SIZE) or VLLM_BLOCK_TOKENS  # the pool's block (`pool`)
    if per_token == 0:
        return 0
    return available_kv_bytes // (per_token * block) * block
