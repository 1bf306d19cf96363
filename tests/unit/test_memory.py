"""Memory per engine over real model shapes: per-token bytes, tensor parallel, MLA, sliding
windows, cache dtypes, budgets, CPU RAM, and the arguments an engine would refuse."""

from __future__ import annotations

import json
from dataclasses import replace
from fractions import Fraction
from functools import cache
from pathlib import Path

import pytest

from llmgw.engines import registry
from llmgw.engines.base import CardTotals, SizingRequest
from llmgw.engines.llamacpp import LLAMACPP_RESERVE_BYTES, llamacpp_kv_bytes
from llmgw.engines.sglang import (
    SGLANG_NVLINK_PRELOAD_BYTES,
    SGLANG_PRELOAD_BYTES,
    sglang_mem_fraction_static,
    sglang_token_capacity,
)
from llmgw.engines.torch_overhead import CUDA_GRAPH_BYTES_PER_LAYER
from llmgw.engines.trtllm import trtllm_overhead_bytes
from llmgw.engines.vllm import vllm_token_capacity
from llmgw.shape import ModelShape
from planner_svc.domain import errors
from planner_svc.domain.fit import ram_gb
from planner_svc.domain.memory import (
    cache_dtype_bytes,
    card_need,
    kv_bytes_per_token_per_card,
    kv_cache_bytes,
    ram_need_bytes,
    tensor_parallel,
)

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
MIB = 1 << 20
GIB = 1 << 30
H100_BYTES = 81559 * MIB  # NVML memory.total of an H100 80GB
H100_CUDA_BYTES = 81090 * MIB  # what CUDA reports to torch: 79.19 GiB
L4_BYTES = 23034 * MIB  # NVML memory.total of an L4 (gt-049's cards)

# Weight bytes from shared/models/hf/INDEX.md (safetensors total_size or 2 × params).
WEIGHTS = {
    "meta-llama__Llama-3.1-8B-Instruct": 16_060_522_496,
    "Qwen__Qwen3-235B-A22B": 470_187_269_120,
    "deepseek-ai__DeepSeek-V3": 688_586_727_753,
    "openai__gpt-oss-120b": 65_248_815_744,
    "google__gemma-2-9b-it": 18_483_411_968,
}


@cache
def hf(name: str) -> ModelShape:
    """The shape of tests/fixtures/hf/<name>.json as the HF reader gives it, with its weights."""
    config = json.loads((HF / f"{name}.json").read_text())
    from planner_svc.domain.hf_shape import shape_from_hf_config

    return shape_from_hf_config(config, weights_bytes=WEIGHTS.get(name, 0))


LLAMA_8B = "meta-llama__Llama-3.1-8B-Instruct"
QWEN3_235B = "Qwen__Qwen3-235B-A22B"
DEEPSEEK_V3 = "deepseek-ai__DeepSeek-V3"
GPT_OSS_120B = "openai__gpt-oss-120b"
GEMMA2_9B = "google__gemma-2-9b-it"
QWEN3_NEXT = "Qwen__Qwen3-Next-80B-A3B-Thinking"
FALCON_MAMBA = "tiiuae__falcon-mamba-7b"


@pytest.mark.parametrize(
    ("name", "per_token"),
    [
        (LLAMA_8B, 32 * 8 * 128 * 2 * 2),
        ("meta-llama__Llama-3.1-70B-Instruct", 80 * 8 * 128 * 2 * 2),
        ("meta-llama__Llama-3.2-1B-Instruct", 16 * 8 * 64 * 2 * 2),
        ("Qwen__Qwen2.5-7B-Instruct", 28 * 4 * 128 * 2 * 2),  # no SWA: use_sliding_window false
        ("Qwen__Qwen2.5-72B-Instruct", 80 * 8 * 128 * 2 * 2),
        ("Qwen__Qwen3-8B", 36 * 8 * 128 * 2 * 2),
        ("Qwen__Qwen3-32B", 64 * 8 * 128 * 2 * 2),
        ("Qwen__Qwen3-30B-A3B", 48 * 4 * 128 * 2 * 2),
        (QWEN3_235B, 94 * 4 * 128 * 2 * 2),
        (QWEN3_NEXT, 12 * 2 * 256 * 2 * 2),  # only the 12 full-attention layers keep KV
        ("mistralai__Mistral-7B-Instruct-v0.3", 32 * 8 * 128 * 2 * 2),
        ("mistralai__Mixtral-8x7B-v0.1", 32 * 8 * 128 * 2 * 2),
        (GEMMA2_9B, 42 * 8 * 256 * 2 * 2),  # sliding layers at full width per token
        (DEEPSEEK_V3, 61 * (512 + 64) * 2),  # the MLA latent
        ("deepseek-ai__DeepSeek-V2-Lite", 27 * (512 + 64) * 2),
        ("openai__gpt-oss-20b", 24 * 8 * 64 * 2 * 2),
        (GPT_OSS_120B, 73_728),  # gt-052's "kv size is 73728"
        ("microsoft__Phi-3-mini-4k-instruct", 32 * 32 * 96 * 2 * 2),
        (FALCON_MAMBA, 0),  # recurrent: nothing per token
    ],
)
@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_bytes_per_token_on_one_card(engine: str, name: str, per_token: int) -> None:
    """One card's bytes a token is every KV layer's heads × (K + V) × 2 B, MLA its latent."""
    assert kv_bytes_per_token_per_card(engine, hf(name), 1, []) == per_token


