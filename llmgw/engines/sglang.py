"""SGLang (`python -m sglang.launch_server`): its flags, token pool (sliding layers a share of
it), and `--mem-fraction-static` budget, derived from the card when not given.

Flags as `python -m sglang.launch_server --help` spells them (sglang/srt/server_args.py):
`--tensor-parallel-size` and `--tp-size` are one flag, and `--tp` reaches it as an argparse
abbreviation; argparse takes `--flag=value` and does not read `_` as `-`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import ClassVar

from llmgw.cardclass import MIB
from llmgw.engines.base import CardTotals, Overhead
from llmgw.engines.gang import GangLaunch, GangMember, sglang_launch
from llmgw.engines.grammar import ADDRESS_FLAGS, AllowedFlag, Grammar, RefusedFlag, switch
from llmgw.engines.heads import TpOptions
from llmgw.engines.interconnect import nvlink_card
from llmgw.engines.kvcache import CachePool, ceil_to, token_bytes_on_card
from llmgw.engines.memo import sizing_memo
from llmgw.engines.tensor_parallel import TensorParallelEngine
from llmgw.engines.versions import parse_version
from llmgw.engines.vllm_rules import NVLINK_NON_TORCH_MARGIN_BYTES, NVLINK_NON_TORCH_V1_EARLY
from llmgw.shape import Layer, LayerKind, ModelShape

GRAMMAR = Grammar("sglang", folds_underscores=False, joined_ok=True, abbreviates=True)

CONTEXT_LENGTH = ("--context-length",)
TP_SIZE = ("--tp-size", "--tp", "--tensor-parallel-size")
PP_SIZE = ("--pp-size", "--pp", "--pipeline-parallel-size")
MEM_FRACTION_STATIC = ("--mem-fraction-static",)
KV_CACHE_DTYPE = ("--kv-cache-dtype",)
PAGE_SIZE = ("--page-size",)
SWA_FULL_TOKENS_RATIO = ("--swa-full-tokens-ratio",)
DISABLE_HYBRID_SWA_MEMORY = ("--disable-hybrid-swa-memory",)
CHUNKED_PREFILL_SIZE = ("--chunked-prefill-size",)
CUDA_GRAPH_MAX_BS = ("--cuda-graph-max-bs",)
MAX_PREFILL_TOKENS = ("--max-prefill-tokens",)
SPECULATIVE_ALGORITHM = ("--speculative-algorithm",)
EP_SIZE = ("--ep-size", "--ep", "--expert-parallel-size")
ENABLE_DP_ATTENTION = ("--enable-dp-attention",)
DP_SIZE = ("--dp-size", "--dp", "--data-parallel-size")
DSA_PREFILL_BACKEND = ("--nsa-prefill-backend", "--dsa-prefill-backend", "--nsa-prefill")
DSA_DECODE_BACKEND = ("--nsa-decode-backend", "--dsa-decode-backend", "--nsa-decode")
"""The kernels SGLang runs DeepSeek V3.2's sparse attention with (server_args.py: first
`--nsa-prefill`/`--nsa-decode`, then `--nsa-prefill-backend`/`--nsa-decode-backend`, since
0.5.13 spelled `--dsa-...`). "trtllm" keeps the plain MLA row (`sglang_dsa_packed`)."""
DSA_UNPACKED_BACKENDS = frozenset({"trtllm"})
REVISION = ("--revision",)
"""The model version SGLang loads: a branch, tag or commit (sglang/srt/server_args.py
ServerArgs.revision)."""

SGLANG_CACHE_DTYPES: dict[str, Fraction | None] = {
    "auto": None,
    "bf16": Fraction(2),
    "bfloat16": Fraction(2),
    "fp8_e4m3": Fraction(1),
    "fp8_e5m2": Fraction(1),
    "fp4_e2m1": Fraction(9, 16),
}
"""`--kv-cache-dtype` choices of SGLang (docs/advanced_features/server_arguments.md).
fp4_e2m1 packs two elements a byte plus a 1-byte scale per 16 elements (cell // 2 +
cell / 16, model_runner_kv_cache_mixin.py get_cell_size_per_token)."""

SGLANG_SWA_FULL_TOKENS_RATIO = 0.8
"""`--swa-full-tokens-ratio` default: a sliding layer's pool holds this share of a full
layer's tokens (server_args.py; model_runner_kv_cache_mixin.py set_num_tokens_hybrid_swa)."""

