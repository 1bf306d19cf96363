"""The memory rules replayed against what vLLM, SGLang and TensorRT-LLM printed
(tests/fixtures/ground_truth, see its PROVENANCE.md)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from llmgw.cardclass import KNOWN_CARD_MIB
from llmgw.engines.base import CardNeed, CardTotals, SizingRequest, Verdict
from llmgw.engines.heads import splits_heads, valid_tp_counts
from llmgw.engines.sglang import sglang_available_kv_bytes, sglang_token_capacity
from llmgw.engines.trtllm import trtllm_token_capacity
from llmgw.engines.vllm import vllm_token_capacity
from llmgw.shape import Compute, Layer, LayerKind, ModelShape
from planner_svc.domain.hf_shape import shape_from_hf_config
from planner_svc.domain.memory import card_need, kv_bytes_per_token_per_card, kv_cache_bytes

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "ground_truth" / "observations.jsonl"
HF_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
GIB = 1 << 30
TOLERANCE = 0.01
"""Printed GiB figures have two decimals; 1 % covers that and the engines' page rounding."""

Row = Mapping[str, Any]
LLAMA = "meta-llama__Llama-3.1-8B-Instruct"


def _load() -> dict[str, Row]:
    """The fixture's rows by id."""
    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]
    return {row["id"]: row for row in rows}


ROWS = _load()


def shape_from_arch(arch: Mapping[str, Any], *, draft_layers: int = 0) -> ModelShape:
    """A shape from a row's `arch` numbers: full layers, sliding layers alternating with them
    (gpt-oss), or MLA layers of one latent; `draft_layers` more full layers for a
    speculative-decoding draft whose cache vLLM allocates beside the target's."""
    kv = int(arch.get("kv_heads", 1))
    head_dim = int(arch.get("head_dim", 0))
    full = Layer(LayerKind.FULL, kv_heads=kv, head_dim_k=head_dim, head_dim_v=head_dim)
    if arch.get("mla"):
        latent = int(arch["kv_lora_rank"]) + int(arch["qk_rope_head_dim"])
        layers = [Layer(LayerKind.MLA, kv_heads=1, head_dim_k=latent)] * int(arch["layers"])
    elif "swa_layers" in arch:
        sliding = Layer(
            LayerKind.SLIDING,
            kv_heads=kv,
            head_dim_k=head_dim,
            head_dim_v=head_dim,
            window_tokens=int(arch["sliding_window"]),
        )
        layers = [sliding, full] * int(arch["swa_layers"])
    else:
        layers = [full] * int(arch["layers"])
    layers += [full] * draft_layers
    heads = int(arch.get("attention_heads", arch.get("n_heads", kv)))
    return ModelShape(
        architecture=str(arch.get("src", "ground truth")),
        layers=tuple(layers),
        attention_heads=heads,
        kv_heads=kv,
        trained_context=int(arch.get("max_pos", 0)),
    )


def within(got: int, printed: float) -> bool:
    """Whether `got` is within TOLERANCE of a printed figure."""
    return abs(got - printed) <= TOLERANCE * abs(printed)


# --- vLLM -------------------------------------------------------------------------------

# (row, draft layers, args): capacity from the printed available KV memory (V0: kv_cache_size)
VLLM_CAPACITY: list[tuple[str, int, list[str]]] = [
    ("gt-023", 0, []),
    ("gt-024", 0, []),
    ("gt-036", 0, []),
    ("gt-037", 1, []),  # the EAGLE draft's layer counts (33 layers, as the row derives)
    ("gt-038", 0, []),
    ("gt-039", 0, []),
    ("gt-040", 0, []),
]


def vllm_printed_tokens(row: Row) -> int:
    """The capacity a vLLM row printed: "GPU KV cache size", else V0's GPU blocks × 16."""
    printed = row["printed"]
    if "gpu_kv_cache_tokens" in printed:
        return int(printed["gpu_kv_cache_tokens"])
    return int(printed["gpu_blocks"]) * 16