@pytest.mark.parametrize(
    ("name", "tp", "per_token"),
    [
        (LLAMA_8B, 2, 32 * 4 * 256 * 2),
        (LLAMA_8B, 8, 32 * 1 * 256 * 2),
        (QWEN3_235B, 2, 94 * 2 * 256 * 2),
        (QWEN3_235B, 4, 94 * 1 * 256 * 2),  # gt-039's 48128 B
        (QWEN3_235B, 8, 94 * 1 * 256 * 2),  # 4 KV heads on 8 cards: each replicated twice
        (DEEPSEEK_V3, 8, 61 * 576 * 2),  # MLA: the latent whole on every card
        (GPT_OSS_120B, 8, 36 * 1 * 128 * 2),
    ],
)
def test_tensor_parallel_splits_heads_and_replicates_past_them(
    name: str, tp: int, per_token: int
) -> None:
    """Each card holds ceil(kv_heads / tp) heads, at least one, and the MLA latent whole."""
    assert kv_bytes_per_token_per_card("vllm", hf(name), tp, []) == per_token


@pytest.mark.parametrize(
    ("name", "tp"),
    [(LLAMA_8B, 1), (LLAMA_8B, 4), (QWEN3_235B, 8), (DEEPSEEK_V3, 8)],
)
def test_replica_cache_is_one_cards_times_tp(name: str, tp: int) -> None:
    """A replica's KV is its cards' together: per-card bytes × tp (MLA counted on each)."""
    shape = hf(name)
    per_token = kv_bytes_per_token_per_card("sglang", shape, tp, [])
    total = kv_cache_bytes("sglang", shape, tokens=10_000, sequences=1, tp=tp, args=[])
    assert total == 10_000 * per_token * tp


def test_mla_is_not_split_by_tensor_parallel() -> None:
    """DeepSeek-V3's cache on 8 cards is 8 copies of the latent, not an eighth of it."""
    shape = hf(DEEPSEEK_V3)
    one = kv_cache_bytes("vllm", shape, tokens=16_384, sequences=1, tp=1, args=[])
    eight = kv_cache_bytes("vllm", shape, tokens=16_384, sequences=1, tp=8, args=[])
    assert one == 16_384 * 70_272
    assert eight == 8 * one


# vLLM's sliding layer holds, per request, cdiv(min(window - 1 + batched tokens, context),
# 16) + 1 blocks (SlidingWindowSpec.max_memory_usage_bytes); a full layer cdiv(context, 16).
@pytest.mark.parametrize(
    ("engine", "args", "name", "tokens", "expected"),
    [
        (
            "vllm",
            ["--max-num-batched-tokens", "1024"],
            GPT_OSS_120B,
            131_072,
            18 * 8192 * 16 * 8 * 128 * 2 + 18 * (72 + 1) * 16 * 8 * 128 * 2,
        ),
        (
            "vllm",
            [],  # 8192 batched tokens when the card is not known
            GPT_OSS_120B,
            131_072,
            18 * 8192 * 16 * 2048 + 18 * (520 + 1) * 16 * 2048,
        ),
        (
            "vllm",
            ["--max-num-batched-tokens", "2048"],
            GEMMA2_9B,
            8192,
            21 * 8192 * 8 * 512 * 2 + 21 * (384 + 1) * 16 * 8 * 512 * 2,
        ),
        (
            "vllm",
            ["--max-num-batched-tokens", "2048"],
            GEMMA2_9B,
            1000,  # shorter than the window: one block more than a full layer's 63
            21 * 63 * 16 * 8192 + 21 * 64 * 16 * 8192,
        ),
        # SGLang's hybrid SWA pool: sliding layers hold 0.8 of the full layers' tokens.
        ("sglang", [], GEMMA2_9B, 8192, 21 * 8192 * 8192 + 21 * 6554 * 8192),
        ("sglang", ["--disable-hybrid-swa-memory"], GEMMA2_9B, 8192, 42 * 8192 * 8192),
        ("sglang", ["--swa-full-tokens-ratio", "0.5"], GEMMA2_9B, 8192, 21 * 12288 * 8192),
        # TensorRT-LLM: no sliding discount (gt-052), whole blocks of 32.
        ("trtllm", [], GPT_OSS_120B, 131_072, 131_072 * 73_728),
        ("trtllm", [], GPT_OSS_120B, 1000, 1024 * 73_728),
    ],
)
def test_sliding_layers_per_engine(
    engine: str, args: list[str], name: str, tokens: int, expected: int
) -> None:
    """Sliding layers cost what each engine's allocator gives them for one long request."""
    assert kv_cache_bytes(engine, hf(name), tokens=tokens, sequences=1, tp=1, args=args) == expected


@pytest.mark.parametrize(
    ("pool_tokens", "sequences", "kv"),
    [
        (8192, 1, 21 * 8192 * 8192 + 21 * 4096 * 8192),
        (2048, 1, 42 * 2048 * 8192),  # shorter than the window: all of it
        (16384, 4, 21 * 16384 * 8192 + 21 * 4 * 4096 * 8192),  # a window per sequence
    ],
)
def test_ram_caps_sliding_layers_at_the_window_per_sequence(
    pool_tokens: int, sequences: int, kv: int
) -> None:
    """CPU RAM counts a sliding layer at min(tokens, window) for each sequence."""
    shape = hf(GEMMA2_9B)
    w = shape.weights_bytes
    expected = w + kv + GIB + w // 20
    assert ram_need_bytes(shape, pool_tokens, sequences=sequences) == expected