SGLANG_PRELOAD_BYTES = 432 * MIB
"""Memory in use before SGLang measures the free memory its fraction applies to (CUDA
context, NCCL), below CUDA's total: gt-049 saw 21.63 GiB free on an L4 at tp 4 'Load weight
begin. avail mem=21.63 GB', against the L4's logged CUDA total of 22.05 GiB
(cardclass.KNOWN_CARDS), so 0.42 GiB; vLLM's logs show 0.41 to 0.53 GiB in use at its
snapshot (vllm_memory.CUDA_CONTEXT_BYTES)."""

SGLANG_PRELOAD_MARGIN_BYTES = 384 * MIB
"""How far the preload may be off (tensor parallel adds NCCL buffers)."""

SGLANG_NVLINK_PRELOAD_BYTES = NVLINK_NON_TORCH_V1_EARLY
"""What tensor parallel over NVLink adds to SGLANG_PRELOAD_BYTES (which already holds a PCIe
card's NCCL buffers: gt-049 is four L4s at tp 4). SGLang builds its collectives before it
measures: ModelRunner.init_torch_distributed (python/sglang/srt/model_executor/model_runner.py)
runs init_distributed_environment and initialize_model_parallel, whose tensor-parallel
GroupCoordinator (distributed/parallel_state.py) makes a PyNcclCommunicator
(device_communicators/pynccl.py: ncclCommInitRank, then a one-element warm-up all-reduce) and
the custom all-reduce's IPC buffers; only then does it take the free memory it returns, which
profile_max_num_token applies the fraction to and `Load weight begin. avail mem` prints. NVLS
is off there unless `--enable-nccl-nvls` (entrypoints/engine.py _set_envs_and_config sets
NCCL_NVLS_ENABLE from it; the agent does not pass the flag), so what NVLink adds is NCCL's
buffers for its NVLink channels, on Ampere NVLink parts as on Hopper (interconnect.nvlink_card,
not nvls_card). The figure is vLLM's NVLink step under the same torch and NCCL:
NVLINK_NON_TORCH_V1_EARLY, fitted to vLLM 0.10.2 logs (torch 2.8, which SGLang builds on since
its PR #8880 of August 2025, 0.5.2rc2 among them). Those logs are Hopper starts with NVLS on, so
the figure may hold more than SGLang's channels alone (the side the planner errs on is then
under). SGLang's own NVLink logs agree within
NVLINK_NON_TORCH_MARGIN_BYTES: the 0.5.2rc2 start on eight H100s (sglang_logged_runs.jsonl) had
1.76 GiB in use at `Load weight begin`, 1.34 over the PCIe preload, 'Init torch distributed ends.
mem usage=1.25 GB' against 0.19 on PCIe cards (sgl-project/sglang issues #7070, #7212); a tp-8
start on eight cards of H200's size (139.3 GiB by its lines) printed 1.77-2.01 GB there
(sgl-project/sglang PR #11716, October 2025). Not modelled: what grows with more groups (DP
attention's, expert parallel's), e.g. 1.88-2.50 GB on eight B200s with DP attention (PR
#5390)."""