def vllm_available(row: Row) -> int:
    """The KV memory a vLLM row printed, in bytes."""
    printed = row["printed"]
    gib = printed.get("available_kv_gib", printed.get("kv_cache_size_gib"))
    return int(float(gib) * GIB)


@pytest.mark.parametrize(("row_id", "draft", "args"), VLLM_CAPACITY)
def test_vllm_capacity_from_available_memory(row_id: str, draft: int, args: list[str]) -> None:
    """vLLM's token capacity is the printed KV memory over its page bytes, in 16-token blocks."""
    row = ROWS[row_id]
    shape = shape_from_arch(row["arch"], draft_layers=draft)
    got = vllm_token_capacity(
        shape, available_kv_bytes=vllm_available(row), tp=row["tp"], args=args
    )
    assert got % 16 == 0
    assert within(got, vllm_printed_tokens(row)), (got, vllm_printed_tokens(row))


def test_vllm_refuses_a_context_past_its_capacity() -> None:
    """gt-024: 2.89 GiB holds about 23,648 tokens, fewer than max_model_len 29000: refused."""
    row = ROWS["gt-024"]
    shape = shape_from_arch(row["arch"])
    got = vllm_token_capacity(shape, available_kv_bytes=vllm_available(row), tp=1, args=[])
    assert within(got, row["printed"]["error_kv_tokens"])
    assert got < row["flags"]["max_model_len"]


def test_vllm_negative_available_memory_holds_nothing() -> None:
    """gt-029: weights past the budget leave -2.14 GiB, which holds no token."""
    row = ROWS["gt-029"]
    shape = shape_from_arch(row["arch"])
    assert vllm_available(row) < 0
    assert vllm_token_capacity(shape, available_kv_bytes=vllm_available(row), tp=1, args=[]) == 0


def test_vllm_gpt_oss_one_long_request_does_not_fit() -> None:
    """gt-030: 1.71 GiB cannot hold one 131072-token request of gpt-oss-120b (18 full layers
    of 2 KiB a token, the sliding ones capped), so the engine failed to start."""
    row = ROWS["gt-030"]
    shape = shape_from_arch(row["arch"])
    args = ["--max-num-batched-tokens", str(row["flags"]["max_num_batched_tokens"])]
    need = kv_cache_bytes("vllm", shape, tokens=131_072, sequences=1, tp=1, args=args)
    assert need == 18 * 131_072 * 2048 + 18 * (72 + 1) * 16 * 2048
    assert need > vllm_available(row)


def hf_shape(name: str) -> ModelShape:
    """The shape of tests/fixtures/hf/<name>.json."""
    path = FIXTURE.parents[1] / "hf" / f"{name}.json"
    return shape_from_hf_config(json.loads(path.read_text()))


def granite_micro() -> ModelShape:
    """ibm-granite/granite-4.0-micro as gt-036's arch gives it (40 dense layers of 8 KV heads
    of 64, 40 heads), with its config's widths (hidden 2560, MLP 8192, vocabulary 100352)."""
    full = Layer(LayerKind.FULL, kv_heads=8, head_dim_k=64, head_dim_v=64)
    return ModelShape(
        "granitemoehybrid",
        (full,) * 40,
        attention_heads=40,
        kv_heads=8,
        compute=Compute(hidden_size=2560, intermediate_size=8192, vocab_size=100352),
    )


def llava_mistral() -> ModelShape:
    """llava-hf/llava-v1.6-mistral-7b-hf's language model: Mistral-7B's geometry, its 32064
    vocabulary, and a vision encoder."""
    shape = hf_shape("mistralai__Mistral-7B-Instruct-v0.3")
    assert shape.compute is not None
    return replace(shape, compute=replace(shape.compute, vocab_size=32064, vision=True))