@pytest.mark.parametrize(
    ("name", "pool_tokens", "sequences", "whole_gb"),
    [
        # 16,060,522,496 + 8192 × 131072 + 2^30 + 803,026,124 = 19,011,032,268 B -> 20 GB
        (LLAMA_8B, 8192, 1, 20),
        # + 122,880 × 131072 = 16,106,127,360 more: 35,117,159,628 B -> 36 GB
        (LLAMA_8B, 131_072, 1, 36),
    ],
)
def test_cpu_ram_is_weights_kv_one_gib_and_five_percent_in_whole_gb(
    name: str, pool_tokens: int, sequences: int, whole_gb: int
) -> None:
    """RAM is weights + KV + 1 GiB + weights / 20, and the catalog rounds it up to whole GB."""
    shape = hf(name)
    need = ram_need_bytes(shape, pool_tokens, sequences=sequences)
    w = shape.weights_bytes
    assert need == w + pool_tokens * 131_072 + GIB + w // 20
    assert ram_gb(need) == whole_gb


def test_ram_counts_recurrent_state_per_sequence() -> None:
    """A recurrent model's RAM grows with sequences, not with tokens."""
    shape = hf(FALCON_MAMBA)
    state = shape.state_bytes_per_sequence()
    assert state > 0
    one = ram_need_bytes(shape, 4096, sequences=1)
    assert ram_need_bytes(shape, 65_536, sequences=1) == one
    assert ram_need_bytes(shape, 4096, sequences=4) == one + 3 * state


@pytest.mark.parametrize(
    ("engine", "args", "element"),
    [
        ("vllm", [], Fraction(2)),
        ("vllm", ["--kv-cache-dtype", "auto"], Fraction(2)),
        ("vllm", ["--kv-cache-dtype=fp8"], Fraction(1)),
        ("vllm", ["--kv-cache-dtype", "fp8_e5m2"], Fraction(1)),
        ("vllm", ["--kv-cache-dtype", "bfloat16"], Fraction(2)),
        ("sglang", ["--kv-cache-dtype", "fp8_e4m3"], Fraction(1)),
        ("sglang", ["--kv-cache-dtype", "bf16"], Fraction(2)),
        ("sglang", ["--kv-cache-dtype", "fp4_e2m1"], Fraction(9, 16)),
        ("trtllm", [], Fraction(2)),
        ("tei", [], Fraction(2)),
    ],
)
def test_cache_dtype_bytes(engine: str, args: list[str], element: Fraction) -> None:
    """Each engine's cache-dtype flag maps to its element size; auto is the model's dtype."""
    assert cache_dtype_bytes(engine, args, hf(LLAMA_8B)) == element


@pytest.mark.parametrize(
    ("engine", "flag", "factor"),
    [
        ("vllm", "fp8", Fraction(1, 2)),
        ("vllm", "fp8_e4m3", Fraction(1, 2)),
        ("sglang", "fp8_e5m2", Fraction(1, 2)),
        ("sglang", "fp4_e2m1", Fraction(9, 32)),
    ],
)
@pytest.mark.parametrize("name", [LLAMA_8B, QWEN3_235B, DEEPSEEK_V3])
def test_quantized_cache_scales_the_kv(engine: str, flag: str, factor: Fraction, name: str) -> None:
    """An fp8 cache is half the bf16 one (fp4 9/32 with its scales), for GQA and MLA alike."""
    shape = hf(name)
    full = kv_cache_bytes(engine, shape, tokens=32_768, sequences=1, tp=1, args=[])
    small = kv_cache_bytes(
        engine, shape, tokens=32_768, sequences=1, tp=1, args=["--kv-cache-dtype", flag]
    )
    assert small == full * factor


@pytest.mark.parametrize(
    ("engine", "args"),
    [
        ("vllm", ["--kv-cache-dtype", "fp9"]),
        ("vllm", ["--kv-cache-dtype", "fp8_e4m3fn"]),
        ("vllm", ["--kv-cache-dtype", "fp8_ds_mla"]),  # valid in vLLM, not sized here
        ("sglang", ["--kv-cache-dtype", "fp8"]),  # vLLM's spelling, not SGLang's
        ("sglang", ["--kv-cache-dtype", ""]),
    ],
)
def test_unknown_cache_dtypes_are_refused(engine: str, args: list[str]) -> None:
    """A cache type the engine or the planner does not know is refused, naming the choices."""
    with pytest.raises(errors.EngineRefuses) as caught:
        kv_cache_bytes(engine, hf(LLAMA_8B), tokens=4096, sequences=1, tp=1, args=args)
    assert caught.value.engine == engine
    assert "use one of" in caught.value.message