# SGLang's default --mem-fraction-static (server_args.py, _handle_gpu_memory_settings): card
# memory in MiB less a reserve of 512 MiB of metadata + 1.5 MiB per chunked-prefill token
# + 2 MiB per CUDA-graph batch size + 1024 MiB per 8 ranks (+ DP attention's, below), at
# least 10240 MiB on cards over 60 GiB, plus 2048 MiB for EAGLE drafts (6144 for a standalone
# draft).
SGLANG_RESERVE_BASE_MIB = 512
SGLANG_RESERVE_PER_CHUNK_TOKEN_MIB = 1.5
SGLANG_RESERVE_PER_GRAPH_BS_MIB = 2
SGLANG_RESERVE_PER_8_RANKS_MIB = 1024
SGLANG_RESERVE_FLOOR_MIB = 10240
SGLANG_RESERVE_FLOOR_ABOVE_MIB = 60 * 1024
SGLANG_RESERVE_EAGLE_MIB = 2048
SGLANG_RESERVE_STANDALONE_MIB = 6144
SGLANG_RESERVE_DP_ATTENTION_PER_GRAPH_BS_MIB = 3
SGLANG_RESERVE_DP_ATTENTION_LARGE_BS_MIB = 1.5
SGLANG_RESERVE_DP_ATTENTION_LARGE_BS = 300
"""What `--enable-dp-attention --dp-size D` adds to the reserve, before the 10 GiB floor:
cuda_graph_max_bs × D × 3 MiB ("DP attention needs more padding"), and cuda_graph_max_bs × D ×
1.5 MiB more when cuda_graph_max_bs is over 300 (sgl-project/sglang
python/sglang/srt/server_args.py _handle_gpu_memory_settings, the general heuristics of PR
#10975; the file as stored at commit 469c63e5). It was a flat 4 GiB before those heuristics."""
SGLANG_MAX_PREFILL_TOKENS = 16384
"""`--max-prefill-tokens` default, used in the reserve when chunked prefill is off."""

# (cards up to this many MiB, chunked-prefill size, CUDA-graph max bs below tp 4, at tp >= 4)
SGLANG_GPU_BUCKETS: tuple[tuple[float, int, int, int], ...] = (
    (20 * 1024, 2048, 8, 8),
    (35 * 1024, 2048, 24, 80),
    (60 * 1024, 4096, 32, 160),
    (90 * 1024, 8192, 256, 512),
    (160 * 1024, 8192, 256, 512),
    (math.inf, 16384, 512, 512),
)

# What the node agent refuses to pass (sglang/srt/server_args.py).
REFUSED: tuple[RefusedFlag, ...] = (
    ADDRESS_FLAGS,
    RefusedFlag(
        ("--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr"),
        "the agent sets a gang's launch flags itself (a profile spans nodes with `nodes`)",
    ),
    RefusedFlag(
        ("--trust-remote-code",),
        "it runs Python code shipped with the model repo; allow it in the agent config "
        "(allow_flags) for models you trust",
    ),
    RefusedFlag(
        ("--enable-custom-logit-processor",),
        "it lets API callers send serialized Python to run inside the engine",
    ),
    RefusedFlag(
        ("--config",),
        "it reads more arguments from a file, past this refusal table",
    ),
    RefusedFlag(
        ("--chat-template",),
        "a chat template is read from a path the caller names; ship it with the model",
        only_paths=True,
    ),
)

