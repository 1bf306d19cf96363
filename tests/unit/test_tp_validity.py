"""Tensor parallel validity beyond the heads: the widths vLLM and SGLang split at load
(llmgw.engines.heads), read from real configs, and the refusal that names the failed check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmgw.engines import registry
from llmgw.engines.heads import TpOptions, tp_failure, valid_counts
from llmgw.engines.sglang import sglang_mem_fraction_static
from llmgw.model import Inventory, Model, Node, Profile
from llmgw.shape import ModelShape, ParallelDims, WeightQuant
from planner_svc.domain import errors
from planner_svc.domain.gpus import plan_gpus
from planner_svc.domain.hf_shape import shape_from_hf_config

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hf"
FP8_BLOCKS = {"quant_method": "fp8", "weight_block_size": [128, 128]}


def config(name: str) -> dict[str, object]:
    """A fixture config.json (tests/fixtures/hf/PROVENANCE.md)."""
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    assert isinstance(data, dict)
    return data


def shape(name: str, **changes: object) -> ModelShape:
    """The fixture's shape, with top-level keys replaced."""
    return shape_from_hf_config({**config(name), **changes})


@pytest.mark.parametrize(
    ("name", "changes", "counts"),
    [
        # Dense GQA: 32 heads and 8 KV heads allow 1, 2, 4, 8 (vLLM's usual counts).
        ("meta-llama__Llama-3.1-8B-Instruct", {}, (1, 2, 4, 8)),
        # DeepSeek-V3 in fp8 blocks of 128: 2048 expert channels / 8 = 256, 18432 / 8 = 2304,
        # both whole blocks; it is served at TP8.
        ("deepseek-ai__DeepSeek-V3", {}, (1, 2, 4, 8)),
        # Qwen3-235B-A22B-FP8 (the same geometry in fp8 blocks): 1536 expert channels / 8 = 192
        # are not whole blocks of 128, the refusal public reports show at TP8.
        ("Qwen__Qwen3-235B-A22B", {"quantization_config": FP8_BLOCKS}, (1, 2, 4)),
        ("Qwen__Qwen3-235B-A22B", {}, (1, 2, 4, 8)),
        # Qwen2.5-72B AWQ (group 128) keeps the 29568-channel MLP: 14784 a shard at TP2 is not
        # the Marlin kernel's 128 (vllm-project/vllm#13640, QwenLM/Qwen3-VL#231).
        (
            "Qwen__Qwen2.5-72B-Instruct",
            {"quantization_config": {"quant_method": "awq", "group_size": 128, "bits": 4}},
            (1,),
        ),
        ("Qwen__Qwen2.5-72B-Instruct", {}, (1, 2, 4, 8)),
        # Llama 4 Scout: 40 heads over 8 KV heads; its vision encoder's 16 heads and 5632
        # channels split the same ways.
        ("meta-llama__Llama-4-Scout-17B-16E-Instruct", {}, (1, 2, 4, 8)),
        # Nemotron-H-8B: 128 Mamba heads in 8 groups and a 21504-channel MLP.
        ("nvidia__Nemotron-H-8B-Base-8K", {}, (1, 2, 4, 8)),
        # Qwen3-Next: 16 key and 32 value heads of its gated delta nets, 2 KV heads.
        ("Qwen__Qwen3-Next-80B-A3B-Thinking", {}, (1, 2, 4, 8)),
    ],
)
def test_valid_counts_of_real_configs(
    name: str, changes: dict[str, object], counts: tuple[int, ...]
) -> None:
    """The counts up to a node of eight that pass every check the engines make at load."""
    assert valid_counts(shape(name, **changes)) == counts


def test_vocabulary_is_split_after_padding_to_64() -> None:
    """Mixtral-8x22B (Mixtral-8x7B's config at its published 6144 hidden, 48 heads, 8 KV heads
    and 32768 rows) refuses tp 3 at its vocabulary first, as vLLM did ("32768 is not divisible
    by 3", vllm-project/vllm#6385); Llama 3's 128256 rows do split 3 ways."""
    mixtral = shape(
        "mistralai__Mixtral-8x7B-v0.1",
        hidden_size=6144,
        num_attention_heads=48,
        num_key_value_heads=8,
        vocab_size=32768,
    )
    failure = tp_failure(3, mixtral)
    assert failure is not None and "vocabulary of 32768" in failure
    llama = shape("meta-llama__Llama-3.1-8B-Instruct", num_attention_heads=48, head_dim=128)
    assert tp_failure(3, llama) is not None  # its 8 KV heads, not its vocabulary
    assert "vocabulary" not in (tp_failure(3, llama) or "")


def test_vision_heads_are_checked() -> None:
    """A vision encoder of 12 heads refuses TP8 (GLM-4.5V: "12 is not divisible by 8",
    vllm-project/vllm#24004) unless vLLM runs the encoder data parallel."""
    base = config("meta-llama__Llama-4-Scout-17B-16E-Instruct")
    vision = {**base["vision_config"], "num_attention_heads": 12}  # type: ignore[dict-item]
    model = shape_from_hf_config({**base, "vision_config": vision})
    assert tp_failure(8, model) == "its 12 vision encoder heads do not divide by 8"
    assert tp_failure(8, model, TpOptions(vision_data_parallel=True)) is None
    assert valid_counts(model) == (1, 2, 4)


