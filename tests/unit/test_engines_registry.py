"""Adding an engine is one module and one registry line: a test engine registered here is
planned with through the planner's domain and admitted by the agent's rules like the others."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from fleet_svc.agent.admission import ArgRules, refused_arg
from llmgw.engines import registry
from llmgw.engines.base import CardTotals, Overhead
from llmgw.engines.grammar import ADDRESS_FLAGS, Grammar, RefusedFlag
from llmgw.engines.kvcache import CachePool
from llmgw.engines.tensor_parallel import TensorParallelEngine
from llmgw.model import Inventory, Model, Node, Profile
from llmgw.shape import ModelShape
from planner_svc.domain import errors
from planner_svc.domain.context import size_context
from planner_svc.domain.gpus import plan_gpus
from tests.support.shapes import LLAMA_31_8B

GIB = 1 << 30
TOY_OVERHEAD_BYTES = 2 * GIB
TOY_RESERVE_BYTES = 4 * GIB
KV_TOKEN_BYTES = 32 * 8 * (128 + 128) * 2  # Llama-3.1-8B: layers × KV heads × (K + V) × f16


class Toy(TensorParallelEngine):
    """A tensor-parallel engine with its own flags, a plain pool, a fixed overhead and a
    budget of the card less a fixed reserve."""

    name = "toy"
    aliases = ("toy-server",)
    grammar = Grammar("toy", folds_underscores=True, joined_ok=True, abbreviates=False)
    refused_flags = (ADDRESS_FLAGS, RefusedFlag(("--exec", "-x"), "it runs a command"))
    context_flag = ("--context",)
    tp_flag = ("--shards", "-s")

    def pool(
        self, args: Sequence[str], *, tokens: int, sequences: int, card_memory_bytes: int
    ) -> CachePool:
        return CachePool(tokens, sequences)

    def overhead_and_budget(
        self,
        shape: ModelShape,
        args: Sequence[str],
        *,
        tokens: int,
        tp: int,
        pp: int,
        weights_card_bytes: int,
        card: CardTotals,
        engine_version: str,
    ) -> Overhead:
        return Overhead(
            budget_bytes=card.nvml_bytes - TOY_RESERVE_BYTES, other_bytes=TOY_OVERHEAD_BYTES
        )


@pytest.fixture(autouse=True)
def toy() -> Iterator[None]:
    """The toy engine, registered for one test."""
    registry.register(Toy())
    yield
    registry.unregister("toy")


def nodes(card_bytes: int) -> Inventory:
    """One node of eight cards of `card_bytes`."""
    return Inventory(nodes=(Node("a", "X-80GB", gpus=8, free_gpus=8, gpu_memory_bytes=card_bytes),))


def model(*args: str, cards: int = 1) -> Model:
    """A model at 4096 tokens with one toy profile."""
    profile = Profile("t", "Toy-Server", args, gpu_class="X-80GB", gpus_per_node=cards, tp=cards)
    return Model(name="m", source="hf://x/y", context_length=4096, profiles=(profile,))


def test_size_context_writes_the_toy_flag_and_sizes_its_cards() -> None:
    """SizeContext rewrites the toy's context flag and needs weights + KV + its overhead."""
    change = size_context(
        model("--context=4096", "-s", "1"),
        LLAMA_31_8B,
        tokens=16384,
        slots=0,
        inventory=nodes(80 * GIB),
    )
    assert change.updated[0].args == ("--context=16384", "-s", "1")
    need = change.profiles[0].need.card
    assert need is not None
    assert need.per_card_bytes == LLAMA_31_8B.weights_bytes + 16384 * KV_TOKEN_BYTES + 2 * GIB
    assert need.budget_bytes == 76 * GIB


def test_plan_gpus_splits_the_toy_by_heads() -> None:
    """PlanGPUs rewrites the toy's card flag in place and halves weights and KV on two cards;
    a count that does not split the heads is refused with the counts that do."""
    change = plan_gpus(
        model("--context", "4096", "-s", "1"),
        LLAMA_31_8B,
        gpus=2,
        profile="",
        inventory=nodes(80 * GIB),
    )
    (p,) = change.updated
    assert p.args == ("--context", "4096", "-s", "2")
    assert (p.gpus_per_node, p.tp) == (2, 2)
    need = change.profiles[0].need.card
    assert need is not None
    assert (
        need.per_card_bytes
        == -(-LLAMA_31_8B.weights_bytes // 2) + 4096 * KV_TOKEN_BYTES // 2 + 2 * GIB
    )
    with pytest.raises(errors.HeadsNotDivisible) as caught:
        plan_gpus(model("-s", "1"), LLAMA_31_8B, gpus=3, profile="", inventory=nodes(80 * GIB))
    assert caught.value.valid_counts == (1, 2, 4, 8)


def test_toy_cards_too_small_name_what_would_fit() -> None:
    """On cards its budget cannot hold, the toy's profile is refused with the fewest cards
    and the longest context its own rules allow."""
    card = 20 * GIB  # budget 16 GiB: the 15 GiB of weights and 2 GiB of overhead do not fit
    with pytest.raises(errors.CardsTooSmall) as caught:
        size_context(
            model("--context", "4096"), LLAMA_31_8B, tokens=8192, slots=0, inventory=nodes(card)
        )
    assert caught.value.fewest_cards == 2
    assert caught.value.longest_context_tokens == 0


def test_agent_refuses_the_toy_flags_in_its_spellings() -> None:
    """The agent's admission reads the toy's refused flags with its grammar."""
    assert refused_arg(["--exec", "id"], ArgRules("toy")) is not None
    assert refused_arg(["-x=id"], ArgRules("toy")) is not None
    assert refused_arg(["--port", "1"], ArgRules("toy")) is not None
    # It does not abbreviate: --exe is not read as --exec, and is on no list of the toy's.
    unlisted = refused_arg(["--exe", "id"], ArgRules("toy"))
    assert unlisted is not None and "--exec" not in unlisted and "allow-list" in unlisted
    assert refused_arg(["--context", "4096", "-s", "2"], ArgRules("toy")) is None


def test_unregistered_toy_is_unknown() -> None:
    """Once the toy is gone the planner refuses it as an unknown engine."""
    registry.unregister("toy")
    with pytest.raises(errors.UnknownEngine):
        plan_gpus(model("-s", "1"), LLAMA_31_8B, gpus=2, profile="", inventory=nodes(80 * GIB))
