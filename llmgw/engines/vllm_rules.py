"""vLLM's rules by version range: what each range's profile run holds (the sampler's bytes a
logit, non-torch memory, NVLink's collective step, the CUDA-graph estimate, the default
utilisation), each figure cited to the source read or the logs it was fitted to. The ranges
are picked by `llmgw.engines.versions.pick`; vllm_memory and vllm_peak apply them."""

from __future__ import annotations

from dataclasses import dataclass, replace

from llmgw.cardclass import MIB
from llmgw.engines.versions import Ranged

NVLINK_NON_TORCH_V0 = 2088 * MIB


NVLINK_NON_TORCH_V1_EARLY = 1560 * MIB


NVLINK_NON_TORCH_V1 = 1864 * MIB


NVLINK_NON_TORCH_MARGIN_BYTES = 384 * MIB
"""What tensor parallel adds to non-torch memory on NVLink cards (interconnect.NVLINK_CARDS), by
version:
NCCL opens many more channels over NVLink/NVSwitch than over PCIe, each with its own
buffers, and the custom all-reduce maps its IPC buffers; both are allocated outside torch
by the time profiling ends, so vLLM counts them as non-torch (vllm/utils/mem_utils.py
memory_profiling: `non_torch_increase` is the device's used memory less torch's reserved after
the profile run, less the same at the snapshot taken when the instance was created).
V0 0.7.1 on 8 A100-SXM4-40GB (tp 8, DeepSeek-Coder-V2-Lite): 'non_torch_memory takes 2.10GiB'
against 0.06 on one card, so 2.04 GiB (a SageMaker DJL-LMI walkthrough:
aws-samples/aws-ai-ml-workshop-kr, genai/aws-gen-ai-kr/40_inference/06-Deepseek-v2-Inference/
README.md; vLLM PR #10511's pre-merge check gave the same step, 1.79 → 3.58 GiB from tp 1 to
tp 2 on an H100). V1 0.10.2 on 2 H200s (tp 2, Qwen3-Next-80B-A3B): 1.38 GiB against 0.09, so
1.29 GiB; on 4 H100s (tp 4, the same model with its MTP drafter; vLLM issue #24881) 1.84, so
1.75: 0.8-0.10 take the middle, 1.52 GiB. V1 0.19.0 on 2 H100s (tp 2, Llama-3.1-8B): 2.07 GiB
against 0.25, so 1.82 GiB (LLMD_REPORT). 0.11-0.16 and 0.21+ have no log: they take 0.19's
figure, the nearest range measured. The step does not grow with tp (2.07 at tp 2, 2.10 at tp
8). The logs spread 1.29 to 2.04 GiB: NVLINK_NON_TORCH_MARGIN_BYTES is carried as margin
beside it."""


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


NON_TORCH_CACHED_SAID = (
    "non-torch memory as 0.6.5-0.6.6 count it: PyTorch's cached but unallocated memory "
    "counts too (vLLM PR #11809), 0.10-0.28 GiB logged at tp 1, the spread in the margin"
)
"""How V0 0.6.5-0.6.6 measure non-torch memory, read in vLLM's source. vLLM PR #10511 (merged
2024-12-14, first released in 0.6.5) profiles against a snapshot taken in init_device
(vllm/worker/worker.py: `self.baseline_snapshot = MemorySnapshot()` before
`init_worker_distributed_environment`, so NCCL's communicators and the custom all-reduce's
buffers fall inside the profile at tp > 1), and vllm/utils.py `memory_profiling` takes the
non-torch increase as the device's used memory (`mem_get_info` total − free) less the
baseline, the weights and the increase of `memory_stats()["allocated_bytes.all.current"]`.
vLLM PR #11809 ("[misc] improve memory profiling", merged 2025-01-07, after 0.6.6.post1)
replaced the allocated bytes with `torch.cuda.memory_reserved()`, because the allocated figure
leaves out what the caching allocator holds in segments it cannot release (partly used ones):
under 0.6.5-0.6.6 that slack is printed as non-torch memory. How much slack a run leaves
depends on the sizes and order of its allocations (a GPTQ-Marlin checkpoint repacks its
weights after loading; a vision tower's own tensors), which no shape the planner holds says,
so no figure is fitted to it: the logs print 0.10 GiB for unquantized text models (RTX 3090,
A100 40GB), 0.26 for a GPTQ-Marlin checkpoint (A100 80GB) and 0.28 for Qwen2-VL-7B (a 24 GB
card), and the 0.18 GiB between them stays inside torch_overhead.NON_TORCH_MARGIN_BYTES.
From 0.7 the figure is the reserved-based one (0.01-0.08 GiB logged)."""


