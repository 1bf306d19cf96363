"""vLLM's start-up memory, by the rules of its own profiling run, keyed by vLLM version: what
it takes beside weights and KV (this module), the profile run's batch and peak (vllm_peak), the
rules of each version range (vllm_rules) and the margin of a version in none (vllm_unknown).

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
   graphs are captured afterwards, in what `1 − utilisation` leaves; for 0.21-0.22 (and models
   kept on Model Runner V1 up to 0.28) vLLM also estimates them while profiling
   (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, on by default) and subtracts the estimate too,
   printing it inside "peak activation" (GRAPH_ESTIMATE_BYTES_PER_LAYER); Model Runner V2
   estimates nothing (vllm_rules.MODEL_RUNNER_V2_SAID), but keeps its sampler's penalty counts
   for every request slot from load on, which count as non-torch (`penalty_state_bytes`).
V0 (before 0.8) profiled the same way (worker.py determine_num_available_blocks), over
max(max_model_len, batch) tokens when chunked prefill was off (gt-023/024).

Defaults (vllm/engine/arg_utils.py get_batch_defaults): on cards of 70 GiB or more (NVML's
total, current_platform.get_device_total_memory; 0 where NVML reports none) whose name is not
an A100,
`vllm serve` batches 8192 tokens and 1024 requests, else 2048 and 256.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace

from llmgw.cardclass import GIB, MIB, nvml_reports_memory
from llmgw.engines.base import CardTotals, Overhead
from llmgw.engines.grammar import Grammar
from llmgw.engines.interconnect import nvlink_card, nvls_card
from llmgw.engines.memo import memo_table
from llmgw.engines.torch_overhead import (
    CUDA_GRAPH_BYTES_PER_LAYER,
    CUDA_GRAPH_BYTES_PER_MOE_LAYER,
    NON_TORCH_MARGIN_BYTES,
    forward_cost,
    is_moe,
    layers_per_stage,
    vocab_size,
)
from llmgw.engines.versions import in_a_range, pick
from llmgw.engines.vllm_offload import v0_offload_copy_bytes
from llmgw.engines.vllm_peak import (
    ENFORCE_EAGER,
    EXPERT_PARALLEL,
    NO_CHUNKED_PREFILL,
    SKIP_MM_PROFILING,
    declares_flashinfer,
    flashinfer_peak,
    kept_gate_up_bytes,
    mm_inputs,
    profile_peak,
    runner_rules,
    tower_said,
    vllm_profile,
)
from llmgw.engines.vllm_rules import (
    NVLINK_NON_TORCH_MARGIN_BYTES,
    V2_PENALTY_COUNT_BYTES,
    V2_PROMPT_MASK_ENTRIES_PER_WORD,
    VLLM_RULES,
    VllmRules,
)
from llmgw.engines.vllm_unknown import widen_unknown_margin, without_context
from llmgw.shape import ModelShape

GPU_MEMORY_UTILIZATION = ("--gpu-memory-utilization",)


CUDA_CONTEXT_BYTES = 544 * MIB
"""What the card holds before vLLM's snapshot (CUDA context, NCCL): H100 79.19 − 78.66 = 0.53
GiB (vLLM 0.10.2 log), gt-039 44.42 − 43.93 = 0.49, A100 79.25 − 78.84 = 0.41 (v0.31.0)."""


GRAPH_ESTIMATE_BYTES_PER_LAYER = 16 * MIB


GRAPH_ESTIMATE_BYTES_PER_MOE_LAYER = 32 * MIB
"""vLLM's CUDA-graph estimate per layer under Model Runner V1 from 0.21, which it keeps out of
the KV pool.
vllm/v1/worker/gpu_worker.py determine_available_memory: when graphs will be captured
(cudagraph_mode is not NONE, so not under `--enforce-eager`) `profile_cudagraph_memory()`
captures a few graphs against a small dummy cache and extrapolates; with
VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS set (the default from v0.21.0: "CUDA graph memory
profiling is enabled (default since v0.21.0). The current --gpu-memory-utilization=0.9200 is
equivalent to --gpu-memory-utilization=0.9129 without CUDA graph memory profiling", a 0.2x
log) `available_kv_cache_memory_bytes = requested_memory - non_kv_cache_memory -
cudagraph_memory_estimate_applied`, and the figure printed as "peak activation" is the torch
peak plus that estimate (`peak_activation_memory`; vLLM PR #37426 quotes both lines), and the
graphs are then captured inside the budget. The figure a layer: logs print the estimate about
twice what is captured ("CUDA graph pool memory: 0.71 GiB (actual), 1.55 GiB (estimated)";
"0.94 … 1.94"), and v0.31.0 captured 0.23 GiB for Llama-3.1-8B's 32 layers (7.4 MiB a layer),
so 16 MiB (32 for experts).

vLLM's estimate is not a figure a layer (`profile_cudagraph_memory` in
vllm/v1/worker/gpu_model_runner.py of the 0.2x releases, which print the "Profiling CUDA graph
memory" and "Estimated CUDA graph memory: … GiB total" lines): for each graph mode (PIECEWISE,
FULL) it captures the two largest of that mode's capture sizes into a disposable pool,
measuring CUDA's free memory around each; the first capture's drop is the mode's shared part,
the second's (at least 1 MiB) its cost a graph; the estimate is the largest shared part plus,
over the modes, the cost a graph × (the mode's capture sizes − 1). It scales with the capture
sizes (max_num_seqs, `--max-cudagraph-capture-size`, the mode), with what the largest capture
allocates in the graph pool, and with the card and kernels that make those drops; none of
those drops is printed at INFO. Logged pairs spread widely around the capture: "0.64 GiB
(actual), 0.43 GiB (estimated)" with one PIECEWISE and one FULL graph, 0.27 against 0.27 over
51 + 35 graphs, 0.38 against 0.61 over 9 + 5, 0.09 against 0.65 (start-up logs in public
notes: a v0.20.0 DGX Spark compose file's, an lm-eval agent session's, a v0.22.0 compose file's,
a v0.29.0 laptop RTX 5090 study's, which fell back to Model Runner V1). GRAPH_ESTIMATE_SPREAD
carries the spread. Model Runner V2 has no estimate (its `profile_cudagraph_memory`
returns 0): the RTX 5090 runs under v0.28.0 and the v0.31.0 A100 run (logged_runs.jsonl) print
no estimate in their "peak activation", and their "CUDAGraph memory" (0.81 GiB over
Qwen3-32B's 64 layers, 0.52 over Qwen3-14B's 40, 0.23 over Llama-3.1-8B's 32) is what
`capture_model` took after the pool, outside the budget."""


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


COLLECTIVES_IN_SNAPSHOT = (0, 11, 0)
"""From 0.11 vLLM takes its start-up snapshot after `init_worker_distributed_environment`
(vllm-project/vllm PR #25359, "Fix OOM in vLLM replicas by ensuring consistent NCCL memory
accounting", merged September 2025 after 0.10.2): NCCL's communicators, their warm-up
all-reduce (pynccl.py runs one when CudaCommunicator builds it) and the custom all-reduce's
buffers are then in the snapshot, outside the non-torch increase. Before, init_device took the
snapshot first and the profile counted them (gt-039, 0.10.2 on four L40S: 0.21 GiB against
0.06-0.07 on one card)."""


AMPERE_V0_STEP_FROM_TP = 8
"""On Ampere NVLink parts (A100, A800) NVLink's step is applied under V0 from this tp on: the
one log is at tp 8 (8 A100s, 2.10 GiB non-torch under 0.7.1), and outside measurements on A100s
at tp 1 and 2 find vLLM's non-KV memory not growing with tp, so tp 2-4 take the PCIe figure."""


def collective_step(rules: VllmRules, card: CardTotals, tp: int) -> tuple[int, int, str]:
    """What tensor parallel over `tp` cards adds to vLLM's non-torch figure under `rules` on
    `card`, its margin, and the words for `rules`: NVLink's collective buffers where a log
    shows vLLM counting them (NVLS parts at any tp; Ampere NVLink parts under V0 from tp 8,
    AMPERE_V0_STEP_FROM_TP), NCCL's PCIe-sized
    buffers where the snapshot precedes the collectives' set-up (before 0.11), else nothing,
    with that much margin (COLLECTIVES_IN_SNAPSHOT).

    On NVLS parts (interconnect.nvls_card) NCCL maps its multicast buffers when the first large
    all-reduce runs, which is the profile run, so the step survives the snapshot moving after
    the collectives' set-up (0.19 on two H100s still printed 2.07 GiB). Ampere NVLink parts
    have no NVLS: under V1 they take what a PCIe card takes (no V1 log on A100 at tp > 1 shows
    the step, and outside measurements at tp 1 and 2 on A100s find vLLM's non-torch figure not
    growing with tp)."""
    if tp <= 1:
        return 0, 0, ""
    ampere_v0 = rules.v0 and not nvls_card(card) and tp >= AMPERE_V0_STEP_FROM_TP
    if nvlink_card(card) and (nvls_card(card) or ampere_v0):
        step = rules.nvlink_non_torch_bytes
        return step, NVLINK_NON_TORCH_MARGIN_BYTES, f"NVLink collectives {step / GIB:.2f} GiB"
    if rules.since < COLLECTIVES_IN_SNAPSHOT:
        return NON_TORCH_NCCL_BYTES, 0, ""
    return 0, NON_TORCH_NCCL_BYTES, "collectives set up before the snapshot (PR #25359)"


def penalty_state_bytes(rules: VllmRules, shape: ModelShape, max_num_seqs: int) -> int:
    """What the runner under `rules` keeps on each card for its sampler's penalties, from load
    on (V2_PENALTY_COUNT_BYTES: Model Runner V2's int32 output counts and packed prompt mask,
    one row for each of `max_num_seqs` request slots over the whole vocabulary); 0 where the
    runner keeps none (Model Runner V1)."""
    if not rules.penalty_state:
        return 0
    known = shape.compute.vocab_size if shape.compute is not None else 0
    vocab = known or vocab_size(shape)  # the config's vocabulary, as the Sampler takes it
    words = -(-vocab // V2_PROMPT_MASK_ENTRIES_PER_WORD)
    return max_num_seqs * (vocab + words) * V2_PENALTY_COUNT_BYTES


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
    rules; and what must fit outside it (the CUDA context, and the graphs where vLLM captures
    them after the pool: before 0.21, and under Model Runner V2).

    The central figures (`vllm_central_overhead`), with an unknown version's spread over every
    range added to the margin (`widen_unknown_margin`)."""
    over = vllm_central_overhead(
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
    if in_a_range(VLLM_RULES, engine_version):
        return over
    return widen_unknown_margin(grammar, shape, args, over, tokens=tokens, tp=tp, pp=pp, card=card)


def vllm_central_overhead(
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
    """`vllm_overhead` before an unknown version's spread is added to its margin: the figures
    of the version's range (the newest, for a version in none).

    Worked out once per shape and setting: with chunked prefill (V1's default) nothing here
    depends on the context, so the answer is kept in the shape's `sizing_memo`
    (`engines.memo`) under the arguments with `--max-model-len`'s value left out (bounded,
    OVERHEADS_KEPT)."""
    rules, _ = pick(VLLM_RULES, engine_version)
    token_free = not rules.v0 and not grammar.has(args, NO_CHUNKED_PREFILL)
    key = (
        without_context(args) if token_free else tuple(args),
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
        return over
    return _memo_overhead(
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


def vllm_overhead_tokens(
    grammar: Grammar, args: Sequence[str], *, card: CardTotals, engine_version: str
) -> Callable[[int], Hashable]:
    """What of a context `vllm_central_overhead` reads under `args` on `card` at
    `engine_version`, as a function of the tokens (equal answers, equal overheads): nothing
    with chunked prefill under V1 (a version in no range takes the newest rules, V1's; its
    spread, which reads V0's batch, is `widen_unknown_margin`'s); else the tokens
    themselves."""
    rules, _ = pick(VLLM_RULES, engine_version)
    if rules.v0 or grammar.has(args, NO_CHUNKED_PREFILL):
        return _same_tokens
    return _no_tokens


def _same_tokens(tokens: int) -> Hashable:
    """All of the context."""
    return tokens


def _no_tokens(tokens: int) -> Hashable:
    """None of the context."""
    return 0


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
    rules = runner_rules(profile.rules, shape)
    if rules is not profile.rules:
        profile = replace(profile, rules=rules)
    expert_parallel = grammar.has(args, EXPERT_PARALLEL)
    forward = forward_cost(shape, tp=tp, expert_parallel=expert_parallel)
    flashinfer = bool(rules.flashinfer_bytes_per_logit) and declares_flashinfer(engine_version)
    mm = mm_inputs(grammar, args)
    activation, activation_margin = profile_peak(shape, forward, profile, rules, tp, mm, flashinfer)
    warm = activation
    if rules.compiled_peak_bytes and not profile.eager:  # COMPILED_PROFILE_PEAK_BYTES
        warm = profile_peak(shape, forward, replace(profile, warm=True), rules, tp, mm)[0]
    copied = v0_offload_copy_bytes(grammar, shape, args, tp, pp) if rules.v0 else 0
    activation += copied
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
    penalties = penalty_state_bytes(rules, shape, profile.max_num_seqs)
    non_torch = rules.non_torch_bytes + step + penalties
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
    if rules.runner_said:
        said += f"; {rules.runner_said}"
    kept = kept_gate_up_bytes(shape, profile, rules)
    if kept:
        said += (
            f"; run eagerly, its Qwen2-style MLP keeps the gate/up output to the down "
            f"projection ({kept / GIB:.2f} GiB more forward peak; vllm/model_executor/models/"
            f"qwen2.py Qwen2MLP)"
        )
    if warm < activation:
        said += (
            f"; the peak is a cold torch.compile cache's (vLLM issue #54122: compiling in the "
            f"profile run stays in its high-water mark); on a warm cache it is the forward pass "
            f"or sampler, {warm / GIB:.2f} GiB, and the pool {(activation - warm) / GIB:.2f} "
            f"GiB larger"
        )
    if penalties:
        said += (
            f"; its penalty counts {penalties / GIB:.2f} GiB ({profile.max_num_seqs} request "
            f"slots x the vocabulary, int32, kept from load)"
        )
    if rules.non_torch_said:
        said += f"; {rules.non_torch_said}"
    if step_said:
        said += f"; {step_said}"
    if copied:
        said += (
            f"; --cpu-offload-gb: V0 copies an offloaded layer back for its forward pass "
            f"({copied / GIB:.2f} GiB at the peak)"
        )
    if shape.compute is not None and shape.compute.vision_tower:
        said += tower_said(shape, profile, mm, activation - copied)
    if shape.compute is not None and shape.compute.vision and grammar.has(args, SKIP_MM_PROFILING):
        said += (
            "; --skip-mm-profiling: no encoder in the profile run, so what the encoder takes "
            "while serving is outside vLLM's budget"
        )
    if graphs_out:
        said += "; CUDA graphs outside the budget"
    if graphs_in:
        said += (
            f"; CUDA graphs estimated inside the budget ({graphs_in / GIB:.2f} GiB; vLLM "
            f"measures its own from the two largest captures of each graph mode)"
        )
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
