"""vLLM's start-up memory, by the rules of its own profiling run, keyed by vLLM version.

What vLLM does at start (vllm/v1/worker/gpu_worker.py init_device and
determine_available_memory; vllm/utils/mem_utils.py memory_profiling):
1. It snapshots the card after the CUDA context and NCCL are up; `requested` = CUDA total
   (torch.cuda.mem_get_info()[1]) × `--gpu-memory-utilization`, refused when more than is free.
2. It loads the weights and runs `profile_run` (gpu_model_runner.py): one forward pass over
   `max_num_batched_tokens` dummy tokens (split over min(max_num_seqs, tokens) requests; a
   multimodal model first runs its encoder on dummy items, keeping their outputs), then
   `_dummy_sampler_run` over the last token of each of those requests: logits over the whole
   vocabulary, in fp32, sorted for top-k/top-p, softmaxed.
3. KV memory = requested − (weights + torch's peak increase + non-torch increase). CUDA
   graphs are captured afterwards, in what `1 − utilisation` leaves; from 0.21 vLLM also
   estimates them while profiling (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, on by default)
   and subtracts the estimate too, printing it inside "peak activation"
   (GRAPH_ESTIMATE_BYTES_PER_LAYER).
V0 (before 0.8) profiled the same way (worker.py determine_num_available_blocks), over
max(max_model_len, batch) tokens when chunked prefill was off (gt-023/024).

Defaults (vllm/engine/arg_utils.py get_batch_defaults): on cards of 70 GiB or more (CUDA's
total, current_platform.get_device_total_memory) whose name is not an A100,
`vllm serve` batches 8192 tokens and 1024 requests, else 2048 and 256.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace

from llmgw.cardclass import GIB, MIB, nvml_reports_memory
from llmgw.engines.base import CardTotals, Overhead
from llmgw.engines.grammar import Grammar
from llmgw.engines.memo import memo_table
from llmgw.engines.torch_overhead import (
    ACTIVATION_BYTES,
    CUDA_GRAPH_BYTES_PER_LAYER,
    CUDA_GRAPH_BYTES_PER_MOE_LAYER,
    NON_TORCH_MARGIN_BYTES,
    ForwardCost,
    activation_width,
    forward_cost,
    is_moe,
    layers_per_stage,
    vocab_size,
)
from llmgw.engines.versions import Ranged, in_a_range, pick
from llmgw.shape import ModelShape

MAX_NUM_BATCHED_TOKENS = ("--max-num-batched-tokens",)
MAX_NUM_SEQS = ("--max-num-seqs",)
NO_CHUNKED_PREFILL = ("--no-enable-chunked-prefill",)
CHUNKED_PREFILL = ("--enable-chunked-prefill",)
ENFORCE_EAGER = ("--enforce-eager",)
GPU_MEMORY_UTILIZATION = ("--gpu-memory-utilization",)
EXPERT_PARALLEL = ("--enable-expert-parallel",)
LIMIT_MM_PER_PROMPT = ("--limit-mm-per-prompt",)
LANGUAGE_MODEL_ONLY = ("--language-model-only",)
"""vLLM's switch that limits every modality to 0 items, as `--limit-mm-per-prompt` with each 0
would (vllm-project/vllm PR #34120, merged 2026-02-09): the model is profiled as its language
model. For the architectures vLLM ships as both (PR #22299, in 0.10.1), the encoders are not
loaded either; the planner still counts the checkpoint's whole weights (the safe side: the pool
comes out under by the tower's bytes)."""
SKIP_MM_PROFILING = ("--skip-mm-profiling",)
"""V1's switch (MultiModalConfig.skip_mm_profiling) to profile the language backbone only: no
dummy multimodal items, no encoder outputs in the profile's peak. What the encoder takes while
serving is then outside vLLM's budget, which vLLM's docstring leaves to the user."""

LARGE_CARD_BYTES = 70 * GIB
BATCHED_TOKENS_LARGE_CARD = 8192
BATCHED_TOKENS_SMALL_CARD = 2048
MAX_NUM_SEQS_LARGE_CARD = 1024
MAX_NUM_SEQS_SMALL_CARD = 256
"""`vllm serve`'s defaults by card (get_batch_defaults, OPENAI_API_SERVER; A100s take the small
ones, "a100" not in device_name)."""

V0_CHUNKED_SAMPLER = (
    "vLLM V0 (v0.7.x) with chunked prefill on peaked at its forward pass alone: Llama-3.1-8B at "
    "max_model_len 131072 on a 22.07 GiB card (an L4 or A10G), 2048 batched tokens over 256 "
    "requests, 'PyTorch activation peak memory takes 0.22GiB' where 2048 tokens' forward pass "
    "is 0.21 GiB and a sampler over 256 × 128256 logits would add 0.86 (public troubleshooting "
    "note quoting the log; code index file id 70109711463)"
)
"""Why V0's sampler is left out of the peak when chunked prefill is on."""

V0_CHUNKED_ABOVE_TOKENS = 32768
"""vLLM V0 turned chunked prefill on by itself for contexts above 32K (gt-024's notes: at 35k
the peak fell as chunked prefill switched on)."""

CUDA_CONTEXT_BYTES = 544 * MIB
"""What the card holds before vLLM's snapshot (CUDA context, NCCL): H100 79.19 − 78.66 = 0.53
GiB (vLLM 0.10.2 log), gt-039 44.42 − 43.93 = 0.49, A100 79.25 − 78.84 = 0.41 (v0.31.0)."""

SAMPLER_MARGIN = 0.35
"""How far the sampler's peak may stray from its line, either way. Under 0.10.2 alone, at
256 requests, the logs spread from 19 to 36 B a logit around the line's 28: granite-3.3-2b on
an L40S (vllm/vllm-openai:v0.10.2, 0.23 GiB over 256 × 49159 logits less the batch's hidden
states, 18.9 B: 32 % below; logged_runs.jsonl) and Qwen3-8B-FP8 on a 24 GB card (1.40 GiB over
256 × 151936, 36 B: 29 % above). A log of a later build (0.93 GiB of weights on a 15.55 GiB
card, 256 requests of a 152k vocabulary) peaked at 29 B where its line says 38. What the
sampler holds depends on its backend (FlashInfer's kernels or the PyTorch sort), which
neither the card nor the arguments tell."""

GRAPH_ESTIMATE_BYTES_PER_LAYER = 16 * MIB
GRAPH_ESTIMATE_BYTES_PER_MOE_LAYER = 32 * MIB
"""vLLM ≥ 0.21's CUDA-graph estimate per layer, which it keeps out of the KV pool.
vllm/v1/worker/gpu_worker.py determine_available_memory: when graphs will be captured
(cudagraph_mode is not NONE, so not under `--enforce-eager`) `profile_cudagraph_memory()`
captures a few graphs against a small dummy cache and extrapolates; with
VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS set (the default from v0.21.0: "CUDA graph memory
profiling is enabled (default since v0.21.0). The current --gpu-memory-utilization=0.9200 is
equivalent to --gpu-memory-utilization=0.9129 without CUDA graph memory profiling", a 0.2x
log) `available_kv_cache_memory_bytes = requested_memory - non_kv_cache_memory -
cudagraph_memory_estimate_applied`, and the figure printed as "peak activation" is the torch
peak plus that estimate (`peak_activation_memory`; vLLM PR #37426 quotes both lines). So
v0.31.0's "1.44 GiB for peak activation" (Llama-3.1-8B on an A100; 72.91 − 15.26 − 1.44 =
56.21 GiB of KV, as printed) holds the estimate, and the graphs are then captured inside the
budget. The figure a layer: logs print the estimate about twice what is captured ("CUDA graph
pool memory: 0.71 GiB (actual), 1.55 GiB (estimated)"; "0.94 … 1.94"), and v0.31.0 captured
0.23 GiB for Llama-3.1-8B's 32 layers (7.4 MiB a layer), so 16 MiB (32 for experts)."""

GRAPH_ESTIMATE_SPREAD = 0.5
"""How far vLLM's graph estimate may stray from GRAPH_ESTIMATE_BYTES_PER_LAYER: the figure rests
on one model's capture and the logs' estimate-to-capture ratio (2.1–2.2), not on a printed
estimate for the same run."""

UNIFIED_MEMORY_MARGIN_BYTES = 1280 * MIB
"""On a unified-memory card (cardclass.UNIFIED_MEMORY) CUDA's free memory is the host's, so what
the engine's process allocates on the CPU while it profiles counts as non-torch memory. Two
GB10 logs (vLLM 0.13, fp8 weights and cache) show 0.49 GiB (Qwen2.5-14B) and 1.13 GiB
(Qwen3-30B-A3B, whose fp8 MoE peak may add to it) more peak and non-torch memory than the
planner's terms; this margin spans both."""
HYBRID_NON_TORCH_MARGIN_BYTES = 512 * MIB
"""A hybrid model's recurrent layers (Gated DeltaNet, Mamba) may add Triton workspaces to
non-torch memory. The one log (vLLM 0.10.2 serving Qwen3-Next-80B-A3B at tp 2 on H200s, 1.38
GiB of non-torch memory) is explained by NVLink's collective buffers alone (NVLINK_NON_TORCH
below: H100 tp 2 and A100 tp 8 logs show 2.07 and 2.10 GiB for attention-only models), so no
surcharge is added; half a GiB of margin stays for what the recurrent kernels may hold."""

GRAPH_SPREAD = 0.25
"""How far captured CUDA graphs stray from their per-layer figure (17.6 to 21.4 MiB a dense
layer seen, torch_overhead.CUDA_GRAPH_BYTES_PER_LAYER)."""

NON_TORCH_NCCL_BYTES = 160 * MIB
"""What tensor parallel adds to non-torch memory on cards joined by PCIe only (L40S, L4, RTX,
A10G: NCCL's buffers, no NVLink channels): gt-039 (4 L40S, tp 4) 0.21 GiB against 0.06-0.07
on one card (gt-038; vLLM 0.10.2 on an H100)."""

NVLINK_NON_TORCH_V0 = 2088 * MIB
NVLINK_NON_TORCH_V1_EARLY = 1560 * MIB
NVLINK_NON_TORCH_V1 = 1864 * MIB
NVLINK_NON_TORCH_MARGIN_BYTES = 384 * MIB
"""What tensor parallel adds to non-torch memory on NVLink cards (NVLINK_CARDS), by version:
NCCL opens many more channels over NVLink/NVSwitch than over PCIe, each with its own
buffers, and the custom all-reduce maps its IPC buffers; both are allocated outside torch
by the time profiling ends, so vLLM counts them as non-torch (vllm/utils/mem_utils.py
memory_profiling: `non_torch_increase` is the device's used memory less torch's reserved after
the profile run, less the same at the snapshot taken when the instance was created).
V0 0.7.1 on 8 A100-SXM4-40GB (tp 8, DeepSeek-Coder-V2-Lite): 'non_torch_memory takes 2.10GiB'
against 0.06 on one card, so 2.04 GiB (SageMaker DJL-LMI README, code index file id
3706561278; vLLM PR #10511's pre-merge check gave the same step, 1.79 → 3.58 GiB from tp 1 to
tp 2 on an H100). V1 0.10.2 on 2 H200s (tp 2, Qwen3-Next-80B-A3B): 1.38 GiB against 0.09, so
1.29 GiB; on 4 H100s (tp 4, the same model with its MTP drafter; vLLM issue #24881) 1.84, so
1.75: 0.8-0.10 take the middle, 1.52 GiB. V1 0.19.0 on 2 H100s (tp 2, Llama-3.1-8B): 2.07 GiB
against 0.25, so 1.82 GiB (LLMD_REPORT). 0.11-0.16 and 0.21+ have no log: they take 0.19's
figure, the nearest range measured. The step does not grow with tp (2.07 at tp 2, 2.10 at tp
8). The logs spread 1.29 to 2.04 GiB: NVLINK_NON_TORCH_MARGIN_BYTES is carried as margin
beside it."""

NVLINK_CARDS = ("h100", "h200", "h800", "h20", "a100", "a800", "b200", "b100", "gb200", "gh200")
"""Card classes sold as SXM/NVLink parts (a name with "pcie" in it is not taken as one)."""

NVLS_CARDS = ("h100", "h200", "h800", "h20", "b200", "b100", "gb200", "gh200")
"""The NVLink classes whose NVSwitch does NVLink SHARP (Hopper and later): NCCL's NVLS
algorithm maps its multicast buffers there when the first large all-reduce runs, which is the
profile run, so the step survives the snapshot moving after the collectives' set-up (0.19 on
two H100s still printed 2.07 GiB). Ampere NVLink parts (A100, A800) have no NVLS: under V1
they take what a PCIe card takes (no V1 log on A100 at tp > 1 shows the step, and outside
measurements at tp 1 and 2 on A100s find vLLM's non-torch figure not growing with tp)."""

COLLECTIVES_IN_SNAPSHOT = (0, 11, 0)
"""From 0.11 vLLM takes its start-up snapshot after `init_worker_distributed_environment`
(vllm-project/vllm PR #25359, "Fix OOM in vLLM replicas by ensuring consistent NCCL memory
accounting", merged September 2025 after 0.10.2): NCCL's communicators, their warm-up
all-reduce (pynccl.py runs one when CudaCommunicator builds it) and the custom all-reduce's
buffers are then in the snapshot, outside the non-torch increase. Before, init_device took the
snapshot first and the profile counted them (gt-039, 0.10.2 on four L40S: 0.21 GiB against
0.06-0.07 on one card)."""


def nvlink_card(card: CardTotals) -> bool:
    """Whether `card` is taken to be joined to its peers by NVLink (NVLINK_CARDS)."""
    name = card.name.strip().lower()
    return "pcie" not in name and name.startswith(NVLINK_CARDS)


AMPERE_V0_STEP_FROM_TP = 8
"""On Ampere NVLink parts (A100, A800) NVLink's step is applied under V0 from this tp on: the
one log is at tp 8 (8 A100s, 2.10 GiB non-torch under 0.7.1), and outside measurements on A100s
at tp 1 and 2 find vLLM's non-KV memory not growing with tp, so tp 2-4 take the PCIe figure."""


def nvls_card(card: CardTotals) -> bool:
    """Whether `card` is an NVLink part whose NVSwitch does NVLink SHARP (NVLS_CARDS)."""
    return nvlink_card(card) and card.name.strip().lower().startswith(NVLS_CARDS)


def collective_step(rules: VllmRules, card: CardTotals, tp: int) -> tuple[int, int, str]:
    """What tensor parallel over `tp` cards adds to vLLM's non-torch figure under `rules` on
    `card`, its margin, and the words for `rules`: NVLink's collective buffers where a log
    shows vLLM counting them (NVLS parts at any tp; Ampere NVLink parts under V0 from tp 8,
    AMPERE_V0_STEP_FROM_TP), NCCL's PCIe-sized
    buffers where the snapshot precedes the collectives' set-up (before 0.11), else nothing,
    with that much margin (COLLECTIVES_IN_SNAPSHOT)."""
    if tp <= 1:
        return 0, 0, ""
    ampere_v0 = rules.v0 and not nvls_card(card) and tp >= AMPERE_V0_STEP_FROM_TP
    if nvlink_card(card) and (nvls_card(card) or ampere_v0):
        step = rules.nvlink_non_torch_bytes
        return step, NVLINK_NON_TORCH_MARGIN_BYTES, f"NVLink collectives {step / GIB:.2f} GiB"
    if rules.since < COLLECTIVES_IN_SNAPSHOT:
        return NON_TORCH_NCCL_BYTES, 0, ""
    return 0, NON_TORCH_NCCL_BYTES, "collectives set up before the snapshot (PR #25359)"


CROSS_ATTENTION_IMAGE_TOKEN_BYTES = 47_980
"""What vLLM V0's profile run holds per encoder token of a cross-attention VLM's dummy images
at its peak, the vision tower's (mllama). V0's encoder-decoder runner
(vllm/worker/enc_dec_model_runner.py profile_run) builds max_num_seqs dummy requests, each
with `--limit-mm-per-prompt` images (1 by default) of the most tiles
(mllama.py dummy_encoder_data_for_mllama: get_max_mllama_image_tokens, 4 × 1601 tokens), and
runs the vision tower over all of them at once; it does not cut the requests by the image's
tokens as the decoder-only runner does. The tower's widths say what is alive per token at its
last local layer: the tiles' attention mask (mllama.py _prepare_aspect_ratio_attention_mask:
(4 × 1608)² bf16 per image, 12,864 B a token), the five kept intermediate layers' outputs
(intermediate_layers_indices, 5 × 1280 × 2 B), the MLP's two 5120-wide tensors and the
residual, about 46-51 KB. The figure is the one log's: vLLM PR #12126 (V0 0.6.6, H100,
Llama-3.2-11B-Vision, 128 requests), 'PyTorch activation peak memory takes 36.63GiB' over
128 × 6404 tokens. Llama-3.2-90B-Vision has the same tower, so the same figure."""

CROSS_ATTENTION_MARGIN = 0.10
"""How far the figure above may stray: the widths' sum spans 46-51 KB a token around it."""

FLASHINFER_SAMPLER_BYTES_PER_LOGIT = 13
"""What the dummy sampler run holds a logit when vLLM samples with FlashInfer, with no tensor
parallel term. Under V1 0.8-0.11 `TopKTopPSampler` (vllm/v1/sample/ops/topk_topp_sampler.py,
read at v0.8.5, v0.9.2, v0.10.1.1, v0.10.2 and v0.11.0, whose flashinfer_sample and
_dummy_sampler_run are 0.10.2's) takes FlashInfer whenever the package imports and
VLLM_USE_FLASHINFER_SAMPLER is not set to 0 (0.8.5: a FlashInfer older than 0.2.3, the one
vLLM's 0.8.5 image installs), and the PyTorch sort otherwise; from 0.12 (read at v0.12.0,
v0.13.0, v0.16.0, v0.19.0) FlashInfer is opt-in (VLLM_USE_FLASHINFER_SAMPLER=1), so those ranges
carry no FlashInfer figure. vLLM's own images install it (docker/Dockerfile: 0.2.1.post2 at
v0.8.5, 0.2.6.post1 at v0.9.2, 0.3.0 at v0.10.2, 0.3.1 at v0.11.0); `pip install vllm` does not
before 0.12 (requirements/cuda.txt). flashinfer_sample hands the logits to
top_k_top_p_sampling_from_logits, which masks the top-k (fp32) and softmaxes (fp32) without a
sort: the bf16 logits 2 B, their fp32 copy 4 (sampler.py forward), the masked logits 4 and the
probabilities 4 are alive at once, 14 B counted. The figure is the logs': vLLM 0.10.1.1 on an
A100 80GB with FlashInfer installed ('Using FlashInfer for top-p & top-k sampling'), Qwen2-7B at
utilisation 0.25 and 0.5, printed 5.01 and 24.83 GiB, so 0.55 GiB of non-KV memory both times,
of which 0.47 over 256 × 152064 logits: 12.9 B a logit (github.com/dennislee22/
vLLM-benchmarking log/vllm-7B-1gpuA10080GB-0.25GRAM.log, -0.5GRAM.log). At tp 2 the same setup
printed 12.02 and 31.83 GiB: 0.67 GiB, the tp 1 figure plus NCCL's PCIe step and no gather term;
the PyTorch sort's 28 B (+10 at tp > 1) is what the other logs show (gt-038, gt-039, which do not
name their sampler, and the same repository's A100 40GB run at tp 2, which says FlashInfer is
not available: 11.03 GiB)."""

TP_GATHER_BYTES_PER_LOGIT = 10
"""With tensor parallel the LM head's vocabulary shards are all-gathered into whole logits
(the gather buffer and its reshaped copy in bf16, before the fp32 cast): gt-039 (tp 4, 256 ×
151936 logits) peaked 1.4 GiB, 38 B a logit with the 28 above."""


@dataclass(frozen=True)
class VllmRules(Ranged):
    """What one range of vLLM versions does at start."""

    utilisation: float = 0.90
    """`--gpu-memory-utilization` default (vllm/config/cache.py)."""
    sampler_bytes_per_logit: int = 28
    """Bytes the dummy sampler run holds per request × vocabulary entry."""
    sampler_fixed_bytes: int = 0
    """What the sampler's peak holds besides (workspaces that do not follow its logits)."""
    non_torch_bytes: int = 0
    """Non-torch memory on one card (tensor parallel adds NON_TORCH_NCCL_BYTES)."""
    graph_estimate: bool = False
    """Whether vLLM estimates CUDA graphs while profiling and keeps the estimate out of the pool."""
    v0: bool = False
    """V0's engine: chunked prefill off up to 32K unless asked."""
    tp_gather_bytes_per_logit: int = 0
    """What tensor parallel adds to the sampler's peak per logit (TP_GATHER_BYTES_PER_LOGIT
    where a logged run shows it, else 0)."""
    nvlink_non_torch_bytes: int = NVLINK_NON_TORCH_V1
    """What tensor parallel adds to non-torch memory on NVLink cards (NVLINK_NON_TORCH_*)."""
    flashinfer_bytes_per_logit: int = 0
    """The sampler's bytes a logit when FlashInfer is installed and the range's sampler takes it
    by default (FLASHINFER_SAMPLER_BYTES_PER_LOGIT: V1 0.8-0.11), else 0: the range's figure
    holds whatever is installed."""


VLLM_RULES: tuple[VllmRules, ...] = (
    VllmRules(
        (0, 0, 0),
        (0, 6, 5),
        "vLLM V0 before 0.6.5",
        0.90,
        38,
        0,
        352 * MIB,
        v0=True,
        tp_gather_bytes_per_logit=TP_GATHER_BYTES_PER_LOGIT,
        nvlink_non_torch_bytes=NVLINK_NON_TORCH_V0,
    ),
    VllmRules(
        (0, 6, 5),
        (0, 7, 0),
        "vLLM V0 0.6.5 to 0.6.6",
        0.90,
        38,
        0,
        104 * MIB,
        v0=True,
        tp_gather_bytes_per_logit=TP_GATHER_BYTES_PER_LOGIT,
        nvlink_non_torch_bytes=NVLINK_NON_TORCH_V0,
    ),
    VllmRules(
        (0, 7, 0),
        (0, 8, 0),
        "vLLM V0 0.7",
        0.90,
        38,
        0,
        64 * MIB,
        v0=True,
        tp_gather_bytes_per_logit=TP_GATHER_BYTES_PER_LOGIT,
        nvlink_non_torch_bytes=NVLINK_NON_TORCH_V0,
    ),
    VllmRules(
        (0, 8, 0),
        (0, 11, 0),
        "vLLM V1 0.8 to 0.10",
        0.90,
        28,
        0,
        96 * MIB,
        tp_gather_bytes_per_logit=TP_GATHER_BYTES_PER_LOGIT,
        nvlink_non_torch_bytes=NVLINK_NON_TORCH_V1_EARLY,
        flashinfer_bytes_per_logit=FLASHINFER_SAMPLER_BYTES_PER_LOGIT,
    ),
    VllmRules(
        (0, 11, 0),
        (0, 12, 0),
        "vLLM V1 0.11.x",
        0.90,
        38,
        224 * MIB,
        96 * MIB,
        flashinfer_bytes_per_logit=FLASHINFER_SAMPLER_BYTES_PER_LOGIT,
    ),
    VllmRules((0, 12, 0), (0, 17, 0), "vLLM V1 0.12 to 0.16", 0.90, 38, 224 * MIB, 96 * MIB),
    VllmRules((0, 17, 0), (0, 21, 0), "vLLM V1 0.17 to 0.20", 0.90, 14, 120 * MIB, 256 * MIB),
    VllmRules((0, 21, 0), None, "vLLM V1 0.21 and later", 0.92, 30, 0, 272 * MIB, True),
)
"""By version.

Utilisation: 0.90 up to 0.20 (cache.py; DESIGN §5), 0.92 since (cache.py
`Field(default=0.92)`; v0.31.0 prints "Desired GPU memory utilization is (0.92, 72.91 GiB)").

Sampler bytes per logit (the dummy sampler run over min(max_num_seqs, batch) requests × the
vocabulary: fp32 logits, the top-k/top-p sort's values and int64 indices, softmax, the
scattered result; vllm/v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p, alive at once:
bf16 logits 2 + fp32 4 + sorted 4 + int64 indices 8 + two masks 2 + softmax 4 + scatter 4 = 28
B): 28 B before 0.11 (gt-038: 1.04 GiB over 256 × 152064 logits, 28.7 B; gt-039 with the
tensor-parallel gather below). From 0.11, 38 B and 224 MiB besides, the line through gt-036
(v0.11.0: 35.34 GiB left needs 1.12 GiB over 256 × 100352 logits) and gt-030 (0.11, gpt-oss-120b
at 0.95 on an H100: 1.71 GiB left needs 7.45 GiB over 1024 × 201088); Qwen3-14B under
v0.15.0 and v0.16.0 on an H100 (1024 × 151936 logits: 5.64 GiB measured, 5.73 on the line;
LLMD_REPORT below).

From 0.21, 30 B and nothing besides: v0.31.0 on an A100 printed 1.44 GiB of "peak activation"
for Llama-3.1-8B (256 × 128256 logits, 2048 tokens), which holds the CUDA-graph estimate
(GRAPH_ESTIMATE_BYTES_PER_LAYER: 32 × 16 MiB); the torch peak is the other 0.94 GiB, the
sampler's PyTorch sort at 30 B a logit with the batch's hidden states (28 B counted above).

From 0.17 to 0.20, 14 B and 120 MiB besides: top-k/top-p no longer sort the whole vocabulary
for a batch of 8 or more: vLLM PR #48913 describes the sort-based apply_top_k_top_p_pytorch
(vllm/v1/sample/ops/topk_topp_sampler.py) as kept for batches under 8 and for CPU, a Triton
kernel filtering the others. The figure measured is what that leaves alive at the peak: the
bf16 logits (2), their fp32 copy (4), the probabilities (4) and the exponential draw (4), 14 B.
(The release the kernel landed in is inferred from the measured step at 0.17, not read.)
The line through LLMD_REPORT's v0.19.0 runs on an H100 (1024 requests, 8192 tokens):
Llama-3.1-8B 1.89 GiB (131.3 M logits), Qwen2.5-7B 2.21 (155.7 M), phi-4 1.52 (102.8 M),
gemma-2-9b 3.62-3.66 (262.1 M) all within 2 %; Qwen3-14B fell from 5.64 GiB at v0.16.0 to 2.23
at v0.17.0 with nothing else changed.

V0 (before 0.8) without chunked prefill: 38 B, from v0.7.2 serving Qwen2.5-Math-1.5B on a 22.06
GiB card (max_model_len 4096: 4096 tokens over 256 requests): "PyTorch activation peak memory
takes 1.40GiB" over 256 × 151936 logits (38.6 B a logit with the batch's hidden states; code
index file id 60663571995); with chunked prefill none (V0_CHUNKED_SAMPLER). gt-023/024 peak at
the forward pass either way.

Non-torch memory: V0 before 0.6.5 0.35 GiB (gt-023: its "Memory profiling results" counted
what the card held after profiling less torch's, the CUDA context with it); from 0.6.5 V0
profiles against a snapshot taken after the CUDA context and NCCL are up (vLLM PR #10511,
"overhaul memory profiling", merged 2024-12-14 for 0.6.5): 0.6.5-0.6.6 print 0.10 GiB for
unquantized text models (Qwen2.5-7B on an RTX 3090 under 0.6.6, Meta-Llama-3-8B on an A100
40GB under 0.6.6; logged_runs.jsonl), so 104 MiB; the 0.7 logs print 0.01-0.08 (0.05 on 24 GB
cards twice, 0.08 on an L40S, 0.01 on a T4), so 64 MiB; V1 0.06-0.07 (gt-038; 0.10.2 on an
H100), so 96 MiB;
from 0.21 vLLM counts every persistent allocation from the device's free memory ("consumed
memory (weights + non-torch)": v0.31.0, 15.26 GiB for Llama-3.1-8B's 14.99 of weights), 272
MiB; 0.18-0.19 measured 0.24-0.25 on an H100 (LLMD_REPORT: "non-torch forward increase
memory", 0.13 at 0.15-0.17), so 256 MiB from 0.17.

Tensor parallel's logit gather (TP_GATHER_BYTES_PER_LOGIT) only before 0.11: from 0.11 the
measured peak does not move with tp (issue 19: dense models at tp 2 on H100 under 0.11 came out
3-4 % under with it; LLMD_REPORT v0.19.0: Llama-3.1-8B and Qwen2.5-7B peak 1.89 and 2.21 GiB at
tp 1, 2 and 4 alike). The gathered logits replace the shard, and the gather's buffer is freed
before the sampler allocates its own (vllm/model_executor/layers/logits_processor.py
_gather_logits), so the sampler's peak is the one-card peak."""

LLMD_REPORT = (
    "github.com/jgchn/llm-d-planner branch accuracy (commit 151baf3), "
    "accuracy/accuracy_report.md: vLLM v0.15.0-v0.19.0 start-up logs on an H100-80GB at "
    "--gpu-memory-utilization 0.95 and --max-model-len 8192, parsed from the DEBUG line "
    "'Memory profiling takes … torch peak memory increase … non-torch forward increase "
    "memory …' (llm-d-incubation/llm-d-planner issue #194, PR #205)"
)
"""Where the 0.15-0.19 figures come from: a sweep of real vLLM start-ups whose report prints,
per run, the weights, the torch peak increase, the non-torch increase and the KV pool."""

UNKNOWN_VERSION_NOTE = "the margin spans every known range's activation and non-torch figures"
"""What the rules say when a profile's version is in no known range (or none is named)."""


@dataclass(frozen=True)
class VllmProfile:
    """The numbers vLLM's start-up works with on one card."""

    rules: VllmRules
    rules_said: str
    batched_tokens: int
    max_num_seqs: int
    chunked_prefill: bool = True


def large_card(card: CardTotals) -> bool:
    """Whether vLLM gives this card its large defaults (70 GiB of CUDA memory, not an A100).
    vLLM reads the memory from NVML and takes 0 when NVML fails (get_batch_defaults' "except
    Exception: device_memory = 0"), so a unified-memory card is a small one whatever it holds:
    two GB10 logs (vLLM 0.13) print max_num_batched_tokens=2048 on 119.7 GiB."""
    if not nvml_reports_memory(card.name):
        return False
    total = card.cuda_bytes or card.nvml_bytes
    return total >= LARGE_CARD_BYTES and "a100" not in card.name.lower()


@dataclass(frozen=True)
class BatchFlags:
    """What the arguments say of vLLM's profiling batch, before the version and context
    decide it (None: not given)."""

    batched_tokens: int | None
    max_num_seqs: int | None
    no_chunked: bool
    chunked: bool
    large_card: bool


def batch_flags(grammar: Grammar, args: Sequence[str], card: CardTotals) -> BatchFlags:
    """The batch settings `args` give on `card` (read once per setting)."""
    return BatchFlags(
        grammar.count(args, MAX_NUM_BATCHED_TOKENS),
        grammar.count(args, MAX_NUM_SEQS),
        grammar.has(args, NO_CHUNKED_PREFILL),
        grammar.has(args, CHUNKED_PREFILL),
        large_card(card) if (card.cuda_bytes or card.nvml_bytes) else True,
    )


def profile_at(rules: VllmRules, said: str, flags: BatchFlags, tokens: int) -> VllmProfile:
    """The batch vLLM profiles with under `rules` for a context of `tokens`."""
    default = BATCHED_TOKENS_LARGE_CARD if flags.large_card else BATCHED_TOKENS_SMALL_CARD
    batched = flags.batched_tokens or default
    chunked = not flags.no_chunked
    if rules.v0 and not flags.chunked:
        chunked = chunked and tokens > V0_CHUNKED_ABOVE_TOKENS
    if not chunked:
        batched = max(batched, tokens)
    seqs = flags.max_num_seqs or (
        MAX_NUM_SEQS_LARGE_CARD if flags.large_card else MAX_NUM_SEQS_SMALL_CARD
    )
    return VllmProfile(rules, said, batched, seqs, chunked)


def vllm_profile(
    grammar: Grammar, args: Sequence[str], *, card: CardTotals, tokens: int, engine_version: str
) -> VllmProfile:
    """The version's rules and the batch vLLM profiles with for a context of `tokens`."""
    rules, said = pick(VLLM_RULES, engine_version)
    return profile_at(rules, said, batch_flags(grammar, args, card), tokens)


def vllm_overhead(
    grammar: Grammar,
    shape: ModelShape,
    args: Sequence[str],
    *,
    tokens: int,
    tp: int,
    pp: int,
    card: CardTotals,
    engine_version: str,
    default_utilisation: float | None = None,
) -> Overhead:
    """What vLLM takes on a card beside weights and KV, inside `requested`, by its version's
    rules; and what must fit outside it (the CUDA context, and before 0.21 the graphs).

    Worked out once per shape and setting: with chunked prefill (V1's default) and a known
    version nothing here depends on the context, so the answer is kept in the shape's
    `sizing_memo` (`engines.memo`) under the arguments with `--max-model-len`'s value left
    out (bounded, OVERHEADS_KEPT)."""
    rules, _ = pick(VLLM_RULES, engine_version)
    token_free = not rules.v0 and not grammar.has(args, NO_CHUNKED_PREFILL)
    key = (
        _without_context(args) if token_free else tuple(args),
        0 if token_free else tokens,
        tp,
        pp,
        card,
        engine_version,
        default_utilisation,
        grammar.engine,
    )
    kept = memo_table(shape, "vllm_overheads")
    over = kept.get(key)
    if isinstance(over, Overhead):
        kept.move_to_end(key)
    else:
        over = _memo_overhead(
            kept,
            key,
            grammar,
            shape,
            args,
            tokens,
            tp,
            pp,
            card,
            engine_version,
            default_utilisation,
        )
    if in_a_range(VLLM_RULES, engine_version):
        return over
    masked = key[0] if token_free else _without_context(args)
    spread = _unknown_spread(grammar, shape, args, masked, tokens=tokens, tp=tp, card=card)
    return replace(
        over,
        margin_bytes=over.margin_bytes + spread,
        rules=f"{over.rules}; {UNKNOWN_VERSION_NOTE} ({spread / GIB:.2f} GiB more)",
    )


def vllm_overhead_tokens(
    grammar: Grammar, args: Sequence[str], *, card: CardTotals, engine_version: str
) -> Callable[[int], Hashable]:
    """What of a context `vllm_overhead` reads under `args` on `card` at `engine_version`, as
    a function of the tokens (equal answers, equal overheads): nothing with chunked prefill
    under V1 at a known version; under an unknown one, the batch V0 would profile (its range's
    figures go into the margin, `_unknown_spread`); else the tokens themselves."""
    rules, _ = pick(VLLM_RULES, engine_version)
    if rules.v0 or grammar.has(args, NO_CHUNKED_PREFILL):
        return _same_tokens
    if in_a_range(VLLM_RULES, engine_version):
        return _no_tokens
    flags = batch_flags(grammar, args, card)

    def v0_batch(tokens: int) -> Hashable:
        v0 = profile_at(VLLM_RULES[0], "", flags, tokens)
        return (v0.batched_tokens, v0.chunked_prefill)

    return v0_batch


def _same_tokens(tokens: int) -> Hashable:
    """All of the context."""
    return tokens


def _no_tokens(tokens: int) -> Hashable:
    """None of the context."""
    return 0


def _unknown_spread(
    grammar: Grammar,
    shape: ModelShape,
    args: Sequence[str],
    masked: tuple[str, ...],
    *,
    tokens: int,
    tp: int,
    card: CardTotals,
) -> int:
    """The spread of every range's peak and non-torch memory for these settings: the margin
    a version in no known range carries (each range with its own batch: V0 profiles the whole
    context when chunked prefill is off). Kept per shape under the arguments less the context
    and the batch V0 would profile, which is all the context changes here."""
    kept = memo_table(shape, "vllm_spreads")
    flags = kept.get((masked, card))
    if not isinstance(flags, BatchFlags):
        flags = kept[(masked, card)] = batch_flags(grammar, args, card)
    v0 = profile_at(VLLM_RULES[0], "", flags, tokens)
    key = (masked, card, tp, v0.batched_tokens, v0.chunked_prefill)
    spread = kept.get(key)
    if isinstance(spread, int):
        return spread
    forward = forward_cost(shape, tp=tp, expert_parallel=grammar.has(args, EXPERT_PARALLEL))
    mm = mm_inputs(grammar, args)

    def figure(rules: VllmRules) -> int:
        profile = profile_at(rules, "", flags, tokens)
        return _activation(shape, forward, profile, rules, tp, mm)[0] + rules.non_torch_bytes

    if flags.no_chunked:
        figures = [figure(other) for other in VLLM_RULES]
    else:
        # With chunked prefill only V0's batch follows the context: the other ranges' lowest
        # and highest figures are worked out once per setting.
        newer_key = (masked, card, tp, "newer")
        newer = kept.get(newer_key)
        if not isinstance(newer, tuple):
            ones = [figure(other) for other in VLLM_RULES if not other.v0]
            newer = kept[newer_key] = (min(ones), max(ones))
        figures = [*newer, *(figure(other) for other in VLLM_RULES if other.v0)]
    kept[key] = spread = max(figures) - min(figures)
    while len(kept) > 2 * OVERHEADS_KEPT:
        kept.popitem(last=False)
    return spread


def _memo_overhead(
    kept: OrderedDict[object, object],
    key: object,
    grammar: Grammar,
    shape: ModelShape,
    args: Sequence[str],
    tokens: int,
    tp: int,
    pp: int,
    card: CardTotals,
    engine_version: str,
    default_utilisation: float | None,
) -> Overhead:
    """`_vllm_overhead`, kept under `key` (the least recently used dropped past
    OVERHEADS_KEPT)."""
    over = _vllm_overhead(
        grammar,
        shape,
        args,
        tokens=tokens,
        tp=tp,
        pp=pp,
        card=card,
        engine_version=engine_version,
        default_utilisation=default_utilisation,
    )
    kept[key] = over
    while len(kept) > OVERHEADS_KEPT:
        kept.popitem(last=False)
    return over


OVERHEADS_KEPT = 32
"""vLLM overheads kept per shape (profiles × card classes × versions asked of it)."""

CONTEXT_FLAG = "--max-model-len"


def _without_context(args: Sequence[str]) -> tuple[str, ...]:
    """`args` with the value of `--max-model-len` (as the planner writes it: `--max-model-len
    N` or `--max-model-len=N`) left out; other spellings stay, so they only miss the memo."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg == CONTEXT_FLAG and i + 1 < len(out) and not out[i + 1].startswith("-"):
            out[i + 1] = ""
        elif arg.startswith(CONTEXT_FLAG + "="):
            out[i] = CONTEXT_FLAG + "="
    return tuple(out)


def _vllm_overhead(
    grammar: Grammar,
    shape: ModelShape,
    args: Sequence[str],
    *,
    tokens: int,
    tp: int,
    pp: int,
    card: CardTotals,
    engine_version: str,
    default_utilisation: float | None,
) -> Overhead:
    """`vllm_overhead` itself."""
    profile = vllm_profile(grammar, args, card=card, tokens=tokens, engine_version=engine_version)
    rules = profile.rules
    expert_parallel = grammar.has(args, EXPERT_PARALLEL)
    forward = forward_cost(shape, tp=tp, expert_parallel=expert_parallel)
    flashinfer = bool(rules.flashinfer_bytes_per_logit) and declares_flashinfer(engine_version)
    activation, activation_margin = _activation(
        shape, forward, profile, rules, tp, mm_inputs(grammar, args), flashinfer
    )
    eager = grammar.has(args, ENFORCE_EAGER)
    layers = layers_per_stage(shape, pp)
    graphs_out = graphs_in = 0
    if not eager:
        moe = is_moe(shape)
        if rules.graph_estimate:
            estimate = GRAPH_ESTIMATE_BYTES_PER_MOE_LAYER if moe else GRAPH_ESTIMATE_BYTES_PER_LAYER
            graphs_in = layers * estimate
        else:
            per_layer = CUDA_GRAPH_BYTES_PER_MOE_LAYER if moe else CUDA_GRAPH_BYTES_PER_LAYER
            graphs_out = layers * per_layer
    step, step_margin, step_said = collective_step(rules, card, tp)
    non_torch = rules.non_torch_bytes + step
    hybrid = shape.has_recurrent
    util = grammar.fraction(args, GPU_MEMORY_UTILIZATION) or (
        default_utilisation if default_utilisation is not None else rules.utilisation
    )
    total = card.cuda_bytes
    budget = int(total * util)
    margin = (
        activation_margin
        + NON_TORCH_MARGIN_BYTES
        + (HYBRID_NON_TORCH_MARGIN_BYTES if hybrid else 0)
        + (0 if nvml_reports_memory(card.name) else UNIFIED_MEMORY_MARGIN_BYTES)
        + step_margin
        + int(graphs_in * GRAPH_ESTIMATE_SPREAD)
        + int(card.cuda_margin_bytes * util)
    )
    said = profile.rules_said
    if flashinfer:
        said += "; sampler FlashInfer's (the version's +flashinfer label)"
    elif rules.flashinfer_bytes_per_logit:
        lower = activation - flashinfer_peak(shape, forward, profile, tp, grammar, args)
        if lower > 0:
            said += (
                f"; sampler as PyTorch's sort (with FlashInfer installed, as in vLLM's image, "
                f"the peak is {lower / GIB:.2f} GiB lower and the pool that much larger)"
            )
    if step_said:
        said += f"; {step_said}"
    if shape.compute is not None and shape.compute.vision and grammar.has(args, SKIP_MM_PROFILING):
        said += (
            "; --skip-mm-profiling: no encoder in the profile run, so what the encoder takes "
            "while serving is outside vLLM's budget"
        )
    if graphs_out:
        said += "; CUDA graphs outside the budget"
    if graphs_in:
        said += f"; CUDA graphs estimated inside the budget ({graphs_in / GIB:.2f} GiB)"
    return Overhead(
        budget_bytes=budget,
        activation_bytes=activation,
        non_torch_bytes=non_torch,
        cuda_graph_bytes=graphs_in,
        outside_bytes=CUDA_CONTEXT_BYTES + graphs_out,
        outside_room_bytes=total - budget if total else 0,
        outside_margin_bytes=int(graphs_out * GRAPH_SPREAD),
        margin_bytes=margin,
        rules=f"{said}; utilisation {util:g} of the CUDA total ({card.cuda_source or 'not known'})",
        card_total_bytes=total,
    )


FLASHINFER_LABEL = "flashinfer"
"""The local version label (PEP 440, after "+") by which a profile or a node says its vLLM has
FlashInfer installed, "0.10.2+flashinfer": vLLM's V1 0.8-0.11 sampler then takes it
(FLASHINFER_SAMPLER_BYTES_PER_LOGIT) and the planner sizes the peak by it. Nothing in the
arguments tells it, and vLLM's own version string does not carry it."""


def declares_flashinfer(engine_version: str) -> bool:
    """Whether `engine_version`'s local label (after "+") names FlashInfer (FLASHINFER_LABEL)."""
    _, plus, local = engine_version.partition("+")
    return bool(plus) and FLASHINFER_LABEL in local.lower()


def flashinfer_peak(
    shape: ModelShape,
    forward: ForwardCost,
    profile: VllmProfile,
    tp: int,
    grammar: Grammar,
    args: Sequence[str],
) -> int:
    """The profile run's torch peak under `profile` when vLLM samples with FlashInfer
    (FLASHINFER_SAMPLER_BYTES_PER_LOGIT): what an install with FlashInfer prints, where the
    range takes it by default; the range's own figure where it does not."""
    mm = mm_inputs(grammar, args)
    return _activation(shape, forward, profile, profile.rules, tp, mm, flashinfer=True)[0]


MM_MODALITIES = ("image", "video", "audio")
"""The input modalities vLLM's `--limit-mm-per-prompt` caps for the models the planner sizes."""


@dataclass(frozen=True)
class MmInputs:
    """What `--limit-mm-per-prompt` lets the profile run's dummy requests carry: `images` a
    request (vLLM's default, 1, when the limit does not name images; 0 when it forbids them,
    and a cross-attention VLM then profiles no tower), and whether any encoder output is kept
    (`encoder` False only when image, video and audio are each limited to 0: the model is then
    profiled as its language model; a limit that leaves any modality at the default keeps the
    encoder's terms, the safe side: the pool is then at most one batch's outputs under)."""

    images: int = 1
    encoder: bool = True


def mm_inputs(grammar: Grammar, args: Sequence[str]) -> MmInputs:
    """`--limit-mm-per-prompt`'s counts, written `image=N,video=M` or as JSON `{"image": N}`,
    as MmInputs; `--language-model-only` and `--skip-mm-profiling` profile no multimodal item."""
    if grammar.has(args, LANGUAGE_MODEL_ONLY) or grammar.has(args, SKIP_MM_PROFILING):
        return MmInputs(images=0, encoder=False)
    raw = grammar.get(args, LIMIT_MM_PER_PROMPT) or ""
    found = re.finditer(r"\b(image|video|audio)[\"']?\s*[:=]\s*(\d{1,3})\b", raw)
    limits = {match.group(1): int(match.group(2)) for match in found}
    text_only = all(limits.get(modality, 1) == 0 for modality in MM_MODALITIES)
    return MmInputs(images=limits.get("image", 1), encoder=not text_only)


def _activation(
    shape: ModelShape,
    forward: ForwardCost,
    profile: VllmProfile,
    rules: VllmRules,
    tp: int,
    mm: MmInputs = MmInputs(),
    flashinfer: bool = False,
) -> tuple[int, int]:
    """The profile run's torch peak under `rules` and its margin: the larger of the forward
    pass over the batch and the dummy sampler over its requests (with the hidden states of
    the batch still alive), plus a multimodal model's retained encoder outputs; under V0 a
    cross-attention VLM's vision tower over every request's dummy images when that is larger
    (CROSS_ATTENTION_IMAGE_TOKEN_BYTES); `mm` what the multimodal limits allow (MmInputs)."""
    tokens = shape.compute.cross_attention_image_tokens if shape.compute and mm.images else 0
    if rules.v0 and tokens:
        tower = profile.max_num_seqs * mm.images * tokens * CROSS_ATTENTION_IMAGE_TOKEN_BYTES
        peak, margin = _text_activation(shape, forward, profile, rules, tp, flashinfer, mm.encoder)
        if tower > peak:
            return tower, int(tower * CROSS_ATTENTION_MARGIN)
        return peak, margin
    return _text_activation(shape, forward, profile, rules, tp, flashinfer, mm.encoder)


def _text_activation(
    shape: ModelShape,
    forward: ForwardCost,
    profile: VllmProfile,
    rules: VllmRules,
    tp: int,
    flashinfer: bool = False,
    encoder: bool = True,
) -> tuple[int, int]:
    """`_activation` for the forward pass and the sampler (`flashinfer`: FlashInfer's sampler,
    FLASHINFER_SAMPLER_BYTES_PER_LOGIT, where the range takes it when installed; `encoder`:
    a multimodal model's encoder outputs are kept)."""
    batched = profile.batched_tokens
    forward_bytes = forward.bytes(batched)
    hidden_bytes = batched * activation_width(shape) * ACTIVATION_BYTES
    rows = min(profile.max_num_seqs, batched)
    if flashinfer and rules.flashinfer_bytes_per_logit:
        per_logit, fixed = rules.flashinfer_bytes_per_logit, 0
    else:
        gather = rules.tp_gather_bytes_per_logit if tp > 1 else 0
        per_logit, fixed = rules.sampler_bytes_per_logit + gather, rules.sampler_fixed_bytes
    sampler_bytes = rows * vocab_size(shape) * per_logit + fixed + hidden_bytes
    if rules.v0 and profile.chunked_prefill:
        sampler_bytes = 0  # V0_CHUNKED_SAMPLER: its chunked profile run peaked at the forward pass
    vision = shape.compute is not None and shape.compute.vision
    retained = hidden_bytes if vision and encoder else 0
    if forward_bytes >= sampler_bytes:
        return forward_bytes + retained, int(forward_bytes * forward.margin)
    return sampler_bytes + retained, int(sampler_bytes * SAMPLER_MARGIN)