MODEL_RUNNER_V2_SAID = (
    "Model Runner V2's profile run (vllm/v1/worker/gpu/model_runner.py): no CUDA-graph "
    "estimate, the sampler's fp32 logits, the graphs captured after the pool"
)
"""What the answer's `rules` say where the range's model runner is Model Runner V2."""


MODEL_RUNNER_V1_SAID = (
    "Model Runner V1's profile run (this range runs Model Runner V2 for dense text models only, "
    "and before 0.25.1 for the Llama, Mistral and Qwen3 families only)"
)
"""What the answer's `rules` say where a range that runs Model Runner V2 for dense text models
sizes another model by Model Runner V1's figures."""


V2_SAMPLER_BYTES_PER_LOGIT = 6
"""What Model Runner V2's dummy sampler run holds a logit: the logits `compute_logits` returns
(bf16, 2 B) and the fp32 copy its Sampler.sample makes of them (4 B); temperature, penalties
and the logit bias work on that copy in place, top-k/top-p run only for requests that ask for
them (the dummy requests do not: profile_run's _dummy_sampler_run notes that the profile "may
skip top_k, top_p, and logprobs"), and gumbel_sample (vllm/v1/worker/gpu/sample/gumbel.py) keeps
one value and one int64 index per 1024-entry block of the vocabulary, not per entry. Read in
vllm/v1/worker/gpu/sample/sampler.py and model_runner.py `_dummy_sampler_run` as the code
index holds them (no release tag could be checked out: the repository's snapshot is over the
fetch limit). The one log of it that the sampler could dominate: the 0.28.1 build on a Turing
card at tp 2 (Qwen2.5-1.5B, 256 requests of a 152k vocabulary: 0.24 GiB by this figure, under
the forward pass's 0.28; printed 0.32), and at tp 1 0.50 where the forward pass is 0.48.
Later copies of the sampler (an `apply_sampling_params` that returns the logits untouched
unless a request needs them processed) skip the fp32 copy for the profile's dummy requests,
which register no sampling parameters: vLLM PR #57926 (2026-09-21, open) measures what that
leaves out (an L4, Qwen2.5-0.5B at 256 requests: 1.3 % more KV than a profile with the
warm-up's parameters). The release that change landed in is not known here, so the 6 B stay,
the larger peak (the safe side); under them the bf16 logits alone, 2 B."""


COMPILED_PROFILE_PEAK_BYTES = 1488 * MIB
"""The torch peak a non-eager Model Runner V2 start reaches on a cold torch.compile cache,
whatever the model: what compiling leaves in the profile's high-water mark, not a pass the
model's widths size. Read in vLLM's source (the code index's copies; the repository's snapshot
is over the fetch limit): gpu_worker.py determine_available_memory runs `profile_run` inside
utils/mem_utils.py `memory_profiling`, whose torch peak is the caching allocator's high-water
mark over the whole window; V2's profile_run (vllm/v1/worker/gpu/model_runner.py) is one
`_dummy_run(max_num_batched_tokens)` and one `_dummy_sampler_run` over min(max_num_seqs,
tokens) rows, nothing else sized by the model. A non-eager start compiles in that window:
Dynamo traces, Inductor compiles each piecewise graph and Triton autotunes its kernels (for a
single-size compile range vLLM turns on Inductor's max_autotune and coordinate-descent tuning
too: vllm/compilation/compiler_interface.py), and what they allocate on the card is freed
before the measured forward but stays in the high-water mark. vLLM issue #54122 ("Cold AOT
compilation is charged as peak activation memory", 2026-08-27) and issue #54383 (0.28.0: the
first boot of a new max-num-batched-tokens / max-num-seqs pair gets about 5 % less KV than
the next, identical one) report it; PR #54209 (drop the high-water mark when compilation
finishes) and PR #54479 (an unmeasured compile pass before the profile) were open in September
2026, so no release the planner names has the fix. A warm cache (~/.cache/vllm kept, the same
settings, version and card) loads the compiled graphs and peaks at its forward pass;
`--enforce-eager` compiles nothing (the 0.28.1 Turing rows peak at their forward pass).

What it scales with is Inductor's and Triton's scratch, which no width or flag the planner holds
says. The three cold starts at 2048 batched tokens and 256 requests printed 1.44 GiB (v0.31.0,
Llama-3.1-8B: hidden 4096, MLP 14336, 32 layers; an A100 80GB) and 1.46 (v0.28.0 on an RTX 5090:
Qwen3-32B-AWQ, 5120 and 25600, 64 layers; Qwen3-14B-AWQ, 5120 and 17408, 40 layers): 1.8x the
MLP width and 2x the layers move it by 0.02 GiB, so no term of tokens x width fits them, and
their forward passes (0.21-0.35 GiB) and V2's sampler (0.20-0.24) sit under it: the peak is the
larger of it and them, not their sum. Warm starts print the forward pass (the same Qwen3-32B
deployment at 0.70: 0.33 GiB; a v0.29.0 pair on a 6 GB card in a public benchmark's tests, Model
Runner V1's lines: 0.67 cold, 0.22 warm; an L4 note: 1.17 and 0.07), so a warm start's pool is
larger than the planner's, the safe side. Elsewhere the cold transient spreads wider: on two RTX
4090s at tp 2 (issue #54383's thread, Qwen3-32B-AWQ at 3584 tokens and 40 requests) a cold boot
lost 0.47 GiB of KV a card, peak and non-torch together; a 1Cat-vLLM fork on a Quadro RTX 8000
printed 2.59 GiB cold against 0.74 warm (1CatAI/1Cat-vLLM PR #518). Cold starts can leave more
non-torch memory too (the RTX 5090 deployment's Qwen3-32B consumed 20.04 GiB cold and 18.62
warm; the v0.29.0 pair 2.63 and 2.10), which no figure here carries: the logged rows' weights
absorb it (PROVENANCE.md)."""