# What the node agent passes to SGLang (`python -m sglang.launch_server --help`,
# sglang/srt/server_args.py): the flags that size and tune the engine; any other is refused.
ALLOWED: tuple[AllowedFlag, ...] = (
    AllowedFlag(CONTEXT_LENGTH),
    AllowedFlag(TP_SIZE),
    AllowedFlag(PP_SIZE),
    AllowedFlag(("--dp-size", "--dp", "--data-parallel-size")),
    AllowedFlag(("--ep-size", "--ep", "--expert-parallel-size")),
    switch("--enable-dp-attention"),
    AllowedFlag(MEM_FRACTION_STATIC),
    AllowedFlag(KV_CACHE_DTYPE),
    AllowedFlag(PAGE_SIZE),
    AllowedFlag(SWA_FULL_TOKENS_RATIO),
    switch(*DISABLE_HYBRID_SWA_MEMORY),
    AllowedFlag(CHUNKED_PREFILL_SIZE),
    AllowedFlag(CUDA_GRAPH_MAX_BS),
    switch("--disable-cuda-graph"),
    AllowedFlag(MAX_PREFILL_TOKENS),
    AllowedFlag(("--max-running-requests",)),
    AllowedFlag(("--max-total-tokens",)),
    AllowedFlag(("--schedule-policy",)),
    AllowedFlag(("--schedule-conservativeness",)),
    switch("--disable-radix-cache"),
    switch("--enable-mixed-chunk"),
    switch("--disable-overlap-schedule"),
    switch("--enable-torch-compile"),
    AllowedFlag(("--attention-backend",)),
    AllowedFlag(DSA_PREFILL_BACKEND),
    AllowedFlag(DSA_DECODE_BACKEND),
    AllowedFlag(("--sampling-backend",)),
    AllowedFlag(("--grammar-backend",)),
    AllowedFlag(("--dtype",)),
    AllowedFlag(("--quantization",)),
    AllowedFlag(("--load-format",)),
    AllowedFlag(REVISION),
    AllowedFlag(("--random-seed",)),
    AllowedFlag(("--chat-template",)),
    AllowedFlag(("--tool-call-parser",)),
    AllowedFlag(("--reasoning-parser",)),
    AllowedFlag(("--stream-interval",)),
    switch("--enable-metrics"),
    AllowedFlag(("--log-level",)),
)

# Flags that load code or other models: refused unless the agent config's `allow_flags` names
# them.
GATED: tuple[RefusedFlag, ...] = (
    RefusedFlag(
        (
            *SPECULATIVE_ALGORITHM,
            "--speculative-draft-model-path",
            "--speculative-draft-model-revision",
        ),
        "it loads a second (draft) model the caller names",
    ),
    RefusedFlag(
        ("--enable-lora", "--lora-paths"),
        "it loads adapter weights the caller names",
    ),
    RefusedFlag(
        ("--tokenizer-path", "--json-model-override-args"),
        "it loads files or model configuration from another repo or folder",
    ),
    RefusedFlag(
        ("--model-loader-extra-config", "--custom-weight-loader"),
        "it can name a loader SGLang imports",
    ),
)


@dataclass(frozen=True)
class SglangPool(CachePool):
    """SGLang's token pool: a sliding layer's pool is `swa_ratio` of the full pool (hybrid
    SWA), or all of it with `--disable-hybrid-swa-memory` (None)."""

    swa_ratio: float | None = SGLANG_SWA_FULL_TOKENS_RATIO

    def sliding(self, layer: Layer) -> int:
        ratio = 1.0 if self.swa_ratio is None else self.swa_ratio
        return ceil_to(math.ceil(self.tokens * ratio), self.block)


SGLANG_V04_FRACTIONS: tuple[tuple[int, float], ...] = (
    (16, 0.79),
    (8, 0.81),
    (4, 0.85),
    (2, 0.87),
    (1, 0.88),
)
"""SGLang 0.4's default `--mem-fraction-static` by tensor parallel size, whatever the card
(python/sglang/srt/server_args.py ServerArgs.__post_init__ as of v0.4.3: "Set mem fraction
static, which depends on the tensor parallelism size": tp ≥ 16 0.79, ≥ 8 0.81, ≥ 4 0.85, ≥ 2
0.87, else 0.88; the card's memory set only the chunked-prefill size (2048 under 25,000 MiB,
else 8192) and the CUDA-graph batch). gt-049 (0.4.3.post4, four L4s at tp 4) ran at 0.85."""

SGLANG_V04_UNTIL = (0, 4, 8)
"""Versions before this take SGLANG_V04_FRACTIONS. The 0.4.6-0.4.7 adjustments for cards over
96 GiB (PR #5893, at least 18 GB left on an H200; PR #6718, B200) are not modelled: such a card
there takes the table. PR #7054 (merged 2025-06-10) replaced the table by SGLANG_CLASS_RESERVES;
v0.4.8's server_args.py carries it, whether v0.4.7 does is not determined here (it keeps the
table)."""