# (case, shape, args, the version's rules to apply, card class, CUDA total GiB, weights a card
# GiB as loaded, tp, the printed "Available KV cache memory" GiB)
VLLM_AVAILABLE: list[
    tuple[str, Callable[[], ModelShape], list[str], str, str, float, float, int, float]
] = [
    # V0 without chunked prefill (max_model_len <= 32K) profiled max_model_len tokens
    (
        "gt-023",
        lambda: hf_shape(LLAMA),
        ["--max-model-len", "20000"],
        "V0",
        "RTX3090-24GB",
        23.58,
        14.9888,
        1,
        3.81,
    ),
    (
        "gt-024",
        lambda: hf_shape(LLAMA),
        ["--max-model-len", "29000"],
        "V0",
        "RTX3090-24GB",
        23.58,
        14.9888,
        1,
        2.89,
    ),
    # version not printed; its 1.04 GiB peak over 256 × 152064 logits is the pre-0.11 sampler's
    (
        "gt-038",
        lambda: hf_shape("Qwen__Qwen2.5-7B-Instruct"),
        ["--max-model-len", "32768"],
        "0.10",
        "16GB",
        15.99,
        5.29,
        1,
        8.0,
    ),
    # "V1 (Sep 2025)": v0.10.2 was that month's release; expert parallel over 4 L40S
    (
        "gt-039",
        lambda: hf_shape("Qwen__Qwen3-235B-A22B"),
        ["--max-model-len", "32768", "-tp", "4", "--enable-expert-parallel"],
        "0.10.2",
        "L40S-48GB",
        44.42,
        27.72,
        4,
        10.65,
    ),
    (
        "gt-036",
        granite_micro,
        ["--max-model-len", "131072"],
        "0.11.0",
        "L40S-48GB",
        44.42,
        3.4244,
        1,
        35.34,
    ),
    # vLLM 0.10.2, llava-v1.6-mistral-7b on an H100 80GB (LLM class: 16384 batched tokens),
    # "Free memory on device (78.66/79.19 GiB)", "Available KV cache memory: 55.15 GiB"
    (
        "log-0.10.2-h100-llava",
        llava_mistral,
        ["--max-model-len", "4096", "--max-num-batched-tokens", "16384"],
        "0.10.2",
        "H100-80GB",
        79.19,
        14.0786,
        1,
        55.15,
    ),
    # vLLM 0.10.2 serving Qwen3-Next-80B-A3B at tp 2 on H200s (8192 tokens, 1024 requests):
    # "Free memory on device (139.21/139.81 GiB)", 74.28 GiB of weights a card, "Available KV
    # cache memory: 44.59 GiB" (peak 5.58, non-torch 1.38)
    (
        "log-0.10.2-h200-qwen3-next",
        lambda: hf_shape("Qwen__Qwen3-Next-80B-A3B-Thinking"),
        ["--max-model-len", "262144", "-tp", "2"],
        "0.10.2",
        "H200-141GB",
        139.81,
        74.2812,
        2,
        44.59,
    ),
    # vLLM v0.31.0 serving Llama-3.1-8B on an A100 80GB with its defaults: "Available KV cache
    # memory: 56.21 GiB" (0.92 of 79.25 GiB less 15.26 consumed and 1.44 of peak)
    (
        "log-0.31.0-a100-llama",
        lambda: hf_shape(LLAMA),
        ["--max-model-len", "131072"],
        "0.31.0",
        "A100-80GB",
        79.25,
        14.99,
        1,
        56.21,
    ),
]
"""Rows whose inputs are all printed (weights as loaded, the card's CUDA total) and two logs
of the vLLM versions the rules are keyed by (quoted in llmgw/engines/vllm_memory.py)."""


def vllm_need_as_printed(
    shape_of: Callable[[], ModelShape],
    args: list[str],
    version: str,
    gpu: str,
    total_gib: float,
    weights_gib: float,
    tp: int,
) -> tuple[ModelShape, CardNeed]:
    """The shape with the weights vLLM printed, and the planner's need on each of `tp` cards
    whose CUDA total is the printed one (`args[1]` is the context asked)."""
    total = int(total_gib * GIB)
    shape = replace(shape_of(), weights_bytes=int(weights_gib * GIB) * tp)
    need = card_need(
        "vllm",
        shape,
        SizingRequest(
            args=tuple(args),
            tokens=int(args[1]),
            slots=1,
            cards=tp,
            card_memory_bytes=total,
            card=CardTotals(gpu, total, total, "printed"),
            engine_version=version,
        ),
    )
    return shape, need


