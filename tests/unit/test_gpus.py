"""PlanGPUs' rules: tensor parallel held to the heads, llama.cpp's layer split, refusals for
one-card engines, counts no node has, and cards too small."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmgw.common.v1 import common_pb2
from llmgw.model import Inventory, Model, Node, Profile
from planner_svc.domain import errors
from planner_svc.domain.gpus import plan_gpus
from planner_svc.rpc.convert import profile_change_to_proto
from tests.support.shapes import LLAMA_31_8B, LLAMA_31_70B, QWEN25_7B

NODES = Inventory(
    nodes=(
        Node("a", "H100-80GB", gpus=8, free_gpus=8, gpu_memory_bytes=81559 << 20),
        Node("b", "L4-24GB", gpus=4, free_gpus=4, gpu_memory_bytes=23034 << 20),
    )
)


def model(*profiles: Profile) -> Model:
    """A model served at 8192 tokens with `profiles`."""
    return Model(name="m", source="hf://x/y", context_length=8192, profiles=profiles)


VLLM = Profile(
    "v", "vllm", ("--max-model-len", "8192", "-tp", "1"), gpu_class="H100-80GB", gpus_per_node=1
)
LCPP = Profile(
    "l",
    "llamacpp",
    ("-c", "8192", "-ts", "3,1", "-ngl", "99"),
    gpu_class="H100-80GB",
    gpus_per_node=2,
)
TEI = Profile("e", "tei", (), gpu_class="H100-80GB", gpus_per_node=1)
CPU = Profile("c", "llamacpp", ("-c", "8192"), cpu_only=True)


def test_vllm_tensor_parallel_is_set_to_the_count() -> None:
    """vLLM's tensor parallel flag and the profile's cards become N."""
    change = plan_gpus(model(VLLM), LLAMA_31_8B, gpus=4, profile="", inventory=NODES)
    (p,) = change.updated
    assert p.args == ("--max-model-len", "8192", "-tp", "4")
    assert (p.gpus_per_node, p.tp) == (4, 4)
    assert "a card of 1" in change.profiles[0].before
    assert "a card of 4" in change.profiles[0].after


def test_llamacpp_splits_layers_and_drops_tensor_split() -> None:
    """llama.cpp gets `--split-mode layer` and loses its old `--tensor-split`."""
    change = plan_gpus(model(LCPP), LLAMA_31_8B, gpus=4, profile="l", inventory=NODES)
    (p,) = change.updated
    assert p.args == ("-c", "8192", "-ngl", "99", "--split-mode", "layer")
    assert p.gpus_per_node == 4


def test_llamacpp_answer_places_layers_per_device() -> None:
    """The answer gives each card's layers, weights and KV as llama.cpp places them: before,
    `-ts 3,1` over 2 cards (33 layers at a 0.75 split point: 25 and 7 + output); after, an even
    split over 4 (9, 8, 8, 7 + output); the token embeddings stay on the CPU. The proto carries
    the same per device."""
    change = plan_gpus(model(LCPP), LLAMA_31_8B, gpus=4, profile="l", inventory=NODES)
    (c,) = change.profiles
    assert c.need_before.card is not None and c.need.card is not None
    before = [(d.device, d.layers, d.output) for d in c.need_before.card.devices]
    assert before == [("GPU0", 25, False), ("GPU1", 7, True), ("CPU", 0, False)]
    after = [(d.device, d.layers, d.output) for d in c.need.card.devices]
    assert after == [
        ("GPU0", 9, False),
        ("GPU1", 8, False),
        ("GPU2", 8, False),
        ("GPU3", 7, True),
        ("CPU", 0, False),
    ]
    fullest = c.need.card.devices[0]
    assert c.need.card.kv_per_card_bytes == fullest.kv_bytes == c.need.card.kv_bytes * 9 // 32
    msg = profile_change_to_proto(c)
    assert [(d.device, d.layers, d.kv_bytes) for d in msg.memory.devices] == [
        (d.device, d.layers, d.kv_bytes) for d in c.need.card.devices
    ]


@pytest.mark.parametrize(
    ("shape", "gpus", "valid"),
    [
        (QWEN25_7B, 3, (1, 2, 4)),  # 28 heads, 4 KV heads: 7 divides 28 but not the KV heads
        (LLAMA_31_8B, 3, (1, 2, 4, 8)),
        (LLAMA_31_8B, 6, (1, 2, 4, 8)),
    ],
)
def test_heads_not_divisible_names_the_counts_that_work(
    shape: object, gpus: int, valid: tuple[int, ...]
) -> None:
    """A count that does not split the heads is refused with the counts that do (≤ the node)."""
    from llmgw.shape import ModelShape

    assert isinstance(shape, ModelShape)
    with pytest.raises(errors.HeadsNotDivisible) as caught:
        plan_gpus(model(VLLM), shape, gpus=gpus, profile="", inventory=NODES)
    assert caught.value.valid_counts == valid
    assert caught.value.metadata()["valid_counts"] == ",".join(map(str, valid))


def test_count_no_node_has_names_the_largest() -> None:
    """A count larger than any node of the class is refused, naming the largest there is."""
    with pytest.raises(errors.GPUCountUnavailable) as caught:
        plan_gpus(model(VLLM), LLAMA_31_8B, gpus=16, profile="", inventory=NODES)
    assert caught.value.largest == 8


def test_one_card_engine_is_refused_more_cards() -> None:
    """An embedding server runs on one card: 2 is refused with ENGINE_SINGLE_CARD."""
    with pytest.raises(errors.EngineSingleCard):
        plan_gpus(model(TEI), LLAMA_31_8B, gpus=2, profile="e", inventory=NODES)


def test_every_gpu_profile_is_planned_and_cpu_ones_kept() -> None:
    """Without a profile name every GPU profile moves and CPU profiles stay as they were."""
    change = plan_gpus(model(VLLM, LCPP, CPU), LLAMA_31_8B, gpus=2, profile="", inventory=NODES)
    assert [c.profile for c in change.profiles] == ["v", "l"]
    assert change.updated[2] == CPU


@pytest.mark.parametrize(
    ("name", "error"),
    [("nope", errors.ProfileNotFound), ("c", errors.InvalidRequest)],
)
def test_profile_must_exist_and_run_on_cards(name: str, error: type[errors.PlannerError]) -> None:
    """Naming a missing profile, or a CPU one, is refused."""
    with pytest.raises(error):
        plan_gpus(model(VLLM, CPU), LLAMA_31_8B, gpus=2, profile=name, inventory=NODES)


@pytest.mark.parametrize("gpus", [0, -1, 100_000])
def test_absurd_counts_are_refused(gpus: int) -> None:
    """Zero, negative and absurd card counts are refused as bad input."""
    with pytest.raises(errors.InvalidRequest):
        plan_gpus(model(VLLM), LLAMA_31_8B, gpus=gpus, profile="", inventory=NODES)


def test_cards_too_small_names_the_fewest_that_hold_it() -> None:
    """70B on 2 H100s at 8192 tokens does not fit; the refusal names the fewest cards that do."""
    with pytest.raises(errors.CardsTooSmall) as caught:
        plan_gpus(model(VLLM), LLAMA_31_70B, gpus=1, profile="", inventory=NODES)
    err = caught.value
    assert err.cards == 1
    assert err.fewest_cards in (2, 4)
    assert err.longest_context_tokens == 0


def test_without_shape_heads_are_not_checked_and_noted() -> None:
    """Without a shape any count a node has is accepted, with a note that heads were not checked."""
    change = plan_gpus(model(VLLM), None, gpus=3, profile="", inventory=NODES, note="unread")
    assert change.updated[0].tp == 3
    assert "heads are not known" in change.note


def test_unknown_weights_still_answer_memory_unchecked() -> None:
    """With the files' sizes unknown PlanGPUs gives the KV figures, the pool and its capacity
    (the budget beside the overhead, weights counted as 0), says so, and refuses nothing for
    memory even where known weights would not fit (70B on one H100)."""
    shape = replace(LLAMA_31_70B, weights_bytes=0)
    change = plan_gpus(model(VLLM), shape, gpus=1, profile="", inventory=NODES)
    memory = profile_change_to_proto(change.profiles[0]).memory
    assert memory.weights_unknown
    assert memory.verdict == common_pb2.FIT_VERDICT_NOT_CHECKED
    assert memory.weights_bytes == memory.weights_per_card_bytes == 0
    assert memory.kv_per_card_bytes == 8192 * 327_680  # 80 layers × 8 KV heads × 256 × 2 B
    assert memory.activation_bytes > 0 and memory.budget_bytes > 0
    assert memory.kv_pool_bytes == memory.budget_bytes - memory.overhead_bytes
    assert memory.kv_token_capacity > 0
    assert memory.max_concurrency == memory.kv_token_capacity / 8192
    assert "sizes are not known" in change.note and "KV cache's figures are given" in change.note
    known = plan_gpus(model(VLLM), LLAMA_31_70B, gpus=4, profile="", inventory=NODES)
    assert not profile_change_to_proto(known.profiles[0]).memory.weights_unknown


def test_plan_gpus_refusal_names_the_acceptance_edge() -> None:
    """PlanGPUs' refusal names the longest context the same cards accept, by the rule
    SizeContext accepts with: that context fits, 256 tokens more does not."""
    l4 = Inventory(nodes=(Node("n", "L4-24GB", gpus=4, free_gpus=4, gpu_memory_bytes=23034 << 20),))
    p = Profile("gpu", "vllm", ("--max-model-len", "131072"), gpu_class="L4-24GB", gpus_per_node=2)
    shape = replace(LLAMA_31_8B, weights_bytes=14 * (1 << 30))
    m = Model("m", "hf://x/y", context_length=131_072, profiles=(p,))
    with pytest.raises(errors.CardsTooSmall) as caught:
        plan_gpus(m, shape, gpus=1, profile="", inventory=l4)
    longest = caught.value.longest_context_tokens
    assert longest > 0
    at = replace(p, args=("--max-model-len", str(longest)))
    plan_gpus(
        replace(m, context_length=longest, profiles=(at,)), shape, gpus=1, profile="", inventory=l4
    )
    over = replace(p, args=("--max-model-len", str(longest + 256)))
    with pytest.raises(errors.CardsTooSmall):
        plan_gpus(
            replace(m, context_length=longest + 256, profiles=(over,)),
            shape,
            gpus=1,
            profile="",
            inventory=l4,
        )