def test_expert_parallel_lifts_the_expert_width() -> None:
    """With experts dealt out whole (vLLM --enable-expert-parallel, SGLang --ep-size 8) the
    192-channel shard of Qwen3-235B-FP8 at TP8 does not arise."""
    fp8 = shape("Qwen__Qwen3-235B-A22B", quantization_config=FP8_BLOCKS)
    failure = tp_failure(8, fp8)
    assert failure is not None and "192 output channels" in failure
    assert tp_failure(8, fp8, TpOptions(expert_ranks=8)) is None
    vllm, sglang = registry.get("vllm"), registry.get("sglang")
    assert not vllm.splits_heads(8, fp8, [])
    assert vllm.splits_heads(8, fp8, ["--enable-expert-parallel"])
    assert not sglang.splits_heads(8, fp8, [])
    assert sglang.splits_heads(8, fp8, ["--ep-size", "8"])
    # --ep-size 2 splits each expert 4 ways: 384 channels, three whole blocks.
    assert sglang.splits_heads(8, fp8, ["--ep-size", "2"])


@pytest.mark.parametrize(
    ("dims", "tp", "phrase"),
    [
        (ParallelDims(dense_intermediate=14336), 3, "14336 dense MLP channels"),
        (ParallelDims(expert_intermediate=1407), 2, "1407 expert MLP channels"),
        (ParallelDims(ssm_heads=24), 16, "24 Mamba heads"),
        (ParallelDims(ssm_groups=8), 16, "8 Mamba groups"),
        (ParallelDims(linear_v_heads=12), 8, "12 linear-attention value heads"),
        (
            ParallelDims(dense_intermediate=29568, quant=WeightQuant("gptq", group=128)),
            2,
            "Marlin",
        ),
        (
            ParallelDims(dense_intermediate=2880, quant=WeightQuant("fp8", block=(128, 128))),
            2,
            "1440 output channels is not whole fp8 blocks of 128",
        ),
    ],
)
def test_each_check_names_itself(dims: ParallelDims, tp: int, phrase: str) -> None:
    """A count failing one width is refused with that width named."""
    model = ModelShape("x", (), attention_heads=48, kv_heads=0, parallel=dims)
    failure = tp_failure(tp, model)
    assert failure is not None and phrase in failure, failure


def test_mamba_groups_of_one_are_replicated() -> None:
    """Mamba-2 groups that do not divide are fine when there is one (vLLM replicates it)."""
    model = ModelShape("x", (), 0, 0, parallel=ParallelDims(ssm_heads=64, ssm_groups=1))
    assert tp_failure(8, model) is None


def test_the_refusal_names_the_check_and_every_count_that_passes() -> None:
    """PlanGPUs refuses TP8 for Qwen3-235B-FP8 with the failed check and the counts 1, 2, 4."""
    fp8 = shape("Qwen__Qwen3-235B-A22B", quantization_config=FP8_BLOCKS)
    profile = Profile("p", "vllm", (), gpu_class="H100-80GB", gpus_per_node=1, tp=1)
    model = Model("qwen3-235b-fp8", profiles=(profile,))
    inventory = Inventory((Node("n", "H100-80GB", 8),))
    with pytest.raises(errors.HeadsNotDivisible) as caught:
        plan_gpus(model, fp8, gpus=8, profile="", inventory=inventory)
    refusal = caught.value
    assert refusal.valid_counts == (1, 2, 4)
    assert "expert MLP" in refusal.check and "192" in refusal.check
    assert refusal.metadata()["check"] == refusal.check
    assert "1, 2, 4" in refusal.message


def test_sglang_dp_attention_splits_heads_over_fewer_ranks_and_reserves_more() -> None:
    """SGLang --enable-dp-attention --dp-size 2 at tp 8 splits attention 4 ways (DeepSeek-V3's
    128 heads), refuses a tp that is not a multiple of the dp size, and reserves what SGLang's
    server_args.py adds for it: cuda_graph_max_bs × dp × 3 MiB, × 1.5 more past 300."""
    v3 = shape("deepseek-ai__DeepSeek-V3")
    sglang = registry.get("sglang")
    dp_args = ["--enable-dp-attention", "--dp-size", "2"]
    assert sglang.splits_heads(8, v3, dp_args)
    assert not sglang.splits_heads(3, v3, dp_args)
    # Qwen2.5-7B's 28 heads do not split 8 ways, but 4 ways they do (and its 4 KV heads).
    qwen = shape("Qwen__Qwen2.5-7B-Instruct")
    assert not sglang.splits_heads(8, qwen, [])
    assert sglang.splits_heads(8, qwen, dp_args)
    card = 81559 << 20
    plain = sglang_mem_fraction_static(card, [], tp=8, pp=1)
    with_dp = sglang_mem_fraction_static(card, dp_args, tp=8, pp=1)
    # Both rounded to 3 places. An H100 at tp 8 captures graphs up to 512: 512 × 2 × (3 + 1.5)
    # MiB = 4608 MiB more.
    want = 4608 / (card / (1 << 20))
    assert plain - with_dp == pytest.approx(want, abs=0.0011)
    # dp 8 reserves four times that: 18432 MiB, a fraction 0.226 lower
    dp8 = sglang_mem_fraction_static(card, ["--enable-dp-attention", "--dp-size", "8"], tp=8, pp=1)
    assert plain - dp8 == pytest.approx(18432 / (card / (1 << 20)), abs=0.0011)
    # under 300 graphs only the 3 MiB term: --cuda-graph-max-bs 128 at dp 8 adds 3072 MiB
    small = ["--cuda-graph-max-bs", "128"]
    base = sglang_mem_fraction_static(card, small, tp=8, pp=1)
    dp_small = sglang_mem_fraction_static(
        card, [*small, *dp_args[:1], "--dp-size", "8"], tp=8, pp=1
    )
    assert base - dp_small == pytest.approx(3072 / (card / (1 << 20)), abs=0.0011)