@pytest.mark.parametrize(
    ("case", "shape_of", "args", "version", "gpu", "total_gib", "weights_gib", "tp", "printed"),
    VLLM_AVAILABLE,
)
def test_vllm_available_kv_memory_as_printed(
    case: str,
    shape_of: Callable[[], ModelShape],
    args: list[str],
    version: str,
    gpu: str,
    total_gib: float,
    weights_gib: float,
    tp: int,
    printed: float,
) -> None:
    """The KV pool vLLM sizes at start on each card: utilisation × CUDA's total − weights − its
    profile run's peak − non-torch memory, by the version's rules, within 1 %."""
    shape, need = vllm_need_as_printed(shape_of, args, version, gpu, total_gib, weights_gib, tp)
    assert within(need.kv_pool_bytes, printed * GIB), (case, need.kv_pool_bytes / GIB, printed)
    if case in ROWS:
        assert (
            vllm_token_capacity(shape, available_kv_bytes=need.kv_pool_bytes, tp=tp, args=args)
            == need.kv_token_capacity
        )


def test_vllm_refuses_where_the_pool_cannot_hold_the_context() -> None:
    """gt-024: at 29000 tokens vLLM V0 had 2.89 GiB, 23,648 tokens: it refused to start; the
    planner says "does not fit" and gives the pool's capacity as vLLM printed it."""
    total = int(23.58 * GIB)
    shape = replace(hf_shape(LLAMA), weights_bytes=int(14.9888 * GIB))
    need = card_need(
        "vllm",
        shape,
        SizingRequest(
            args=("--max-model-len", "29000"),
            tokens=29000,
            slots=1,
            cards=1,
            card_memory_bytes=total,
            card=CardTotals("RTX3090-24GB", total, total, "printed"),
            engine_version="V0",
        ),
    )
    assert not need.fits and need.verdict is Verdict.DOES_NOT_FIT
    assert within(need.kv_token_capacity, ROWS["gt-024"]["printed"]["error_kv_tokens"])


# (row, shape, args, version, card class, CUDA total GiB, weights a card GiB, tp, started)
VLLM_OUTCOMES: list[
    tuple[str, Callable[[], ModelShape], list[str], str, str, float, float, int, bool]
] = [
    # "Available KV cache memory: -2.14 GiB": the weights alone pass the 0.9 budget
    (
        "gt-029",
        lambda: hf_shape("openai__gpt-oss-120b"),
        ["--max-model-len", "131072"],
        "0.10.1",
        "H100-80GB",
        79.19,
        65.9651,
        1,
        False,
    ),
    # 1.71 GiB cannot hold one 131072-token request: "EngineCore failed to start"
    (
        "gt-030",
        lambda: hf_shape("openai__gpt-oss-120b"),
        [
            "--max-model-len",
            "131072",
            "--gpu-memory-utilization",
            "0.95",
            "--max-num-batched-tokens",
            "1024",
        ],
        "0.11.0",
        "H100-80GB",
        79.19,
        65.9651,
        1,
        False,
    ),
    (
        "gt-024",
        lambda: hf_shape(LLAMA),
        ["--max-model-len", "29000"],
        "V0",
        "RTX3090-24GB",
        23.58,
        14.9888,
        1,
        False,
    ),
    (
        "gt-023",
        lambda: hf_shape(LLAMA),
        ["--max-model-len", "20000"],
        "V0",
        "RTX3090-24GB",
        23.58,
        14.9888,
        1,
        True,
    ),
    (
        "gt-036",
        granite_micro,
        ["--max-model-len", "131072"],
        "0.11.0",
        "L40S-48GB",
        44.42,
        3.4244,
        1,
        True,
    ),
    (
        "gt-038",
        lambda: hf_shape("Qwen__Qwen2.5-7B-Instruct"),
        ["--max-model-len", "32768"],
        "0.10",
        "16GB",
        15.99,
        5.29,
        1,
        True,
    ),
    (
        "gt-039",
        lambda: hf_shape("Qwen__Qwen3-235B-A22B"),
        ["--max-model-len", "32768", "-tp", "4", "--enable-expert-parallel"],
        "0.10.2",
        "L40S-48GB",
        44.42,
        27.72,
        4,
        True,
    ),
]
"""Rows whose engine started or refused to, with every input printed."""