SGLANG_CLASS_RESERVES_UNTIL = (0, 5, 3)
"""Versions from SGLANG_V04_UNTIL up to this take SGLANG_CLASS_RESERVES; from here the reserve
is PR #10975's (merged 2025-09-27, after v0.5.2; 0.5.3 is the first release after it): the
chunked-prefill, CUDA-graph and parallel terms below. The logged 0.5.2rc2 start on eight H100s
(sglang_logged_runs.jsonl, sglang-0.5.2rc2-h100x8-grok-2-fp8-tp8) printed
mem_fraction_static=0.831, the class rule's (81,559 − 13,824) / 81,559; the newer rule gives
0.818 there."""

SGLANG_CLASS_RESERVES: tuple[tuple[float, float, float], ...] = (
    (20 * 1024, 2.8, 0.1),
    (35 * 1024, 2.8, 0.1),
    (90 * 1024, 9.5, 0.5),
    (100 * 1024, 12.0, 0.5),
    (160 * 1024, 12.0, 0.5),
    (math.inf, 32.0, 0.0),
)
"""SGLang 0.4.8-0.5.2's reserve by card class: (cards under this many MiB, GiB, GiB per rank of
tp × pp), so reserve = (GiB + per rank × tp × pp) × 1024 MiB; T4/4080 and A10/L40/4090 2.8 +
0.1 a rank, H100/A100 9.5 + 0.5, H20 and H200 12 + 0.5, larger cards 32 flat; plus 2 GiB for a
draft model (6 GiB for STANDALONE and none for LOOKAHEAD in the 0.5 builds) and 4 GiB with DP
attention; fraction (card − reserve) / card, rounded to 3 places, 0.88 when the card's memory
is not known (python/sglang/srt/server_args.py at v0.4.8, ServerArgs.__post_init__ "Set mem
fraction static", card memory from get_device_memory_capacity in MiB; the same branch is
`_handle_mem_fraction_static` in the 0.5.0-0.5.2 builds)."""

SGLANG_CLASS_RESERVE_DP_ATTENTION_MIB = 4096
"""What `--enable-dp-attention` adds to SGLANG_CLASS_RESERVES' reserve, whatever the dp size."""


def _v04(engine_version: str) -> bool:
    """Whether `engine_version` names an SGLang release that takes the 0.4 table."""
    version = parse_version(engine_version)
    return version is not None and version < SGLANG_V04_UNTIL


def _class_reserves(engine_version: str) -> bool:
    """Whether `engine_version` names an SGLang release that reserves by card class
    (SGLANG_CLASS_RESERVES)."""
    version = parse_version(engine_version)
    return version is not None and SGLANG_V04_UNTIL <= version < SGLANG_CLASS_RESERVES_UNTIL


def _draft_reserve_mib(args: Sequence[str], draft_free: str) -> int:
    """What a draft model adds to SGLang's reserve: 6 GiB for a STANDALONE draft, none for the
    draft-free algorithm (`draft_free`: NGRAM from 0.5.3, LOOKAHEAD before), else 2 GiB
    (server_args.py, both reserve rules)."""
    draft = (GRAMMAR.get(args, SPECULATIVE_ALGORITHM) or "").upper()
    if draft == "STANDALONE":
        return SGLANG_RESERVE_STANDALONE_MIB
    if draft and draft != draft_free:
        return SGLANG_RESERVE_EAGLE_MIB
    return 0