@pytest.mark.parametrize(
    ("engine", "args"),
    [
        ("vllm", ["--gpu-memory-utilization", "1.5"]),
        ("vllm", ["--gpu-memory-utilization", "0"]),
        ("vllm", ["--gpu-memory-utilization", "most"]),
        ("vllm", ["-tp", "0"]),
        ("vllm", ["--tensor-parallel-size=two"]),
        ("vllm", ["--block-size", "-16"]),
        ("vllm", ["--max-num-batched-tokens", "lots"]),
        ("sglang", ["--mem-fraction-static", "-0.2"]),
        ("sglang", ["--tp", "0"]),
        ("trtllm", ["--kv_cache_free_gpu_memory_fraction", "2"]),
        ("trtllm", ["--max_num_tokens", "0"]),
    ],
)
def test_arguments_the_engine_refuses_are_refused(engine: str, args: list[str]) -> None:
    """Fractions outside (0, 1] and counts below one are refused as the engine would."""
    with pytest.raises(errors.EngineRefuses):
        card_need(
            engine,
            hf(LLAMA_8B),
            SizingRequest(
                args=tuple(args), tokens=8192, slots=1, cards=1, card_memory_bytes=H100_BYTES
            ),
        )


@pytest.mark.parametrize(
    ("engine", "tokens", "slots", "cards", "error"),
    [
        ("vlm", 4096, 1, 1, errors.UnknownEngine),
        ("vllm", -1, 1, 1, errors.InvalidRequest),
        ("vllm", 4096, -1, 1, errors.InvalidRequest),
        ("vllm", 4096, 1, -2, errors.InvalidRequest),
        ("tei", 0, 1, 2, errors.EngineSingleCard),
    ],
)
def test_bad_requests_are_refused(
    engine: str, tokens: int, slots: int, cards: int, error: type[Exception]
) -> None:
    """Unknown engines, negative numbers and a one-card engine on two cards are refused."""
    with pytest.raises(error):
        card_need(
            engine,
            hf(LLAMA_8B),
            SizingRequest(
                args=(),
                tokens=tokens,
                slots=slots,
                cards=cards,
                card_memory_bytes=H100_BYTES,
            ),
        )


@pytest.mark.parametrize(("tokens", "sequences", "tp"), [(-1, 1, 1), (1, 0, 1), (1, 1, 0)])
def test_bad_pools_are_refused(tokens: int, sequences: int, tp: int) -> None:
    """A negative pool, no sequences or no cards is not a cache to size."""
    with pytest.raises(errors.InvalidRequest):
        kv_cache_bytes("vllm", hf(LLAMA_8B), tokens=tokens, sequences=sequences, tp=tp, args=[])


@pytest.mark.parametrize(("pool_tokens", "sequences"), [(-1, 1), (4096, 0)])
def test_bad_ram_pools_are_refused(pool_tokens: int, sequences: int) -> None:
    """CPU RAM is not sized for a negative pool or for no sequences."""
    with pytest.raises(errors.InvalidRequest):
        ram_need_bytes(hf(LLAMA_8B), pool_tokens, sequences=sequences)


@pytest.mark.parametrize(
    ("engine", "args", "cards", "tp_pp"),
    [
        ("vllm", ["-tp", "4"], 4, (4, 1)),
        ("vllm", ["-tp", "4"], 8, (4, 2)),  # 8 cards at tp 4: two pipeline stages
        ("vllm", [], 8, (8, 1)),
        ("vllm", ["--pipeline-parallel-size", "2"], 8, (4, 2)),
        ("vllm", ["-tp", "2"], 0, (2, 1)),  # no card count: the arguments decide
        ("vllm", ["-tp", "2"], 3, (3, 1)),  # the cards decide over stale arguments
        ("sglang", ["--tp", "4"], 4, (4, 1)),
        ("sglang", ["--tensor-parallel-size=2"], 2, (2, 1)),
        ("trtllm", ["--tp_size", "2", "--pp_size", "2"], 4, (2, 2)),
    ],
)
def test_tensor_parallel_from_arguments_and_cards(
    engine: str, args: list[str], cards: int, tp_pp: tuple[int, int]
) -> None:
    """tp and pp come from the arguments when they add up to the cards, else from the cards."""
    assert tensor_parallel(engine, args, cards) == tp_pp


def test_vllm_budget_is_the_cuda_total_times_its_utilisation() -> None:
    """vLLM's budget is its utilisation of the total CUDA reports (an H100's 79.19 GiB, not
    NVML's 81,559 MiB): 0.92 by default from 0.21, 0.90 before, the flag's when set."""
    shape = hf(LLAMA_8B)
    newest = card_need(
        "vllm",
        shape,
        SizingRequest(args=(), tokens=8192, slots=1, cards=1, card_memory_bytes=H100_BYTES),
    )
    assert newest.card_total_bytes == H100_CUDA_BYTES
    assert newest.budget_bytes == int(H100_CUDA_BYTES * 0.92)
    assert "0.29 and later" in newest.rules and "no version named" in newest.rules
    older = card_need(
        "vllm",
        shape,
        SizingRequest(
            args=(),
            tokens=8192,
            slots=1,
            cards=1,
            card_memory_bytes=H100_BYTES,
            engine_version="0.10.2",
        ),
    )
    assert older.budget_bytes == int(H100_CUDA_BYTES * 0.9)
    assert "0.8 to 0.10" in older.rules and "0.10.2" in older.rules
    set_ = card_need(
        "vllm",
        shape,
        SizingRequest(
            args=("--gpu-memory-utilization=0.8",),
            tokens=8192,
            slots=1,
            cards=1,
            card_memory_bytes=H100_BYTES,
        ),
    )
    assert set_.budget_bytes == int(H100_CUDA_BYTES * 0.8)