@pytest.mark.parametrize(
    ("case", "shape_of", "args", "version", "gpu", "total_gib", "weights_gib", "tp", "started"),
    VLLM_OUTCOMES,
)
def test_vllm_verdict_is_what_the_engine_did(
    case: str,
    shape_of: Callable[[], ModelShape],
    args: list[str],
    version: str,
    gpu: str,
    total_gib: float,
    weights_gib: float,
    tp: int,
    started: bool,
) -> None:
    """Where vLLM started the planner says it fits (perhaps only within the margin); where it
    refused or failed at start, "does not fit"."""
    _, need = vllm_need_as_printed(shape_of, args, version, gpu, total_gib, weights_gib, tp)
    assert need.fits is started, (case, need.verdict)
    assert (need.verdict is Verdict.DOES_NOT_FIT) is not started


# --- tensor parallel refusals -----------------------------------------------------------


@pytest.mark.parametrize("row_id", ["gt-046", "gt-048"])
def test_vllm_tensor_parallel_refusals(row_id: str) -> None:
    """vLLM refused tp sizes that do not divide the attention heads; so does the planner,
    and the counts it offers instead are ones vLLM accepts."""
    row = ROWS[row_id]
    heads = int(row["printed"]["num_attention_heads"])
    kv = int(row["arch"]["kv_heads"])
    tp = int(row["printed"]["tensor_parallel_size"])
    assert not splits_heads(tp, heads, kv)
    offered = valid_tp_counts(heads, kv)
    assert tp not in offered
    assert all(heads % n == 0 for n in offered)


def test_gt048_counts_are_held_to_the_kv_heads() -> None:
    """gt-048's derivation: 28 heads split 1, 2, 4, 7, 14, 28 ways; 4 KV heads leave 1, 2, 4."""
    assert valid_tp_counts(28, 4, max_count=28) == (1, 2, 4, 28)


# --- SGLang -----------------------------------------------------------------------------


def test_sglang_capacity_from_its_memory_lines() -> None:
    """gt-049: rest = 6.09 − 21.63 × (1 − 0.85) GiB over a 65536 B cell ≈ 46,611 tokens, and
    K is half of those tokens' cells (1.42 GiB)."""
    row = ROWS["gt-049"]
    printed = row["printed"]
    shape = shape_from_arch(row["arch"])
    available = sglang_available_kv_bytes(
        int(printed["load_weight_begin_avail_gb"] * GIB),
        int(printed["after_weights_avail_gb"] * GIB),
        float(row["flags"]["mem_fraction_static"]),
    )
    assert kv_bytes_per_token_per_card("sglang", shape, row["tp"], []) == 65_536
    got = sglang_token_capacity(shape, available_kv_bytes=available, tp=row["tp"], args=[])
    assert within(got, printed["max_total_num_tokens"]), got
    k_bytes = printed["max_total_num_tokens"] * 65_536 // 2
    assert within(k_bytes, printed["k_size_gb"] * GIB)


