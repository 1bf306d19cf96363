"""A batch of concurrent requests: written to each engine's own flag, sized, and answered
with whether it fits and how many of the context the pool holds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmgw.engines import registry
from llmgw.model import Inventory, Model, Node, Profile
from planner_svc.domain import errors
from planner_svc.domain.context import size_context
from planner_svc.domain.gpus import plan_gpus
from tests.support.shapes import LLAMA_31_8B

H100 = Inventory(
    nodes=(Node("n1", "H100-80GB", gpus=8, free_gpus=8, gpu_memory_bytes=81559 << 20),)
)


def model_with(*profiles: Profile) -> Model:
    """Llama-3.1-8B served by `profiles`."""
    return Model(
        "llama-8b", "hf://meta-llama/Llama-3.1-8B-Instruct", context_length=8192, profiles=profiles
    )


VLLM = Profile("v", "vllm", ("--max-model-len", "8192"), gpu_class="H100-80GB", gpus_per_node=1)
SGLANG = Profile(
    "s", "sglang", ("--context-length", "8192"), gpu_class="H100-80GB", gpus_per_node=1
)
TRTLLM = Profile("t", "trtllm", ("--max_seq_len", "8192"), gpu_class="H100-80GB", gpus_per_node=1)
LLAMACPP = Profile(
    "g", "llamacpp", ("-c", "8192", "-ngl", "99"), gpu_class="H100-80GB", gpus_per_node=1
)


@pytest.mark.parametrize(
    ("profile", "flag"),
    [
        (VLLM, "--max-num-seqs"),
        (SGLANG, "--max-running-requests"),
        (TRTLLM, "--max_batch_size"),
        (LLAMACPP, "--parallel"),
    ],
)
def test_a_batch_is_written_to_the_engines_own_flag(profile: Profile, flag: str) -> None:
    """32 requests of 8192 tokens: each engine's concurrency flag says 32, and the answer
    says the batch fits with the pool's count of such requests beside it."""
    change = size_context(
        model_with(profile), LLAMA_31_8B, tokens=8192, slots=0, inventory=H100, sequences=32
    )
    args = change.updated[0].args
    engine = registry.get(profile.engine)
    assert engine.grammar.get(args, (flag,)) == "32"
    (batch,) = change.batches
    assert (batch.profile, batch.sequences, batch.tokens, batch.flag) == (
        profile.name,
        32,
        8192,
        flag,
    )
    assert batch.fits and batch.contexts_held >= 32
    card = change.profiles[0].need.card
    assert card is not None
    if profile.engine != "llamacpp":  # a shared pool: its tokens over the context
        assert batch.contexts_held == card.kv_token_capacity // 8192


def test_a_batch_the_pool_cannot_hold_is_said_not_to_fit() -> None:
    """4000 requests of 8192 tokens are more than an H100's pool holds for Llama-3.1-8B: the
    cards still hold the engine, and the answer says the batch does not fit and how many do."""
    change = size_context(
        model_with(VLLM), LLAMA_31_8B, tokens=8192, slots=0, inventory=H100, sequences=4000
    )
    (batch,) = change.batches
    assert not batch.fits
    assert 0 < batch.contexts_held < 4000


def test_the_batch_sizes_vllms_profiling_run() -> None:
    """vLLM's dummy sampler runs over min(--max-num-seqs, batch) requests: a batch of 16
    needs less activation memory than the default 1024 on an H100 (under 0.22, where the
    sampler is the peak; later ranges' compiled profile run outweighs it)."""
    v1 = replace(VLLM, engine_version="0.22.0")
    one = size_context(model_with(v1), LLAMA_31_8B, tokens=8192, slots=0, inventory=H100)
    few = size_context(
        model_with(v1), LLAMA_31_8B, tokens=8192, slots=0, inventory=H100, sequences=16
    )
    default_card, few_card = one.profiles[0].need.card, few.profiles[0].need.card
    assert default_card is not None and few_card is not None
    assert few_card.activation_bytes < default_card.activation_bytes
    assert not one.batches


@pytest.mark.parametrize("sequences", [-1, 1 << 20])
def test_out_of_range_batches_are_refused(sequences: int) -> None:
    """A negative or absurd batch is refused by field."""
    with pytest.raises(errors.InvalidRequest) as caught:
        size_context(
            model_with(VLLM), LLAMA_31_8B, tokens=8192, slots=0, inventory=H100, sequences=sequences
        )
    assert caught.value.field == "sequences"


def test_llamacpp_refuses_a_batch_past_its_slots() -> None:
    """llama-server serves at most 64 slots: a batch of 65 is refused, naming what would work."""
    with pytest.raises(errors.SlotsOutOfRange) as caught:
        size_context(
            model_with(LLAMACPP), LLAMA_31_8B, tokens=8192, slots=0, inventory=H100, sequences=65
        )
    assert "64" in caught.value.message


def test_plan_gpus_answers_the_batch_at_the_profiles_context() -> None:
    """PlanGPUs with a batch writes it to the engine's flag and says whether it fits on the
    new card count; two cards hold more requests than one."""
    one = plan_gpus(
        model_with(VLLM), LLAMA_31_8B, gpus=1, profile="", inventory=H100, sequences=256
    )
    two = plan_gpus(
        model_with(VLLM), LLAMA_31_8B, gpus=2, profile="", inventory=H100, sequences=256
    )
    assert registry.get("vllm").grammar.get(two.updated[0].args, ("--max-num-seqs",)) == "256"
    (b1,), (b2,) = one.batches, two.batches
    assert b1.tokens == b2.tokens == 8192
    assert b2.contexts_held > b1.contexts_held
    assert b2.fits is (b2.contexts_held >= 256)


def test_no_batch_without_a_cards_memory() -> None:
    """Where the card's memory is not known nothing is checked, and no batch answer is made."""
    p = replace(VLLM, gpu_class="mystery-card")
    change = size_context(
        model_with(p), LLAMA_31_8B, tokens=8192, slots=0, inventory=Inventory(), sequences=8
    )
    assert change.batches == ()
