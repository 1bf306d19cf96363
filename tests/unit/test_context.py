"""SizeContext's rules: the reference's refusals, the engines' arguments, max_output and
memory refusals that name what would fit."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmgw.model import Inventory, Model, Node, Profile
from planner_svc.domain import errors
from planner_svc.domain.context import default_max_output, size_context
from tests.support.shapes import LLAMA_31_8B, LLAMA_31_70B, QWEN25_7B

H100 = Inventory(
    nodes=(Node("n1", "H100-80GB", gpus=8, free_gpus=8, gpu_memory_bytes=81559 << 20),)
)
L4 = Inventory(nodes=(Node("n1", "L4-24GB", gpus=4, free_gpus=4, gpu_memory_bytes=23034 << 20),))


def model_with(*profiles: Profile, context: int = 8192, max_output: int = 0) -> Model:
    """A catalog entry for Llama-3.1-8B served with `profiles`."""
    return Model(
        name="llama-8b",
        source="hf://meta-llama/Llama-3.1-8B-Instruct",
        context_length=context,
        max_output=max_output,
        profiles=profiles,
    )


VLLM = Profile("gpu", "vllm", ("--max-model-len", "8192"), gpu_class="H100-80GB", gpus_per_node=1)
SGLANG = Profile("sg", "sglang", ("--context-length=8192",), gpu_class="H100-80GB", gpus_per_node=1)
TRTLLM = Profile("trt", "trtllm", (), gpu_class="H100-80GB", gpus_per_node=1)
LLAMACPP = Profile(
    "gguf",
    "llamacpp",
    ("-c", "16384", "-np", "2", "-ngl", "99"),
    gpu_class="H100-80GB",
    gpus_per_node=1,
)
CPU = Profile("cpu", "llamacpp", ("--ctx-size", "8192"), cpu_only=True, min_memory_gb=20)


@pytest.mark.parametrize(
    ("tokens", "slots", "error", "reason_field"),
    [
        (255, 0, errors.ContextTooShort, "tokens"),
        (0, 0, errors.ContextTooShort, "tokens"),
        (-5, 0, errors.ContextTooShort, "tokens"),
        (1 << 40, 0, errors.InvalidRequest, "tokens"),
        (4096, -1, errors.SlotsOutOfRange, "slots"),
        (4096, 65, errors.SlotsOutOfRange, "slots"),
    ],
)
def test_out_of_range_numbers_are_refused(
    tokens: int, slots: int, error: type[errors.InvalidRequest], reason_field: str
) -> None:
    """Contexts under 256 tokens, absurd contexts and slots outside 0..64 are refused by field."""
    with pytest.raises(error) as caught:
        size_context(model_with(VLLM), LLAMA_31_8B, tokens=tokens, slots=slots, inventory=H100)
    assert caught.value.field == reason_field


def test_context_over_trained_is_refused_with_the_trained_length() -> None:
    """A context past what the model was trained for is refused, naming the trained length."""
    with pytest.raises(errors.ContextOverTrained) as caught:
        size_context(model_with(VLLM), QWEN25_7B, tokens=32_769, slots=0, inventory=H100)
    assert caught.value.trained == 32_768
    assert "32768" in caught.value.message


@pytest.mark.parametrize(
    ("profile", "tokens", "slots", "want"),
    [
        (VLLM, 32_768, 0, ("--max-model-len", "32768")),
        (SGLANG, 32_768, 0, ("--context-length=32768",)),
        (TRTLLM, 32_768, 0, ("--max_seq_len", "32768")),
        (LLAMACPP, 4096, 0, ("-c", "8192", "-np", "2", "-ngl", "99")),
        (LLAMACPP, 4096, 3, ("-c", "12288", "-np", "3", "-ngl", "99")),
        # llama-server does not parse `--flag=value`: the planner writes it apart.
        (
            replace(LLAMACPP, args=("--ctx-size=8192", "--parallel=1")),
            4096,
            2,
            ("--ctx-size", "8192", "--parallel", "2"),
        ),
    ],
)
def test_engine_arguments_follow_the_context(
    profile: Profile, tokens: int, slots: int, want: tuple[str, ...]
) -> None:
    """Each engine's context flag is rewritten where it stood (llama.cpp: tokens × slots)."""
    change = size_context(
        model_with(profile), LLAMA_31_8B, tokens=tokens, slots=slots, inventory=H100
    )
    assert change.profiles[0].args == want
    assert change.updated[0].args == want
    assert change.profiles[0].args_before == profile.args


def test_one_card_engine_takes_no_context() -> None:
    """A profile whose engine takes no context this way is refused with ENGINE_NO_CONTEXT."""
    tei = Profile("emb", "tei", (), gpu_class="H100-80GB", gpus_per_node=1)
    with pytest.raises(errors.EngineNoContext):
        size_context(model_with(tei), LLAMA_31_8B, tokens=4096, slots=0, inventory=H100)


def test_unknown_engine_is_refused() -> None:
    """An engine the planner does not know is refused, not guessed."""
    odd = Profile("x", "mystery-engine", (), gpu_class="H100-80GB", gpus_per_node=1)
    with pytest.raises(errors.UnknownEngine):
        size_context(model_with(odd), LLAMA_31_8B, tokens=4096, slots=0, inventory=H100)