def test_sglang_04_at_tp4_on_l4s_sizes_its_pool_as_logged() -> None:
    """gt-049 replayed whole: SGLang 0.4.3.post4 picks mem_fraction_static 0.85 at tp 4 by
    itself (server_args.py as of 0.4: by tp size), on an L4's CUDA total less what is in use
    before loading; 15.54 GiB of weights a card leave 46,611 tokens, within 1 %."""
    row = ROWS["gt-049"]
    printed = row["printed"]
    shape = replace(
        shape_from_arch(row["arch"]), weights_bytes=int(printed["weights_mem_usage_gb"] * GIB) * 4
    )
    args = ["--context-length", "131072", "--tp", "4"]
    need = card_need(
        "sglang",
        shape,
        SizingRequest(
            args=tuple(args),
            tokens=131072,
            slots=1,
            cards=4,
            card_memory_bytes=0,
            card=CardTotals.of("L4-24GB", KNOWN_CARD_MIB["l4-24gb"] << 20),
            engine_version=row["engine_version"],
        ),
    )
    assert "0.85 (by tp (SGLang 0.4))" in need.rules
    assert within(need.kv_token_capacity, printed["max_total_num_tokens"]), need.kv_token_capacity
    newer = card_need(
        "sglang",
        shape,
        SizingRequest(
            args=tuple(args),
            tokens=131072,
            slots=1,
            cards=4,
            card_memory_bytes=0,
            card=CardTotals.of("L4-24GB", KNOWN_CARD_MIB["l4-24gb"] << 20),
            engine_version="0.5.4",
        ),
    )
    assert newer.kv_token_capacity < need.kv_token_capacity


def test_sglang_cache_bytes_for_its_token_count() -> None:
    """gt-027: 367,404 tokens at TP4 take 8.23 GiB of K and 8.23 of V on each card."""
    row = ROWS["gt-027"]
    printed = row["printed"]
    shape = shape_from_arch(row["arch"])
    tokens = int(printed["max_total_num_tokens"])
    per_card = kv_cache_bytes("sglang", shape, tokens=tokens, sequences=1, tp=row["tp"], args=[])
    per_card //= row["tp"]
    assert within(per_card, (printed["k_size_gb"] + printed["v_size_gb"]) * GIB)


def test_sglang_deepseek_v32_cell_and_pool_as_logged() -> None:
    """gt-051 (SGLang with PR #11309, 8 B200s, fp8 cache, NSA page 64): each of the 61 layers
    keeps a 656 B packed latent and a 132 B indexer key a token, 48,068 B in all; the printed
    43.67 GB is 975,424 tokens plus the pool's one padding page, and that memory holds the
    printed token count within 1 %. The run's fp8 cache was SGLang's own choice on B200; the
    planner needs `--kv-cache-dtype fp8_e4m3` spelled out (its auto is the model's dtype)."""
    row = ROWS["gt-051"]
    printed = row["printed"]
    config = json.loads((HF_FIXTURES / "deepseek-ai__DeepSeek-V3.2.json").read_text())
    shape = shape_from_hf_config(config)
    args = ["--kv-cache-dtype", "fp8_e4m3", "--page-size", "64"]
    cell = kv_bytes_per_token_per_card("sglang", shape, row["tp"], args)
    assert cell == row["arch"]["layers"] * (656 + 132)
    tokens = int(printed["max_total_num_tokens"])
    assert round((tokens + 64) * cell / GIB, 2) == printed["kv_size_gb"]
    got = sglang_token_capacity(
        shape, available_kv_bytes=int(printed["kv_size_gb"] * GIB), tp=row["tp"], args=args
    )
    assert got % 64 == 0
    assert within(got, tokens)


# --- TensorRT-LLM -----------------------------------------------------------------------


def test_trtllm_kv_size_and_tokens() -> None:
    """gt-052: "kv size is 73728" exactly (no sliding discount), and 5.95 GiB hold about
    86,720 tokens in 32-token blocks."""
    row = ROWS["gt-052"]
    printed = row["printed"]
    shape = shape_from_arch(row["arch"])
    assert kv_bytes_per_token_per_card("trtllm", shape, 1, []) == printed["kv_bytes_per_token"]
    available = int(printed["available_kv_gib"] * GIB)
    got = trtllm_token_capacity(shape, available_kv_bytes=available, tp=1, args=[])
    assert got % 32 == 0
    assert within(got, printed["max_tokens_in_paged_kv"])
    allocated = printed["max_tokens_in_paged_kv"] * printed["kv_bytes_per_token"]
    assert round(allocated / GIB, 2) == printed["allocated_kv_gib"]