COMPILED_PROFILE_PEAK_MARGIN = 0.25
"""How far the cold compile's peak may stray from COMPILED_PROFILE_PEAK_BYTES: the three cold
starts agree within 0.02 GiB, at 2048 batched tokens on two cards; the cold transients logged
elsewhere (0.45 GiB over the warm peak on a 6 GB card, 1.85 on a Quadro RTX 8000 fork) and a
larger batch may move it; a quarter stands until a log on a large card's 8192 tokens shows it."""


V2_PENALTY_COUNT_BYTES = 4
"""What Model Runner V2 keeps on the card for each request slot and vocabulary entry from load
on: its sampler's PenaltiesState (vllm/v1/worker/gpu/sample/penalties.py, in every copy the
code index holds) allocates `output_bin_counts`, int32 [max_num_seqs, vocabulary], and
`prompt_bin_mask`, int32 [max_num_seqs, ceil(vocabulary / 32)] (V2_PROMPT_MASK_ENTRIES_PER_WORD
entries a word), when the runner builds its Sampler in load_model (model_runner.py, after the
weights are measured), whether or not any request asks for a penalty (its TODO: it "can be
very large, taking up GBs of GPU memory"). Both outlive the profile run, so vLLM counts them in
"consumed memory (weights + non-torch)" and keeps them out of the pool. They follow
max_num_seqs and the whole vocabulary (the logits are gathered before sampling, so tensor
parallel does not shard them), not the batch's tokens: 256 requests of Llama-3.1-8B's 128256
entries hold 129 MiB, 1024 of a 151936-entry vocabulary 594 MiB. Model Runner V1 keeps no such
table (vllm/v1/sample/ops/penalties.py counts the penalised requests' output tokens each step),
so V1's figures carry none."""


V2_PROMPT_MASK_ENTRIES_PER_WORD = 32
"""Vocabulary entries one int32 word of V2's prompt_bin_mask holds (a bit each)."""