@pytest.mark.parametrize(
    ("old_context", "old_max", "tokens", "want"),
    [
        (8192, 0, 32_768, 8192),  # unset: a quarter of the new context
        (8192, 2048, 32_768, 8192),  # at the old default: follows
        (8192, 2048, 262_144, 32_768),  # capped at 32768
        (8192, 1000, 32_768, 1000),  # chosen by someone: kept
        (8192, 9000, 4096, 4096),  # never above the context
    ],
)
def test_max_output_follows_the_context_when_it_was_the_default(
    old_context: int, old_max: int, tokens: int, want: int
) -> None:
    """max_output follows the context when unset or at the old default, never past the context."""
    shape = replace(LLAMA_31_8B, trained_context=1 << 20)
    change = size_context(
        model_with(VLLM, context=old_context, max_output=old_max),
        shape,
        tokens=tokens,
        slots=0,
        inventory=H100,
    )
    assert change.max_output == want
    assert default_max_output(8192) == 2048


def test_unread_shape_goes_ahead_with_a_note() -> None:
    """Without a shape the arguments still change, memory is not checked, and a note says so."""
    change = size_context(
        model_with(VLLM),
        None,
        tokens=65_536,
        slots=0,
        inventory=H100,
        note="its header could not be read",
    )
    assert change.profiles[0].args == ("--max-model-len", "65536")
    assert change.profiles[0].need.card is None
    assert change.note == "its header could not be read"


def test_unknown_weights_are_noted_once() -> None:
    """A shape without weight sizes is not memory-checked, and the note says it once."""
    shape = replace(LLAMA_31_8B, weights_bytes=0)
    change = size_context(model_with(VLLM, SGLANG), shape, tokens=8192, slots=0, inventory=H100)
    assert change.note.count("sizes are not known") == 1


def test_memory_is_reported_in_bytes_and_for_people() -> None:
    """A fitting change carries per-card bytes under the budget and a human summary."""
    change = size_context(model_with(VLLM), LLAMA_31_8B, tokens=32_768, slots=0, inventory=H100)
    card = change.profiles[0].need.card
    assert card is not None
    assert card.weights_bytes == LLAMA_31_8B.weights_bytes
    assert card.kv_bytes >= 32_768 * 131_072
    assert 0 < card.per_card_bytes <= card.budget_bytes
    assert "GiB a card of 1" in change.profiles[0].after
    assert change.profiles[0].before  # the old context was sized too


def test_cards_too_small_names_longest_context_and_fewest_cards() -> None:
    """70B on one 24 GB card is refused with the need, the budget, and what would work."""
    p = Profile("gpu", "vllm", ("--max-model-len", "8192"), gpu_class="L4-24GB", gpus_per_node=1)
    model = replace(model_with(p), name="llama-70b")
    with pytest.raises(errors.CardsTooSmall) as caught:
        size_context(model, LLAMA_31_70B, tokens=8192, slots=0, inventory=L4)
    err = caught.value
    assert err.need_bytes > err.budget_bytes > 0
    assert err.cards == 1
    # 141 GB of weights do not fit four 24 GB cards either: no count of one L4 node holds it.
    assert err.fewest_cards == 0
    assert err.longest_context_tokens == 0
    assert "no context or card count" in err.message


def test_cards_too_small_finds_a_shorter_context_that_fits() -> None:
    """When a shorter context fits the same cards, the refusal names the longest one."""
    p = Profile("gpu", "vllm", ("--max-model-len", "8192"), gpu_class="L4-24GB", gpus_per_node=1)
    shape = replace(LLAMA_31_8B, weights_bytes=14 * (1 << 30))
    with pytest.raises(errors.CardsTooSmall) as caught:
        size_context(model_with(p), shape, tokens=131_072, slots=0, inventory=L4)
    err = caught.value
    assert 256 <= err.longest_context_tokens < 131_072
    assert err.longest_context_tokens % 256 == 0
    # and that context is accepted
    size_context(model_with(p), shape, tokens=err.longest_context_tokens, slots=0, inventory=L4)
    assert err.fewest_cards in (2, 4)


def test_cpu_profile_needs_ram_in_whole_gb() -> None:
    """A CPU profile's RAM is weights + KV + 1 GiB + 5 % of weights, rounded up to whole GB."""
    change = size_context(model_with(CPU), LLAMA_31_8B, tokens=8192, slots=1, inventory=H100)
    ram = change.profiles[0].need.ram_bytes
    weights = LLAMA_31_8B.weights_bytes
    assert ram >= weights + 8192 * 131_072 + (1 << 30) + weights // 20
    assert change.updated[0].min_memory_gb == -(-ram // 10**9)
    assert change.profiles[0].before == "20 GB of RAM"
    assert change.profiles[0].after == f"{change.updated[0].min_memory_gb} GB of RAM"


def test_a_refusals_longest_context_is_exactly_the_acceptance_edge() -> None:
    """The longest context a refusal names comes from the rule acceptance uses: it is accepted,
    256 tokens more is refused, and the margin's own figure is only said beside it."""
    p = Profile("gpu", "vllm", ("--max-model-len", "8192"), gpu_class="L4-24GB", gpus_per_node=1)
    shape = replace(LLAMA_31_8B, weights_bytes=14 * (1 << 30))
    with pytest.raises(errors.CardsTooSmall) as caught:
        size_context(model_with(p), shape, tokens=131_072, slots=0, inventory=L4)
    longest = caught.value.longest_context_tokens
    change = size_context(model_with(p), shape, tokens=longest, slots=0, inventory=L4)
    assert change.profiles[0].need.card is not None and change.profiles[0].need.card.fits
    with pytest.raises(errors.CardsTooSmall) as again:
        size_context(model_with(p), shape, tokens=longest + 256, slots=0, inventory=L4)
    assert again.value.longest_context_tokens == longest
    assert "with the figures' margin" in caught.value.message