# --- what is not replayed, and why ------------------------------------------------------

NOT_REPLAYED: dict[str, str] = {
    "gt-026": "the 8.11 GiB is one worker's line; the capacity is the minimum over the 4 "
    "workers, 1.1 % below 8.11 GiB / 48128 B, past the 1 % bound",
    "gt-028": "the 8.69 GiB is one worker's; the 81,536-token capacity (7.46 GiB a rank) is the "
    "minimum over workers, 14 % apart",
    "gt-031": "prints only the weights as loaded (64.38 GiB, MXFP4 repacked), no figure the "
    "planner computes",
    "gt-035": "no available-memory figure; vLLM 0.5.4 expanded MLA into per-head K/V, which "
    "current vLLM does not",
    "gt-041": "model unknown: its 48 KiB a token is inferred from these same figures, so a "
    "replay would be circular",
    "gt-042": "model unknown (as gt-041); the needed 10.12 GiB is the same circular 48 KiB",
    "gt-044": "no memory line and the GPU is unknown; vLLM 0.8 counted sliding layers at full "
    "width",
    "gt-045": "weights a GPU of an FP8 checkpoint whose size the fixtures do not have; nothing "
    "about the cache",
    "gt-050": "SGLang before PR #11309 left the indexer's 132 B a layer-token out of its cell "
    "size while still allocating it (54.52 GB printed, 65.49 held, per the PR): the planner "
    "sizes the cell as PR #11309 and later count it (gt-051, replayed)",
    "gt-053": "no memory figure: the TensorRT engine's activations and free memory are not printed",
    "gt-056": "a hybrid GDN model without arch numbers; its token figure is not a capacity "
    "(blocks // groups × block size)",
}
"""Rows the planner cannot reproduce, each with the reason."""

LLAMACPP_ROWS: dict[str, str] = {
    row_id: "replayed in test_ground_truth_llamacpp.py"
    for row_id in (
        "gt-001",
        "gt-002",
        "gt-003",
        "gt-008",
        "gt-010",
        "gt-011",
        "gt-012",
        "gt-013",
        "gt-016",
        "gt-017",
        "gt-020",
        "gt-021",
    )
}
"""llama.cpp's rows belong to llamacpp.py's replay."""

REPLAYED: set[str] = (
    {row_id for row_id, _, _ in VLLM_CAPACITY}
    | {case for case, *_ in VLLM_AVAILABLE if case in ROWS}
    | {"gt-024", "gt-029", "gt-030", "gt-046", "gt-048", "gt-049", "gt-027", "gt-052", "gt-051"}
)


def test_every_row_is_replayed_or_listed_with_a_reason() -> None:
    """No row is silently skipped: each is replayed here, listed as not reproducible, or
    left to the llama.cpp replay, and only one of these."""
    groups = (REPLAYED, set(NOT_REPLAYED), set(LLAMACPP_ROWS))
    assert set().union(*groups) == set(ROWS)
    assert sum(len(g) for g in groups) == len(ROWS)
    assert all(reason for reason in NOT_REPLAYED.values())


def test_llamacpp_rows_are_exactly_the_llamacpp_engine_rows() -> None:
    """The rows left to the llama.cpp replay are the fixture's llama.cpp rows, all of them."""
    assert set(LLAMACPP_ROWS) == {i for i, r in ROWS.items() if r["engine"] == "llama.cpp"}
    assert {r["engine"] for i, r in ROWS.items() if i in REPLAYED | set(NOT_REPLAYED)} == {
        "vLLM",
        "SGLang",
        "TensorRT-LLM",
    }