V2_NON_TORCH_BYTES = 128 * MIB
"""Model Runner V2's non-torch and persistent memory besides its penalty counts
(V2_PENALTY_COUNT_BYTES). The logs print it as "consumed memory (weights + non-torch)" less
the weights: v0.31.0 on an A100 80GB, Llama-3.1-8B at 256 requests, 15.26 - 15.0 = 0.26 GiB, of
which 0.126 are the counts, so 0.13; the 0.28.1 Turing build, Qwen2.5-1.5B at 256 requests,
3.25 - 2.98 = 0.27 at tp 1 (0.149 the counts, so 0.12) and 1.71 - 1.50 = 0.21 at tp 2 (0.06).
128 MiB with the counts gives 257 and 281 MiB there, where the one figure of 272 MiB these
ranges took before (from the same A100 run) gave 272 for every model and batch."""


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
    non_torch_said: str = ""
    """What the answer's `rules` say of how the range measures non-torch memory, where that
    differs from what the other ranges count (NON_TORCH_CACHED_SAID), else nothing."""
    compiled_peak_bytes: int = 0
    """The torch peak a non-eager profile run reaches at least on a cold torch.compile cache
    (COMPILED_PROFILE_PEAK_BYTES under Model Runner V2), else 0."""
    runner_said: str = ""
    """What the answer's `rules` say of the model runner the figures are (MODEL_RUNNER_V2_SAID,
    MODEL_RUNNER_V1_SAID), else nothing."""
    v1_runner: VllmRules | None = None
    """The figures the range applies to a model vLLM keeps on Model Runner V1, where the range's
    own are Model Runner V2's for dense text models only (0.23-0.28), else None."""
    v2_families: tuple[str, ...] = ()
    """Where the range runs Model Runner V2 for the dense models of these families only
    (V2_FIRST_FAMILIES, 0.23-0.25.0): the others take `v1_runner`; () for every family."""
    penalty_state: bool = False
    """Whether the range's model runner keeps its sampler's penalty counts on the card for
    every request slot (V2_PENALTY_COUNT_BYTES: Model Runner V2), counted with non-torch."""


V2_FIRST_FAMILIES = ("llama", "mistral", "qwen3")
"""The families (a config's `model_type`, a GGUF's architecture) whose dense models vLLM ran on
Model Runner V2 by default before 0.25.1: Qwen3 from PR #39337, Llama and Mistral from PR
#43458 (v0.23.0's notes, as a third-party digest quotes them); PR #49233 dates the default for
every dense model to 0.25.1."""


V1_RUNNER_0_21 = VllmRules(
    (0, 21, 0), (0, 23, 0), "vLLM V1 0.21 to 0.22", 0.92, 30, 0, 272 * MIB, True
)
"""0.21-0.22: Model Runner V1 with its CUDA-graph estimate kept out of the pool (the figures
0.23-0.28 keep for the models they leave on Model Runner V1)."""


def _some_on_v2(
    since: tuple[int, int, int],
    until: tuple[int, int, int],
    label: str,
    families: tuple[str, ...] = (),
) -> VllmRules:
    """A range that runs Model Runner V2 for dense text models (of `families` only, when given)
    and Model Runner V1, with 0.21-0.22's figures, for the rest."""
    return VllmRules(
        since,
        until,
        label,
        0.92,
        V2_SAMPLER_BYTES_PER_LOGIT,
        0,
        V2_NON_TORCH_BYTES,
        compiled_peak_bytes=COMPILED_PROFILE_PEAK_BYTES,
        runner_said=MODEL_RUNNER_V2_SAID,
        penalty_state=True,
        v1_runner=replace(
            V1_RUNNER_0_21, since=since, until=until, label=label, runner_said=MODEL_RUNNER_V1_SAID
        ),
        v2_families=families,
    )


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
        non_torch_said=NON_TORCH_CACHED_SAID,
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
    V1_RUNNER_0_21,
    _some_on_v2((0, 23, 0), (0, 25, 1), "vLLM V1 0.23 to 0.25.0", V2_FIRST_FAMILIES),
    _some_on_v2((0, 25, 1), (0, 29, 0), "vLLM V1 0.25.1 to 0.28"),
    VllmRules(
        (0, 29, 0),
        None,
        "vLLM V1 0.29 and later",
        0.92,
        V2_SAMPLER_BYTES_PER_LOGIT,
        0,
        V2_NON_TORCH_BYTES,
        compiled_peak_bytes=COMPILED_PROFILE_PEAK_BYTES,
        runner_said=MODEL_RUNNER_V2_SAID,
        penalty_state=True,
    ),
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

0.21-0.22, 30 B and nothing besides, Model Runner V1's sort with its CUDA-graph estimate kept
out of the pool (GRAPH_ESTIMATE_BYTES_PER_LAYER). The figure was fitted to v0.31.0's 1.44 GiB of
"peak activation" (Llama-3.1-8B on an A100, 256 × 128256 logits) read as 0.94 of torch peak and
32 × 16 MiB of estimate; that start ran Model Runner V2, which estimates nothing, so it is
COMPILED_PROFILE_PEAK_BYTES's now, and no 0.21-0.22 log checks the 30 B.

