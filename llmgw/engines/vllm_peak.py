"""vLLM's profile run: the batch it profiles with (`--max-num-batched-tokens` and
`--max-num-seqs`, their defaults by card), the multimodal inputs its limits let the dummy
requests carry, and the torch peak the run reaches: the forward pass, the dummy sampler, a
multimodal model's kept encoder outputs, V0's cross-attention vision tower, InternVL's tower
(vllm_tower) (gpu_model_runner.py
`profile_run`, `_dummy_sampler_run`; V0's worker.py and enc_dec_model_runner.py)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from llmgw.cardclass import GIB, nvml_reports_memory
from llmgw.engines.base import CardTotals
from llmgw.engines.grammar import Grammar
from llmgw.engines.torch_overhead import (
    ACTIVATION_BYTES,
    ForwardCost,
    activation_width,
    is_moe,
    vocab_size,
)
from llmgw.engines.versions import pick
from llmgw.engines.vllm_rules import (
    COMPILED_PROFILE_PEAK_MARGIN,
    VLLM_RULES,
    VllmRules,
)
from llmgw.engines.vllm_tower import INTERNVIT_MARGIN, internvit_images, internvit_peak
from llmgw.frozen import made
from llmgw.shape import ModelShape

MAX_NUM_BATCHED_TOKENS = ("--max-num-batched-tokens",)


MAX_NUM_SEQS = ("--max-num-seqs",)


NO_CHUNKED_PREFILL = ("--no-enable-chunked-prefill",)


ENFORCE_EAGER = ("--enforce-eager",)
"""vLLM's switch to run the model eagerly: no torch.compile, no CUDA graphs."""

EXPERT_PARALLEL = ("--enable-expert-parallel", "-ep")
"""vLLM's switch to shard a MoE model's experts over the ranks instead of splitting each one
(vllm/engine/arg_utils.py `--enable-expert-parallel`, short form `-ep`)."""


CHUNKED_PREFILL = ("--enable-chunked-prefill",)


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
    "note quoting the log: oracle-samples/oci-data-science-ai-samples, "
    "ai-quick-actions/troubleshooting-tips.md)"
)
"""Why V0's sampler is left out of the peak when chunked prefill is on."""


V0_CHUNKED_ABOVE_TOKENS = 32768
"""vLLM V0 turned chunked prefill on by itself for contexts above 32K (gt-024's notes: at 35k
the peak fell as chunked prefill switched on)."""


SAMPLER_MARGIN = 0.35
"""How far the sampler's peak may stray from its line, either way. Under 0.10.2 alone, at
256 requests, the logs spread from 19 to 36 B a logit around the line's 28: granite-3.3-2b on
an L40S (vllm/vllm-openai:v0.10.2, 0.23 GiB over 256 × 49159 logits less the batch's hidden
states, 18.9 B: 32 % below; logged_runs.jsonl) and Qwen3-8B-FP8 on a 24 GB card (1.40 GiB over
256 × 151936, 36 B: 29 % above). A log of a later build (0.93 GiB of weights on a 15.55 GiB
card, 256 requests of a 152k vocabulary) peaked at 29 B where its line says 38. What the
sampler holds depends on its backend (FlashInfer's kernels or the PyTorch sort), which
neither the card nor the arguments tell."""


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


@dataclass(frozen=True)
class VllmProfile:
    """The numbers vLLM's start-up works with on one card."""

    rules: VllmRules
    rules_said: str
    batched_tokens: int
    max_num_seqs: int
    chunked_prefill: bool = True
    eager: bool = False
    warm: bool = False
    """A non-eager start on a warm torch.compile cache: no compile in the profile's window, and
    the model runs as its compiled graphs, not its Python forward."""


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
    eager: bool = False