def sglang_mem_fraction_static(
    card_memory_bytes: int, args: Sequence[str], *, tp: int, pp: int, engine_version: str = ""
) -> float:
    """SGLang's `--mem-fraction-static`: the flag, else the default SGLang derives: before
    0.4.8 by tensor parallel size (SGLANG_V04_FRACTIONS), 0.4.8-0.5.2 from the card's class
    (SGLANG_CLASS_RESERVES), from 0.5.3 from the card's memory less the reserve of the
    chunked-prefill size and CUDA-graph batch (server_args.py _handle_gpu_memory_settings):
    (card − reserve) / card, rounded to 3 places; 0.88 when the card's memory is not known.
    No version named: the newest rule.
    """
    given = GRAMMAR.fraction(args, MEM_FRACTION_STATIC)
    if given is not None:
        return given
    if _v04(engine_version):
        return next(fraction for ranks, fraction in SGLANG_V04_FRACTIONS if tp >= ranks)
    if card_memory_bytes <= 0:
        return 0.88
    gpu_mib = card_memory_bytes / MIB
    if _class_reserves(engine_version):
        _, base_gib, per_rank_gib = next(c for c in SGLANG_CLASS_RESERVES if gpu_mib < c[0])
        reserved = (base_gib + per_rank_gib * tp * pp) * 1024
        reserved += _draft_reserve_mib(args, "LOOKAHEAD")
        if GRAMMAR.has(args, ENABLE_DP_ATTENTION):
            reserved += SGLANG_CLASS_RESERVE_DP_ATTENTION_MIB
        return round((gpu_mib - reserved) / gpu_mib, 3)
    _, chunk_default, graphs_small, graphs_large = next(
        b for b in SGLANG_GPU_BUCKETS if gpu_mib < b[0]
    )
    chunk = GRAMMAR.count(args, CHUNKED_PREFILL_SIZE, minimum=-1) or chunk_default
    graphs = GRAMMAR.count(args, CUDA_GRAPH_MAX_BS) or (graphs_small if tp < 4 else graphs_large)
    prefill = GRAMMAR.count(args, MAX_PREFILL_TOKENS) or SGLANG_MAX_PREFILL_TOKENS
    reserved = SGLANG_RESERVE_BASE_MIB + SGLANG_RESERVE_PER_CHUNK_TOKEN_MIB * max(
        chunk if chunk > 0 else prefill, 2048
    )
    reserved += graphs * SGLANG_RESERVE_PER_GRAPH_BS_MIB
    reserved += tp * pp / 8 * SGLANG_RESERVE_PER_8_RANKS_MIB
    if GRAMMAR.has(args, ENABLE_DP_ATTENTION):
        dp = GRAMMAR.count(args, DP_SIZE) or 1
        reserved += graphs * dp * SGLANG_RESERVE_DP_ATTENTION_PER_GRAPH_BS_MIB
        if graphs > SGLANG_RESERVE_DP_ATTENTION_LARGE_BS:
            reserved += graphs * dp * SGLANG_RESERVE_DP_ATTENTION_LARGE_BS_MIB
    if gpu_mib > SGLANG_RESERVE_FLOOR_ABOVE_MIB:
        reserved = max(reserved, SGLANG_RESERVE_FLOOR_MIB)
    reserved += _draft_reserve_mib(args, "NGRAM")
    return round((gpu_mib - reserved) / gpu_mib, 3)


def sglang_preload(card: CardTotals, tp: int) -> tuple[int, int, str]:
    """The memory in use on `card` when SGLang measures what its fraction applies to, at
    tensor parallel `tp`: SGLANG_PRELOAD_BYTES, plus SGLANG_NVLINK_PRELOAD_BYTES on an NVLink
    card (interconnect.nvlink_card) at tp > 1; with how far it may be off, and the words saying
    the NVLink part ("" without it)."""
    if tp > 1 and nvlink_card(card):
        return (
            SGLANG_PRELOAD_BYTES + SGLANG_NVLINK_PRELOAD_BYTES,
            SGLANG_PRELOAD_MARGIN_BYTES + NVLINK_NON_TORCH_MARGIN_BYTES,
            f", {SGLANG_NVLINK_PRELOAD_BYTES // MIB} MiB of it NCCL's NVLink buffers",
        )
    return SGLANG_PRELOAD_BYTES, SGLANG_PRELOAD_MARGIN_BYTES, ""