From 0.23, Model Runner V2 (vllm/v1/worker/gpu/): vLLM's blog post on making it the default
("From Opt-In to Default", 2026-08-31) dates the rollout on main, Qwen3 dense models first (PR
#39337, 14 May), Llama and Mistral dense (PR #43458, 2 June; v0.23.0's release notes as a
third-party digest quotes them: V2 "the default for Llama and Mistral dense models", and
"already the default for Qwen3 dense models"), MoE families from 12 June, every dense model
(PR #44443, 2 July), every family (PR #53183, 27 August: "the first tagged release with this
default will be v0.29.0"), with fall-backs to V1 for what V2 does not support. So 0.23-0.28
size dense text models by V2's figures and other models by V1's (`v1_runner`), and 0.29 on
sizes every model by V2's. V2's profile run (model_runner.py `profile_run`) is V1's in shape:
one forward pass over max_num_batched_tokens split over min(max_num_seqs, tokens) dummy
requests, then `_dummy_sampler_run` over one logit row a request, the same max_num_seqs rows;
its sampler holds 6 B a logit (V2_SAMPLER_BYTES_PER_LOGIT), its `profile_cudagraph_memory`
returns 0, so nothing is estimated for graphs, which `capture_model` then captures out of what
the pool leaves (outside the budget, as before 0.21), and a non-eager start peaks at
COMPILED_PROFILE_PEAK_BYTES. The 0.28.1 build's "Using V2 Model Runner" starts on a Turing card
under `--enforce-eager` peaked at their forward pass (0.50 and 0.32 GiB at tp 1 and 2, where
V1's 30 B sampler line said 1.11).
Where the dates disagree: vLLM PR #49233 (2026-07-20, closed) says V2 "became the default for
dense models in 0.25.1" and that its `profile_cudagraph_memory` still returned 0 then (issue
#49224; PR #54061, open in September 2026, ports the capture profiling to V2), so from 0.23 to
0.25.0 a dense model outside the Qwen3, Llama and Mistral families may still have run V1,
whose sort and graph estimate are larger: so 0.23-0.25.0 size only those three families by
V2's figures (V2_FIRST_FAMILIES) and 0.25.1-0.28 every dense text model.
Issue #50159 measured V1 and V2 on v0.26.0 under `--enforce-eager` (Qwen2.5-0.5B, 1,024
requests on a 96 GB card) to the same KV tokens, 6,908,880: by then V1's sampler at that batch
held no more than V2's either.

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
takes 1.40GiB" over 256 × 151936 logits (38.6 B a logit with the batch's hidden states; a
test_vllm.py run pasted into a public repository's notes); with chunked prefill none
(V0_CHUNKED_SAMPLER). gt-023/024 peak at the forward pass either way.

Non-torch memory: V0 before 0.6.5 0.35 GiB (gt-023: its "Memory profiling results" counted
what the card held after profiling less torch's, the CUDA context with it); from 0.6.5 V0
profiles against a snapshot taken after the CUDA context is up and before NCCL is (vLLM PR #10511,
"overhaul memory profiling", merged 2024-12-14 for 0.6.5): 0.6.5-0.6.6 print 0.10 GiB for
unquantized text models (Qwen2.5-7B on an RTX 3090 under 0.6.6, Meta-Llama-3-8B on an A100
40GB under 0.6.6; logged_runs.jsonl), so 104 MiB (the range counts PyTorch's cached but
unallocated memory as non-torch: NON_TORCH_CACHED_SAID); the 0.7 logs print 0.01-0.08 (0.05 on
24 GB cards twice, 0.08 on an L40S, 0.01 on a T4), so 64 MiB; V1 0.06-0.07 (gt-038; 0.10.2 on an
H100), so 96 MiB;
from 0.21 vLLM counts every persistent allocation from the device's free memory ("consumed
memory (weights + non-torch)": v0.31.0, 15.26 GiB for Llama-3.1-8B's 14.99 of weights), 272
MiB for Model Runner V1 (0.21-0.22, and the models 0.23-0.28 keep on it: a figure read off that
V2 run, whose 0.126 GiB of penalty counts V1 does not hold, so likely high for V1; no V1 log of
those ranges checks it); under Model Runner V2, V2_NON_TORCH_BYTES plus its penalty counts,
which follow max_num_seqs x the vocabulary (V2_PENALTY_COUNT_BYTES); 0.18-0.19 measured
0.24-0.25 on an H100 (LLMD_REPORT: "non-torch forward increase memory", 0.13 at 0.15-0.17), so
256 MiB from 0.17.

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