def test_vllm_need_adds_weights_share_kv_share_and_overhead() -> None:
    """A vLLM card holds ceil(weights / tp), its heads' KV and the profile run's peak: on an
    H100 under 0.21-0.22 (Model Runner V1) the sampler over 1024 requests × the vocabulary
    outweighs 8192 tokens' forward pass."""
    shape = hf(LLAMA_8B)
    need = card_need(
        "vllm",
        shape,
        SizingRequest(
            args=("-tp", "2"),
            tokens=32_768,
            slots=1,
            cards=2,
            card_memory_bytes=H100_BYTES,
            engine_version="0.22.0",
        ),
    )
    weights_card = -(-shape.weights_bytes // 2)
    kv_card = 32_768 * 65_536
    # 1024 rows × 128256 logits × 30 B + the kept hidden states of 8192 tokens (from 0.11
    # tensor parallel adds nothing to the sampler's peak); non-torch 272 MiB: a card of no
    # named class is taken as PCIe-joined, and from 0.11 NCCL's buffers are set up before
    # vLLM's snapshot (vLLM PR #25359), so they add nothing; under 0.21-0.22 the CUDA graphs'
    # estimate (16 MiB for each of the 32 layers) is kept out of the pool
    activation = 1024 * 128_256 * 30 + 8192 * 4096 * 2
    assert need.activation_bytes == activation
    assert need.non_torch_bytes == 272 * MIB
    assert need.cuda_graph_bytes == 32 * 16 * MIB
    overhead = activation + 32 * 16 * MIB + 272 * MIB
    assert (need.weights_bytes, need.kv_bytes, need.cards) == (shape.weights_bytes, 2 * kv_card, 2)
    assert need.overhead_bytes == overhead
    assert need.per_card_bytes == weights_card + kv_card + overhead
    assert need.kv_pool_bytes == need.budget_bytes - weights_card - overhead
    assert need.kv_token_capacity == need.kv_pool_bytes // (16 * 65_536) * 16
    assert need.max_concurrency == need.kv_token_capacity / 32_768
    assert need.fits and need.margin_bytes > 0


@pytest.mark.parametrize(
    ("args", "card", "batch_tokens", "graph_layers"),
    [
        ([], H100_BYTES, 8192, 32),
        ([], L4_BYTES, 2048, 32),  # vLLM's default batch on cards under 70 GiB
        (["--max-num-batched-tokens", "4096"], L4_BYTES, 4096, 32),
        (["--enforce-eager"], H100_BYTES, 8192, 0),
        (["--pipeline-parallel-size", "2"], H100_BYTES, 8192, 16),
    ],
)
def test_vllm_overhead_follows_its_batch_and_graphs(
    args: list[str], card: int, batch_tokens: int, graph_layers: int
) -> None:
    """With one request the forward pass is the peak: 110,592 B a token for Llama-3.1-8B
    (3 × 4096 hidden + 3 × 14336 MLP, in bf16). CUDA graphs are outside the budget, in what
    1 − utilisation leaves, beside the CUDA context."""
    pp = 2 if "--pipeline-parallel-size" in args else 1
    need = card_need(
        "vllm",
        hf(LLAMA_8B),
        SizingRequest(
            args=(*args, "--max-num-seqs", "1"),
            tokens=8192,
            slots=1,
            cards=pp,
            card_memory_bytes=card,
            engine_version="0.10.2",
        ),
    )
    assert need.activation_bytes == batch_tokens * 110_592
    assert need.non_torch_bytes == 96 * MIB
    assert need.outside_bytes == 544 * MIB + graph_layers * CUDA_GRAPH_BYTES_PER_LAYER
    assert need.outside_room_bytes == need.card_total_bytes - need.budget_bytes


def test_vllm_defaults_to_the_small_batch_on_an_a100() -> None:
    """vLLM's large defaults skip A100s whatever their memory (arg_utils.py get_batch_defaults:
    "a100" not in device_name): 2048 tokens and 256 requests on an A100-80GB, as 0.21-0.22's
    sampler over those requests shows (later ranges' compiled peak hides the batch)."""
    a100 = card_need(
        "vllm",
        hf(LLAMA_8B),
        SizingRequest(
            args=(),
            tokens=8192,
            slots=1,
            cards=1,
            card_memory_bytes=81920 * MIB,
            card=CardTotals.of("A100-80GB", 81920 * MIB),
            engine_version="0.22.0",
        ),
    )
    assert a100.card_total_bytes == 81152 * MIB  # 79.25 GiB, as vLLM v0.31.0 printed
    assert a100.activation_bytes == 256 * 128_256 * 30 + 2048 * 4096 * 2


@pytest.mark.parametrize(
    ("card", "args", "tp", "fraction"),
    [
        # H100: 8192 chunked tokens, graphs to bs 256: 512 + 12288 + 512 + 128 = 13440 MiB
        (H100_BYTES, [], 1, round((81559 - 13440) / 81559, 3)),
        # L4: 2048 and bs 24 below tp 4: 512 + 3072 + 48 + 128 = 3760 MiB
        (L4_BYTES, [], 1, round((23034 - 3760) / 23034, 3)),
        # L4 at tp 4: bs 80 and half a GiB for the ranks: 512 + 3072 + 160 + 512 = 4256 MiB
        (L4_BYTES, [], 4, round((23034 - 4256) / 23034, 3)),
        # H200 (141 GB): the same bucket as H100, 13440 MiB
        (143771 * MIB, [], 1, round((143771 - 13440) / 143771, 3)),
        # a 40 GB A100: under the 60 GiB floor, 4096 tokens, bs 32: 512 + 6144 + 64 + 128
        (40960 * MIB, [], 1, round((40960 - 6848) / 40960, 3)),
        # B200 (180 GB): 16384 tokens, bs 512: 512 + 24576 + 1024 + 128 = 26240 MiB
        (183359 * MIB, [], 1, round((183359 - 26240) / 183359, 3)),
        # an EAGLE draft reserves 2 GiB more
        (H100_BYTES, ["--speculative-algorithm", "EAGLE"], 1, round((81559 - 15488) / 81559, 3)),
        (H100_BYTES, ["--mem-fraction-static", "0.85"], 1, 0.85),  # gt-049's setting
        (0, [], 1, 0.88),  # card unknown: SGLang's own fallback
    ],
)
def test_sglang_mem_fraction_static_default_by_card(
    card: int, args: list[str], tp: int, fraction: float
) -> None:
    """SGLang's fraction is (card − reserve) / card with the reserve its server_args derives."""
    assert sglang_mem_fraction_static(card, args, tp=tp, pp=1) == fraction


@pytest.mark.parametrize(
    ("version", "card", "args", "tp", "fraction"),
    [
        # H100 at tp 8: (9.5 + 8 / 2) GiB = 13,824 MiB, the 0.831 a 0.5.2rc2 start printed
        ("0.5.2rc2", H100_BYTES, [], 8, 0.831),
        # H100 at tp 1: (9.5 + 0.5) GiB
        ("0.4.8", H100_BYTES, [], 1, round((81559 - 10240) / 81559, 3)),
        # L4 at tp 4: (2.8 + 0.4) GiB = 3,276.8 MiB
        ("0.5.0", L4_BYTES, [], 4, round((23034 - 3276.8) / 23034, 3)),
        # H200 (141 GB) at tp 8: (12 + 4) GiB
        ("0.4.10", 143771 * MIB, [], 8, round((143771 - 16384) / 143771, 3)),
        # B200 (180 GB): 32 GiB whatever the ranks
        ("0.5.1", 183359 * MIB, [], 8, round((183359 - 32768) / 183359, 3)),
        # an EAGLE draft 2 GiB more, DP attention a flat 4 GiB
        ("0.5.2", H100_BYTES, ["--speculative-algorithm", "EAGLE"], 1, round(69271 / 81559, 3)),
        (
            "0.5.2",
            H100_BYTES,
            ["--enable-dp-attention", "--dp-size", "8"],
            8,
            round(63639 / 81559, 3),
        ),
        # before 0.4.8 the table by tp, from 0.5.3 the chunked-prefill and graph reserve
        ("0.4.7", H100_BYTES, [], 8, 0.81),
        ("0.5.3", H100_BYTES, [], 8, round((81559 - 14848) / 81559, 3)),
    ],
)
def test_sglang_mem_fraction_static_by_version(
    version: str, card: int, args: list[str], tp: int, fraction: float
) -> None:
    """SGLang 0.4.8-0.5.2 reserve by card class (server_args.py at v0.4.8, PR #7054); the
    versions either side keep their own rules."""
    got = sglang_mem_fraction_static(card, args, tp=tp, pp=1, engine_version=version)
    assert got == fraction


@pytest.mark.parametrize(
    ("card", "tp", "nvlink"),
    [
        ("H100-80GB", 1, False),
        ("H100-80GB", 2, True),
        ("A100-80GB", 8, True),
        ("H100-PCIe-80GB", 4, False),
        ("L40S-48GB", 4, False),
    ],
)
def test_sglang_preload_holds_nvlink_buffers_at_tp(card: str, tp: int, nvlink: bool) -> None:
    """At tp > 1 on an NVLink card (Ampere as Hopper: SGLang runs NCCL without NVLS) SGLang's
    budget is its fraction of CUDA's total less the preload and NCCL's NVLink buffers; one card,
    or cards on PCIe, take the preload alone."""
    totals = CardTotals.of(card, H100_BYTES, H100_CUDA_BYTES)
    need = card_need(
        "sglang",
        hf(LLAMA_8B),
        SizingRequest(
            args=("--mem-fraction-static", "0.8"),
            tokens=8192,
            slots=1,
            cards=tp,
            card_memory_bytes=H100_BYTES,
            card=totals,
        ),
    )
    preload = SGLANG_PRELOAD_BYTES + (SGLANG_NVLINK_PRELOAD_BYTES if nvlink else 0)
    assert need.budget_bytes == int((H100_CUDA_BYTES - preload) * 0.8)
    assert ("NVLink buffers" in need.rules) is nvlink


def test_sglang_budget_and_preload() -> None:
    """SGLang's weights and KV take its fraction (derived from NVML's total) of the memory free
    before loading (CUDA's total less the preload); activations and graphs live outside it."""
    shape = hf(LLAMA_8B)
    need = card_need(
        "sglang",
        shape,
        SizingRequest(args=(), tokens=8192, slots=1, cards=1, card_memory_bytes=H100_BYTES),
    )
    fraction = round((81559 - 13440) / 81559, 3)
    assert need.budget_bytes == int((H100_CUDA_BYTES - SGLANG_PRELOAD_BYTES) * fraction)
    assert need.overhead_bytes == 0
    assert need.per_card_bytes == shape.weights_bytes + 8192 * 131_072
    assert need.kv_pool_bytes == need.budget_bytes - shape.weights_bytes


def test_trtllm_budget_leaves_the_cache_its_free_fraction() -> None:
    """TensorRT-LLM fits when KV ≤ 0.9 × (CUDA total − weights − overhead)."""
    shape = hf(LLAMA_8B)
    need = card_need(
        "trtllm",
        shape,
        SizingRequest(args=(), tokens=8192, slots=1, cards=1, card_memory_bytes=H100_BYTES),
    )
    overhead = trtllm_overhead_bytes(shape, [], pp=1)
    assert need.overhead_bytes == overhead
    total = H100_CUDA_BYTES
    assert need.budget_bytes == int(0.9 * total + 0.1 * (shape.weights_bytes + overhead))
    kv_room = 0.9 * (total - shape.weights_bytes - overhead)
    assert need.fits == (need.kv_per_card_bytes <= kv_room)
    assert abs(need.kv_pool_bytes - kv_room) <= 1


def test_trtllm_reads_an_inline_extra_options_yaml_only() -> None:
    """kv_cache_config in an inline --extra_llm_api_options sets the cache dtype, fraction and
    block; a path is not read (the planner cannot see the node's files)."""
    shape = hf(LLAMA_8B)
    inline = ["--extra_llm_api_options", "kv_cache_config: {dtype: fp8, tokens_per_block: 64}"]
    assert kv_bytes_per_token_per_card("trtllm", shape, 1, inline) == 65_536
    need = card_need(
        "trtllm",
        shape,
        SizingRequest(
            args=tuple(inline), tokens=8192, slots=1, cards=1, card_memory_bytes=H100_BYTES
        ),
    )
    assert "read inline" in need.rules and need.kv_token_capacity % 64 == 0
    path = ["--extra_llm_api_options", "/etc/trtllm/extra.yaml"]
    assert kv_bytes_per_token_per_card("trtllm", shape, 1, path) == 131_072
    assert (
        "cannot read"
        in card_need(
            "trtllm",
            shape,
            SizingRequest(
                args=tuple(path), tokens=8192, slots=1, cards=1, card_memory_bytes=H100_BYTES
            ),
        ).rules
    )
    with pytest.raises(errors.EngineRefuses):
        kv_bytes_per_token_per_card(
            "trtllm", shape, 1, ["--extra_llm_api_options", "kv_cache_config: {dtype: nvfp9}"]
        )


def test_llamacpp_splits_layers_weights_and_kv_over_cards() -> None:
    """llama.cpp's fullest card holds ceil(layers / cards) layers' weights and cache."""
    shape = hf(LLAMA_8B)
    args = ["-c", "16384", "-np", "2", "-ngl", "99"]
    whole = llamacpp_kv_bytes(shape, args)
    one = card_need(
        "llamacpp",
        shape,
        SizingRequest(
            args=tuple(args), tokens=8192, slots=2, cards=1, card_memory_bytes=H100_BYTES
        ),
    )
    three = card_need(
        "llamacpp",
        shape,
        SizingRequest(
            args=tuple(args), tokens=8192, slots=2, cards=3, card_memory_bytes=H100_BYTES
        ),
    )
    assert one.kv_bytes == three.kv_bytes == whole
    assert one.kv_per_card_bytes == whole
    # llama.cpp places 33 layers (32 and the output layer) at split points 1/3, 2/3: layers
    # 0-10, 11-21 and 22-31 + output (src/llama-model.cpp load_tensors). Weights are a layer's
    # estimate, weights / (32 + 2), per layer and for the output layer.
    assert three.kv_per_card_bytes == whole * 11 // 32
    assert three.weights_per_card_bytes == 11 * (shape.weights_bytes // 34)
    assert [(d.device, d.layers, d.output) for d in three.devices] == [
        ("GPU0", 11, False),
        ("GPU1", 11, False),
        ("GPU2", 10, True),
        ("CPU", 0, False),
    ]
    assert one.budget_bytes == H100_BYTES - LLAMACPP_RESERVE_BYTES
    assert three.cards == 3


def test_llamacpp_partial_offload_keeps_the_rest_off_the_cards() -> None:
    """With -ngl 16 of 32 layers the output layer is one of the 16 (llama.cpp offloads from
    layer 33 - 16 = 17: layers 17-31 and the output), so a card holds 15 layers' cache and 16
    layers' weights; layers 0-16 stay on the CPU."""
    shape = hf(LLAMA_8B)
    args = ["-c", "8192", "-ngl", "16"]
    need = card_need(
        "llamacpp",
        shape,
        SizingRequest(
            args=tuple(args), tokens=8192, slots=1, cards=1, card_memory_bytes=H100_BYTES
        ),
    )
    assert need.weights_per_card_bytes == 16 * (shape.weights_bytes // 34)
    assert need.kv_per_card_bytes == llamacpp_kv_bytes(shape, args) * 15 // 32
    cpu = need.devices[-1]
    assert (cpu.device, cpu.layers, cpu.first_layer, cpu.last_layer) == ("CPU", 17, 0, 16)


def test_one_card_engine_holds_its_weights() -> None:
    """An embeddings server's need is its weights, against the card less its reserve."""
    shape = hf(LLAMA_8B)
    need = card_need(
        "infinity",
        shape,
        SizingRequest(args=(), tokens=0, slots=0, cards=1, card_memory_bytes=H100_BYTES),
    )
    assert (need.per_card_bytes, need.kv_bytes, need.cards) == (shape.weights_bytes, 0, 1)
    assert need.budget_bytes == H100_BYTES - GIB


@pytest.mark.parametrize(
    ("engine", "args", "slots", "name"),
    [
        ("vllm", [], 1, LLAMA_8B),
        ("vllm", ["--no-enable-chunked-prefill"], 1, LLAMA_8B),
        ("vllm", [], 1, GPT_OSS_120B),
        ("sglang", [], 1, GEMMA2_9B),
        ("trtllm", [], 1, QWEN3_NEXT),
        ("llamacpp", ["-ngl", "99"], 2, LLAMA_8B),
    ],
)
def test_need_never_shrinks_as_the_context_grows(
    engine: str, args: list[str], slots: int, name: str
) -> None:
    """The per-card need is monotonic in tokens, so the longest context can be searched for."""
    shape = hf(name)
    needs = [
        card_need(
            engine,
            shape,
            SizingRequest(
                args=tuple(args), tokens=tokens, slots=slots, cards=1, card_memory_bytes=H100_BYTES
            ),
        ).per_card_bytes
        for tokens in (256, 1000, 4096, 8191, 8192, 8193, 20_000, 65_536, 131_072)
    ]
    assert needs == sorted(needs)


def test_unknown_card_memory_gives_no_budget() -> None:
    """Without the card's memory the budget is 0, which the planner reads as "not checked"."""
    need = card_need(
        "vllm",
        hf(LLAMA_8B),
        SizingRequest(args=(), tokens=8192, slots=1, cards=1, card_memory_bytes=0),
    )
    assert need.budget_bytes == 0 and need.fits


def test_engine_table_covers_every_engine() -> None:
    """Every engine has memory rules: context flags and one-card engines as the engine table."""
    get = registry.get
    assert get("vllm").default_utilisation == 0.92  # the newest rules; 0.90 before 0.21
    assert get("trtllm-serve").default_utilisation == 0.9
    assert get("sglang").default_utilisation is None  # derived from the card
    assert get("llama.cpp").takes_context and not get("llamacpp").single_card
    assert get("tei").single_card and not get("tei").takes_context


def test_capacities_turn_memory_into_whole_pages() -> None:
    """vLLM floors to 16-token blocks; SGLang's hybrid SWA pool gives full layers their share."""
    llama = hf(LLAMA_8B)
    assert vllm_token_capacity(llama, available_kv_bytes=GIB, tp=1, args=[]) == 8192
    assert vllm_token_capacity(llama, available_kv_bytes=GIB - 1, tp=1, args=[]) == 8176
    assert vllm_token_capacity(llama, available_kv_bytes=-GIB, tp=1, args=[]) == 0
    gemma = hf(GEMMA2_9B)
    cell = 42 * 8 * 512 * 2
    tokens = 10 * GIB // cell
    assert sglang_token_capacity(gemma, available_kv_bytes=10 * GIB, tp=1, args=[]) == int(
        tokens * 42 / (0.8 * 21 + 21)
    )


def test_shape_without_weights_needs_only_cache_and_overhead() -> None:
    """A shape whose weights are unknown (0) still sizes its cache and overhead."""
    shape = replace(hf(LLAMA_8B), weights_bytes=0)
    need = card_need(
        "vllm",
        shape,
        SizingRequest(args=(), tokens=4096, slots=1, cards=1, card_memory_bytes=H100_BYTES),
    )
    assert need.per_card_bytes == 4096 * 131_072 + need.overhead_bytes


# (engine, args as the profile has them) sized at several contexts one after the other
MEMO_CASES = [
    ("vllm", ["--max-model-len", "8192"]),
    ("vllm", ["--max-model-len=8192", "--max-num-batched-tokens", "8192"]),
    ("vllm", ["--max-model-len", "4096", "--max-num-batched-tokens", "4096", "-tp", "2"]),
    ("vllm", ["--max-model-len", "8192", "--no-enable-chunked-prefill"]),
    ("vllm", ["--max_model_len", "8192", "--kv-cache-dtype", "fp8"]),
    ("sglang", ["--context-length", "8192"]),
    ("sglang", ["--context-length=8192", "--page-size", "16"]),
    ("trtllm", ["--max_seq_len", "8192"]),
]


@pytest.mark.parametrize(("engine", "args"), MEMO_CASES)
@pytest.mark.parametrize("version", ["", "V0", "0.10.2", "0.19.0"])
def test_needs_worked_out_once_per_setting_equal_fresh_ones(
    engine: str, args: list[str], version: str
) -> None:
    """What sizing keeps per shape and setting (the overhead, tp, cache type, pool layout)
    never changes an answer: each context sized after the others on one shape gets exactly
    the need a fresh copy of the shape gets."""
    shape = hf(LLAMA_8B)
    eng = registry.find(engine)
    assert eng is not None
    for tokens in (4096, 8192, 40_000, 4096, 131_072, 2048):
        trial = eng.with_context(args, tokens, 1)
        for cards in (1, 2):
            asked = SizingRequest(
                args=tuple(trial),
                tokens=tokens,
                slots=1,
                cards=cards,
                card_memory_bytes=L4_BYTES if tokens == 2048 else H100_BYTES,
                engine_version=version,
            )
            kept = card_need(engine, shape, asked)
            fresh = card_need(engine, replace(shape), asked)
            assert kept == fresh, (tokens, cards)