class Sglang(TensorParallelEngine):
    """SGLang: a token pool, a budget of `--mem-fraction-static` of the card."""

    name = "sglang"
    batch_flag = ("--max-running-requests",)
    """Concurrent requests at most (sglang/srt/server_args.py `--max-running-requests`)."""
    grammar = GRAMMAR
    default_utilisation = None  # derived from the card: sglang_mem_fraction_static
    refused_flags = REFUSED
    context_flag = CONTEXT_LENGTH
    tp_flag = TP_SIZE
    pp_flag = PP_SIZE
    revision_flag = REVISION
    cache_dtype_flag = KV_CACHE_DTYPE
    cache_dtypes: ClassVar[Mapping[str, Fraction | None]] = SGLANG_CACHE_DTYPES

    def gang_launch(self, args: Sequence[str], member: GangMember) -> GangLaunch:
        """`--nnodes/--node-rank/--dist-init-addr` (`llmgw.engines.gang.sglang_launch`)."""
        return sglang_launch(member)

    def tp_options(self, args: Sequence[str]) -> TpOptions:
        """--ep-size N deals the experts out whole to N ranks, so each expert's width is split
        over tp / N (python/sglang/srt/server_args.py: moe tp size = tp_size // ep_size);
        --enable-dp-attention with --dp-size D splits attention over tp / D ranks only
        (layers/dp_attention.py: attn_tp_size = tp_size // dp_size)."""
        dp = self.grammar.count(args, DP_SIZE) or 1
        return TpOptions(
            expert_ranks=self.grammar.count(args, EP_SIZE) or 1,
            attention_dp=dp if self.grammar.has(args, ENABLE_DP_ATTENTION) else 1,
        )

    def cache_shape(self, shape: ModelShape, args: Sequence[str]) -> ModelShape:
        """The shape as SGLang lays out its cache under `args` (`sglang_cache_shape`)."""
        return sglang_cache_shape(shape, args)

    def pool(
        self, args: Sequence[str], *, tokens: int, sequences: int, card_memory_bytes: int
    ) -> SglangPool:
        """Pages of `--page-size` (1); sliding layers `--swa-full-tokens-ratio` of the pool."""
        ratio = GRAMMAR.fraction(args, SWA_FULL_TOKENS_RATIO)
        hybrid = not GRAMMAR.has(args, DISABLE_HYBRID_SWA_MEMORY)
        return SglangPool(
            tokens,
            sequences,
            block=GRAMMAR.count(args, PAGE_SIZE) or 1,
            swa_ratio=(ratio or SGLANG_SWA_FULL_TOKENS_RATIO) if hybrid else None,
        )

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
        """Weights and KV take `--mem-fraction-static` of the memory free before loading
        (CUDA's total less what the CUDA context and NCCL hold, `sglang_preload`);
        activations and CUDA graphs live outside it, in what SGLang's own reserve leaves
        (the default fraction is derived from NVML's total, as SGLang reads it)."""
        mfs = sglang_mem_fraction_static(
            card.nvml_bytes, args, tp=tp, pp=pp, engine_version=engine_version
        )
        rule = "from the card"
        if _v04(engine_version):
            rule = "by tp (SGLang 0.4)"
        elif _class_reserves(engine_version):
            rule = "by card class (SGLang 0.4.8-0.5.2)"
        if GRAMMAR.fraction(args, MEM_FRACTION_STATIC) is not None:
            rule = "as given"
        preload, preload_margin, said = sglang_preload(card, tp)
        free_before = max(card.cuda_bytes - preload, 0)
        margin = int(mfs * (preload_margin + card.cuda_margin_bytes))
        return Overhead(
            budget_bytes=int(free_before * mfs),
            margin_bytes=margin,
            rules=(
                f"SGLang: mem_fraction_static {mfs:g} ({rule}) of the memory free before loading "
                f"(CUDA total {card.cuda_source or 'not known'}, less "
                f"{preload // MIB} MiB in use{said})"
            ),
            card_total_bytes=card.cuda_bytes,
        )

    def token_capacity(
        self, shape: ModelShape, *, available_kv_bytes: int, tp: int, args: Sequence[str]
    ) -> int:
        """SGLang's max_total_num_tokens (`sglang_token_capacity`)."""
        return sglang_token_capacity(shape, available_kv_bytes=available_kv_bytes, tp=tp, args=args)


SGLANG = Sglang()