def batch_flags(grammar: Grammar, args: Sequence[str], card: CardTotals) -> BatchFlags:
    """The batch settings `args` give on `card` (read once per setting). A card of unknown
    memory takes the large defaults (the larger peak, the safe side), a unified-memory class
    the small ones, which vLLM takes on it whatever it holds (`large_card`)."""
    known = card.cuda_bytes or card.nvml_bytes
    return BatchFlags(
        grammar.count(args, MAX_NUM_BATCHED_TOKENS),
        grammar.count(args, MAX_NUM_SEQS),
        grammar.has(args, NO_CHUNKED_PREFILL),
        grammar.has(args, CHUNKED_PREFILL),
        large_card(card) if known else nvml_reports_memory(card.name),
        grammar.has(args, ENFORCE_EAGER),
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
    return made(
        VllmProfile,
        rules=rules,
        rules_said=said,
        batched_tokens=batched,
        max_num_seqs=seqs,
        chunked_prefill=chunked,
        eager=flags.eager,
        warm=False,
    )


def vllm_profile(
    grammar: Grammar, args: Sequence[str], *, card: CardTotals, tokens: int, engine_version: str
) -> VllmProfile:
    """The version's rules and the batch vLLM profiles with for a context of `tokens`."""
    rules, said = pick(VLLM_RULES, engine_version)
    return profile_at(rules, said, batch_flags(grammar, args, card), tokens)


def runner_rules(rules: VllmRules, shape: ModelShape) -> VllmRules:
    """The figures `rules` size `shape` by: its Model Runner V1 figures (`v1_runner`) where the
    range runs Model Runner V2 for dense text models only and `shape` is not one (experts,
    recurrent layers or a vision input) or not of the range's `v2_families`, else `rules`
    itself."""
    if rules.v1_runner is None:
        return rules
    vision = shape.compute is not None and shape.compute.vision
    if is_moe(shape) or shape.has_recurrent or vision:
        return rules.v1_runner
    if rules.v2_families and shape.architecture.lower() not in rules.v2_families:
        return rules.v1_runner
    return rules


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
    return profile_peak(shape, forward, profile, profile.rules, tp, mm, flashinfer=True)[0]


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


def profile_peak(
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
    (CROSS_ATTENTION_IMAGE_TOKEN_BYTES); an InternVL model's InternViT over the dummy images
    the version encodes at once when that is larger (vllm_tower); `mm` what the multimodal
    limits allow (MmInputs)."""
    tokens = shape.compute.cross_attention_image_tokens if shape.compute and mm.images else 0
    if rules.v0 and tokens:
        tower = profile.max_num_seqs * mm.images * tokens * CROSS_ATTENTION_IMAGE_TOKEN_BYTES
        peak, margin = _text_activation(shape, forward, profile, rules, tp, flashinfer, mm.encoder)
        if tower > peak:
            return tower, int(tower * CROSS_ATTENTION_MARGIN)
        return peak, margin
    peak, margin = _text_activation(shape, forward, profile, rules, tp, flashinfer, mm.encoder)
    if shape.compute is None or not shape.compute.vision_tower:
        return peak, margin
    count = internvit_images(shape, rules, mm.images, profile.batched_tokens, profile.max_num_seqs)
    tower = internvit_peak(shape, count)
    if tower > peak:
        return tower, int(tower * INTERNVIT_MARGIN)
    return peak, margin


GATE_UP_KEPT_FAMILIES = ("qwen2", "qwen2_vl", "qwen2_5_vl", "qwen2vl", "qwen3")
"""The families (a config's `model_type`, a GGUF's architecture) whose dense MLP in vLLM binds
its gate/up projection to a name of its own, so it stays alive through the down projection:
Qwen2MLP.forward (vllm/model_executor/models/qwen2.py) is `gate_up, _ = self.gate_up_proj(x);
x = self.act_fn(gate_up); x, _ = self.down_proj(x)` in the code index's V0 copy (0.6.x: its
forward still takes kv_caches) and at a 2026 commit (8c94938, as a walkthrough of vLLM's
tensor parallel layers quotes it); Qwen3's dense layers import it (qwen3.py `from .qwen2 import
Qwen2MLP as Qwen3MLP`), and Qwen2-VL and Qwen2.5-VL run Qwen2's language model. Llama's MLP
rebinds `x` instead (vLLM PR #10339, "Reduce peak memory usage of llama", merged 2024-11-15:
"Maintaining multiple names here will cause both to be refcounted which increases the peak
memory"), so its gate/up output is freed once the activation has read it, and Llama's
MLP-derived models (Mistral, Phi-3) share that forward."""


def kept_gate_up_bytes(shape: ModelShape, profile: VllmProfile, rules: VllmRules) -> int:
    """What a GATE_UP_KEPT_FAMILIES model's forward peak holds beyond torch_overhead's sum where
    the profile run executes its Python forward eagerly (V0, which does not compile the
    model; V1 under `--enforce-eager`): with the 2 x I/tp gate/up output still alive, the MLP
    peaks at the down projection, whose output (the hidden width a token, whatever tp: a
    row-parallel layer's partial sums are full width) adds to what the activation step held.
    A compiled model's liveness is Inductor's, not the Python names', so 0 there, and 0 for a
    mixture of experts (its experts run in fused_moe) or a hybrid model. Logged V0/eager peaks
    of Qwen2.5 models held one bf16 hidden copy a token above the sum: per token and hidden
    unit, 2.4 B for the 0.5B, 2.1 for the 1.5B and 2.2 for the 7B (logged_runs.jsonl);
    Llama-3.1-8B after PR #10339 none (gt-023/024)."""
    if not (rules.v0 or profile.eager) or profile.warm:
        return 0
    if is_moe(shape) or shape.has_recurrent:
        return 0
    if shape.architecture.lower() not in GATE_UP_KEPT_FAMILIES:
        return 0
    return profile.batched_tokens * activation_width(shape) * ACTIVATION_BYTES


def _text_activation(
    shape: ModelShape,
    forward: ForwardCost,
    profile: VllmProfile,
    rules: VllmRules,
    tp: int,
    flashinfer: bool = False,
    encoder: bool = True,
) -> tuple[int, int]:
    """`profile_peak` for the forward pass and the sampler (`flashinfer`: FlashInfer's sampler,
    FLASHINFER_SAMPLER_BYTES_PER_LOGIT, where the range takes it when installed; `encoder`:
    a multimodal model's encoder outputs are kept), or what a non-eager profile run's compile
    on a cold cache leaves in its peak, where the range has a figure for it and it is larger
    (COMPILED_PROFILE_PEAK_BYTES)."""
    batched = profile.batched_tokens
    forward_bytes = forward.bytes(batched) + kept_gate_up_bytes(shape, profile, rules)
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
    compiled = 0 if profile.eager or profile.warm else rules.compiled_peak_bytes
    if compiled > forward_bytes and compiled > sampler_bytes:
        return compiled + retained, int(compiled * COMPILED_PROFILE_PEAK_MARGIN)
    if forward_bytes >= sampler_bytes:
        return forward_bytes + retained, int(forward_bytes * forward.margin)
    return sampler_bytes + retained, int(sampler_bytes * SAMPLER_MARGIN)


def tower_said(shape: ModelShape, profile: VllmProfile, mm: MmInputs, peak: int) -> str:
    """What `rules` add when an InternViT tower's pass is the profile's peak `peak` ("" when
    the language model's is): how many dummy images of how many tiles it encoded, under the
    multimodal limits `mm` the peak was worked out with."""
    count = internvit_images(
        shape, profile.rules, mm.images, profile.batched_tokens, profile.max_num_seqs
    )
    tower = internvit_peak(shape, count)
    if not tower or tower != peak or shape.compute is None:
        return ""
    tiles = shape.compute.vision_item_tiles
    return (
        f"; the peak is the vision tower's over {count} dummy image(s) of {tiles} tiles "
        f"({tower / GIB:.2f} GiB)"
    )