def sglang_dsa_packed(args: Sequence[str]) -> bool:
    """Whether SGLang stores DeepSeek V3.2's latent in its packed fp8 row (fp8 latent, a float32
    scale per 128 of it, the rope part in bf16: 656 bytes for a 512 + 64 latent).

    model_runner_kv_cache_mixin.py `calculate_mla_kv_cache_dim` (later
    mem_cache/kv_cache_configurator.py) overrides the row only when the cache is
    float8_e4m3fn and neither sparse-attention backend is "trtllm"; NSATokenToKVPool
    (mem_cache/memory_pool.py) then keeps `nsa_kv_cache_store_fp8`. Otherwise the row is
    kv_lora_rank + qk_rope_head_dim at the cache type: 576 bytes in fp8 (trtllm, or fp8_e5m2),
    1152 in bf16. The indexer's fp8 keys and scales (132 bytes a layer) are kept either way.
    (On ROCm with TileLang SGLang keeps the plain row too; the planner sizes CUDA cards.)"""
    raw = GRAMMAR.get(args, KV_CACHE_DTYPE)
    if raw is None or raw.strip().lower() != "fp8_e4m3":
        return False
    backends = (GRAMMAR.get(args, DSA_PREFILL_BACKEND), GRAMMAR.get(args, DSA_DECODE_BACKEND))
    return not any((b or "").strip().lower() in DSA_UNPACKED_BACKENDS for b in backends)


def sglang_cache_shape(shape: ModelShape, args: Sequence[str]) -> ModelShape:
    """`shape` as SGLang lays out its cache under `args`: its packed fp8 rows
    (`Layer.fp8_token_bytes`) dropped where `sglang_dsa_packed` says SGLang does not pack them.
    The unpacked shape is built once per shape and kept in its `sizing_memo` (`engines.memo`)."""
    if not any(la.fp8_token_bytes for la, _ in shape.distinct_layers) or sglang_dsa_packed(args):
        return shape
    kept = sizing_memo(shape).get("sglang_unpacked")
    if isinstance(kept, ModelShape):
        return kept
    layers = tuple(replace(la, fp8_token_bytes=0) for la in shape.layers)
    unpacked = replace(shape, layers=layers)
    sizing_memo(shape)["sglang_unpacked"] = unpacked
    return unpacked


def sglang_available_kv_bytes(
    free_before_load_bytes: int, free_after_weights_bytes: int, mem_fraction_static: float
) -> int:
    """The memory SGLang gives its KV pool: what is free after the weights less the share of
    the memory free before loading that `--mem-fraction-static` leaves out
    (model_runner_kv_cache_mixin.py profile_max_num_token)."""
    return int(free_after_weights_bytes - free_before_load_bytes * (1 - mem_fraction_static))


def sglang_token_capacity(
    shape: ModelShape, *, available_kv_bytes: int, tp: int, args: Sequence[str]
) -> int:
    """SGLang's max_total_num_tokens for `available_kv_bytes` on each card.

    available // cell size (every KV layer at full width), in whole pages; with sliding
    layers and the hybrid SWA pool, the full layers' share: tokens × layers ÷ (ratio × sliding
    + full) (set_num_tokens_hybrid_swa). 0 when nothing is available.
    """
    if available_kv_bytes <= 0:
        return 0
    shape = sglang_cache_shape(shape, args)
    cell = token_bytes_on_card(shape, tp, SGLANG.cache_dtype_bytes(args, shape))
    if cell == 0:
        return 0
    pool = SGLANG.pool(args, tokens=0, sequences=1, card_memory_bytes=0)
    tokens = available_kv_bytes // cell
    kv_layers = [la for la in shape.layers if la.has_kv]
    sliding = sum(1 for la in kv_layers if la.kind is LayerKind.SLIDING)
    if sliding and pool.swa_ratio is not None:
        full = len(kv_layers) - sliding
        tokens = int(tokens * len(kv_layers) / (pool.swa_ratio * sliding + full))
    return tokens // pool.block * pool.block
