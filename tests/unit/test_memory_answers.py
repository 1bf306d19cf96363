"""What a memory answer says: card totals as each engine reads them, the engine version's rules,
the breakdown per card, the KV pool and its capacity, the margin and the verdict, CPU profiles
broken down like cards, KV figures without weights."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmgw.cardclass import DRIVER_RESERVE_MIB, DRIVER_RESERVE_SPREAD_MIB, MIB, cuda_total
from llmgw.common.v1 import common_pb2
from llmgw.engines.base import CardNeed, CardTotals, SizingRequest, Verdict
from llmgw.engines.memo import sizing_memo
from llmgw.engines.versions import parse_version, pick
from llmgw.engines.vllm import VLLM
from llmgw.engines.vllm_rules import VLLM_RULES
from llmgw.model import Inventory, Model, Node, Profile
from planner_svc.domain.cards import card_of
from planner_svc.domain.context import size_context
from planner_svc.domain.fit import NEEDS_KEPT, measure
from planner_svc.domain.memory import card_need
from planner_svc.rpc.convert import context_change_to_proto
from tests.support.shapes import LLAMA_31_8B

GIB = 1 << 30
H100 = Inventory(
    nodes=(Node("n1", "H100-80GB", gpus=8, free_gpus=8, gpu_memory_bytes=81559 * MIB),)
)


def llama() -> Model:
    """Llama-3.1-8B with a vLLM and a CPU profile."""
    return Model(
        name="llama-8b",
        context_length=8192,
        profiles=(
            Profile("gpu", "vllm", ("--max-model-len", "8192"), gpu_class="H100-80GB"),
            Profile("cpu", "llamacpp", ("--ctx-size", "8192"), cpu_only=True),
        ),
    )


def test_card_totals_as_nvml_and_cuda_report_them() -> None:
    """A known card's CUDA total is its logged one; an unknown card's is NVML's less the driver
    reserve, with a margin; a node's report wins."""
    h100 = cuda_total("H100-80GB", 81559 * MIB)
    assert h100.bytes == 81090 * MIB and "79.19" in h100.source and h100.margin_bytes == 0
    rtx4090 = cuda_total("RTX4090-24GB", 24564 * MIB)
    assert rtx4090.bytes == (24564 - DRIVER_RESERVE_MIB) * MIB
    assert rtx4090.margin_bytes == DRIVER_RESERVE_SPREAD_MIB * MIB
    l4 = cuda_total("L4-24GB", 23034 * MIB)
    assert l4.bytes == 22579 * MIB and "22.05" in l4.source and l4.margin_bytes == 0
    assert cuda_total("H100-80GB", 81559 * MIB, 81000 * MIB).bytes == 81000 * MIB
    reported = Inventory(
        nodes=(
            Node("a", "X-96GB", gpus=1, gpu_memory_bytes=96 * GIB, gpu_cuda_memory_bytes=95 * GIB),
        )
    )
    assert card_of("X-96GB", reported) == CardTotals(
        "X-96GB", 96 * GIB, 95 * GIB, "reported by the node"
    )


def test_versions_pick_their_rules() -> None:
    """Versions as profiles write them; an absent or unknown one takes the newest rules."""
    assert parse_version("0.9.1.dev705+g01220ce89") == (0, 9, 1)
    assert parse_version("v0.31.0") == (0, 31, 0)
    assert parse_version("V0") == (0, 0, 0)
    assert parse_version("latest") is None
    assert pick(VLLM_RULES, "0.10.2")[0].utilisation == 0.90
    assert pick(VLLM_RULES, "0.21.0")[0].utilisation == 0.92
    rules, said = pick(VLLM_RULES, "nightly")
    assert rules is VLLM_RULES[-1] and "newest" in said


def test_verdict_follows_the_margin() -> None:
    """Fits with the margin, fits only within it, does not fit, or not checked."""
    need = CardNeed(0, 0, 90, 0, 100, 1, margin_bytes=5)
    assert need.verdict is Verdict.FITS
    assert replace(need, margin_bytes=20).verdict is Verdict.WITHIN_MARGIN
    assert replace(need, per_card_bytes=101).verdict is Verdict.DOES_NOT_FIT
    assert replace(need, budget_bytes=0).verdict is Verdict.NOT_CHECKED
    assert replace(need, weights_known=False).verdict is Verdict.NOT_CHECKED
    outside = replace(need, outside_bytes=11, outside_room_bytes=10)
    assert outside.verdict is Verdict.DOES_NOT_FIT


def test_the_verdict_moves_through_the_margin_as_the_context_grows() -> None:
    """Over growing contexts a vLLM card goes fits → within the margin → does not fit, never
    back; the pool and its capacity stay as vLLM sizes them at start."""
    verdicts = []
    for tokens in range(256, 600_000, 4096):
        need = card_need(
            "vllm",
            LLAMA_31_8B,
            SizingRequest(
                args=("--max-model-len", str(tokens)),
                tokens=tokens,
                slots=1,
                cards=1,
                card_memory_bytes=81559 * MIB,
                card=CardTotals.of("H100-80GB", 81559 * MIB),
            ),
        )
        verdicts.append(need.verdict)
        assert need.kv_pool_bytes == need.budget_bytes - need.weights_per_card_bytes - (
            need.overhead_bytes
        )
    order = [Verdict.FITS, Verdict.WITHIN_MARGIN, Verdict.DOES_NOT_FIT]
    seen = [v for i, v in enumerate(verdicts) if i == 0 or v is not verdicts[i - 1]]
    assert seen == order


def test_memory_answer_carries_the_breakdown_and_capacity() -> None:
    """SizeContext's Memory: the fullest card's parts add up, the pool's capacity and
    concurrency at the asked context, the rules applied; the CPU profile broken down too."""
    change = size_context(llama(), LLAMA_31_8B, tokens=32_768, slots=1, inventory=H100)
    msg = context_change_to_proto(change)
    gpu, cpu = msg.profiles[0].memory, msg.profiles[1].memory
    parts = (
        gpu.weights_per_card_bytes
        + gpu.kv_per_card_bytes
        + gpu.activation_bytes
        + gpu.non_torch_bytes
        + gpu.cuda_graph_bytes
        + gpu.other_bytes
    )
    assert parts == gpu.per_card_bytes
    assert gpu.kv_pool_bytes == gpu.budget_bytes - (gpu.per_card_bytes - gpu.kv_per_card_bytes)
    assert gpu.kv_token_capacity == gpu.kv_pool_bytes // (16 * 131_072) * 16
    assert gpu.max_concurrency == pytest.approx(gpu.kv_token_capacity / 32_768)
    assert gpu.verdict == common_pb2.FIT_VERDICT_FITS
    assert gpu.card_total_bytes == 81090 * MIB and "79.19" in gpu.rules
    assert "no version named" in gpu.rules
    assert cpu.weights_bytes + cpu.kv_bytes + cpu.other_bytes == cpu.ram_bytes
    assert cpu.kv_bytes == 32_768 * 131_072


def test_a_named_version_changes_the_rules() -> None:
    """A profile naming vLLM 0.10.2 gets 0.90 of the card, the newest rules 0.92."""
    model = llama()
    old = replace(model.profiles[0], engine_version="0.10.2")
    change = size_context(
        replace(model, profiles=(old,)), LLAMA_31_8B, tokens=8192, slots=1, inventory=H100
    )
    memory = context_change_to_proto(change).profiles[0].memory
    assert memory.budget_bytes == int(81090 * MIB * 0.9)
    assert "0.10.2" in memory.rules


def test_kv_is_answered_without_weights() -> None:
    """With the files' sizes unknown the memory is not checked, but the KV figures and the
    pool the budget leaves before any weights come back, flagged."""
    shape = replace(LLAMA_31_8B, weights_bytes=0)
    change = size_context(llama(), shape, tokens=16_384, slots=1, inventory=H100)
    msg = context_change_to_proto(change)
    gpu, cpu = msg.profiles[0].memory, msg.profiles[1].memory
    assert gpu.kv_bytes == gpu.kv_per_card_bytes == 16_384 * 131_072
    assert gpu.verdict == common_pb2.FIT_VERDICT_NOT_CHECKED
    assert gpu.weights_unknown and gpu.weights_bytes == 0
    assert gpu.kv_pool_bytes == gpu.budget_bytes - gpu.overhead_bytes  # before any weights
    assert gpu.kv_token_capacity > 0 and cpu.weights_unknown
    assert cpu.kv_bytes == 16_384 * 131_072
    assert "not checked" in change.note
    assert change.updated[1].min_memory_gb == 0  # not rewritten from a figure without weights


def test_within_the_margin_is_said() -> None:
    """A context that fits only within the margin is accepted, and the note says what could
    go either way."""
    for tokens in range(300_000, 520_000, 2048):
        need = card_need(
            "vllm",
            LLAMA_31_8B,
            SizingRequest(
                args=("--max-model-len", str(tokens)),
                tokens=tokens,
                slots=1,
                cards=1,
                card_memory_bytes=81559 * MIB,
                card=CardTotals.of("H100-80GB", 81559 * MIB),
            ),
        )
        if need.verdict is Verdict.WITHIN_MARGIN:
            break
    else:
        raise AssertionError("no context fits only within the margin")
    trained = replace(LLAMA_31_8B, trained_context=0)
    change = size_context(llama(), trained, tokens=tokens, slots=1, inventory=H100)
    assert "fits only within the margin" in change.note
    memory = context_change_to_proto(change).profiles[0].memory
    assert memory.verdict == common_pb2.FIT_VERDICT_WITHIN_MARGIN
    assert "could go either way" in memory.verdict_note or "may refuse" in memory.verdict_note


def node(name: str, versions: tuple[tuple[str, str], ...], cuda_bytes: int = 0) -> Node:
    """An H100 node that reports the engine versions it runs (and its CUDA total)."""
    return Node(
        name,
        "H100-80GB",
        gpus=8,
        free_gpus=8,
        gpu_memory_bytes=81559 * MIB,
        gpu_cuda_memory_bytes=cuda_bytes,
        engine_versions=versions,
    )


def gpu_memory(model: Model, inventory: Inventory) -> common_pb2.Memory:
    """The GPU profile's memory at 8192 tokens against `inventory`."""
    change = size_context(model, LLAMA_31_8B, tokens=8192, slots=1, inventory=inventory)
    return context_change_to_proto(change).profiles[0].memory


def test_a_profile_naming_no_version_takes_its_nodes_version() -> None:
    """Without a version of its own a profile is sized by the rules of the vLLM its nodes
    report (0.10.2: 0.90 of the card), and the rules say where the version came from."""
    memory = gpu_memory(llama(), Inventory(nodes=(node("n1", (("vllm", "0.10.2"),)),)))
    assert memory.budget_bytes == int(81090 * MIB * 0.9)
    assert "0.8 to 0.10" in memory.rules and "what the H100-80GB nodes run" in memory.rules


def test_the_profiles_own_version_wins_and_mixed_nodes_take_the_oldest() -> None:
    """A profile's version wins over its nodes'; nodes that differ give the oldest's rules."""
    mixed = Inventory(
        nodes=(
            node("n1", (("vllm", "0.21.0"),)),
            node("n2", (("vllm", "0.10.2"), ("sglang", "0.4"))),
        )
    )
    assert gpu_memory(llama(), mixed).budget_bytes == int(81090 * MIB * 0.9)
    named = replace(llama().profiles[0], engine_version="0.21.0")
    memory = gpu_memory(replace(llama(), profiles=(named,)), mixed)
    assert memory.budget_bytes == int(81090 * MIB * 0.92)
    assert "nodes run" not in memory.rules


def test_the_nodes_reported_cuda_total_starts_the_budget() -> None:
    """A CUDA total the node reported is the one vLLM's budget starts from, said so."""
    memory = gpu_memory(llama(), Inventory(nodes=(node("n1", (), cuda_bytes=81000 * MIB),)))
    assert memory.card_total_bytes == 81000 * MIB
    assert memory.budget_bytes == int(81000 * MIB * 0.92)
    assert "reported by the node" in memory.rules


def test_needs_kept_with_the_shape_are_bounded_and_never_answer_a_new_context() -> None:
    """A need measured again comes from the shape's memory, a context not measured before is
    computed (its own KV), and the memory keeps at most NEEDS_KEPT needs."""
    shape = replace(LLAMA_31_8B, trained_context=0)  # a shape of its own, nothing kept yet
    profile = llama().profiles[0]

    def kv_at(tokens: int) -> int:
        args = ("--max-model-len", str(tokens))
        return measure(
            VLLM, profile, shape, H100, args=args, tokens=tokens, slots=1, cards=1
        ).need.kv_bytes

    assert kv_at(8192) == kv_at(8192) == 8192 * 131_072
    for tokens in range(1024, 1024 + 64 * (NEEDS_KEPT + 8), 64):
        assert kv_at(tokens) == tokens * 131_072
    assert len(sizing_memo(shape)["needs"]) == NEEDS_KEPT  # type: ignore[arg-type]


@pytest.mark.parametrize("version", ["", "0.6.3", "0.7.2", "0.10.2", "0.19.0", "0.31.0", "9.9"])
@pytest.mark.parametrize(
    "extra", [(), ("--no-enable-chunked-prefill",), ("--enable-chunked-prefill",)]
)
def test_overheads_kept_per_setting_answer_every_context_as_a_new_shape_does(
    version: str, extra: tuple[str, ...]
) -> None:
    """The overhead, pool and capacity kept per shape and setting (`overhead_tokens`) give
    each context the need a shape with nothing kept gives it: every version range (V0, whose
    profiling batch follows the context, and one in no range, whose margin spans V0's), with
    chunked prefill on, off and unsaid, at contexts on both sides of V0's thresholds, asked
    rising and then falling so a kept figure would answer the wrong context."""
    warm = replace(LLAMA_31_8B, trained_context=0)
    card = card_of("H100-80GB", H100)
    contexts = [1024, 2048, 4096, 8192, 8448, 16384, 32768, 33024, 65536, 131072]
    for tokens in [*contexts, *reversed(contexts), 8192, 33024]:
        asked = SizingRequest(
            args=("--max-model-len", str(tokens), *extra),
            tokens=tokens,
            slots=1,
            cards=1,
            card_memory_bytes=card.nvml_bytes,
            card=card,
            engine_version=version,
        )
        cold = replace(LLAMA_31_8B, trained_context=0)  # nothing kept for it
        assert card_need("vllm", warm, asked) == card_need("vllm", cold, asked), tokens


def test_a_profile_as_it_stands_is_kept_and_every_context_sized_as_without() -> None:
    """size_context keeps a profile as it stands (its need before, the arguments a context is
    written into) per shape: answers for contexts asked one after another are those of a
    shape with nothing kept, the need before the same value each time."""
    model = llama()
    warm = replace(LLAMA_31_8B, trained_context=0)
    befores = []
    for tokens in (4096, 16384, 2048, 16384, 100_000):
        change = size_context(model, warm, tokens=tokens, slots=0, inventory=H100)
        cold = size_context(
            model, replace(LLAMA_31_8B, trained_context=0), tokens=tokens, slots=0, inventory=H100
        )
        assert change == cold
        assert context_change_to_proto(change) == context_change_to_proto(cold)
        befores.append(change.profiles[0].need_before)
    assert all(b is befores[0] for b in befores)
    assert befores[0].card is not None and befores[0].card.kv_bytes == 8192 * 131_072


def test_a_shape_whose_profiles_were_kept_as_they_stand_is_still_collected() -> None:
    """What the shape's memo keeps does not hold the shape (an inline shape's model holds it,
    so the memo keeps no model): once nothing else does, the shape and its memo go."""
    import gc
    import weakref

    from llmgw.engines import memo

    shape = replace(LLAMA_31_8B, trained_context=0)
    model = replace(llama(), shape=shape)
    for tokens in (4096, 16384):
        size_context(model, shape, tokens=tokens, slots=0, inventory=H100)
    assert id(shape) in memo._MEMOS
    gone = weakref.ref(shape)
    key = id(shape)
    del shape, model
    gc.collect()
    assert gone() is None
    assert key not in memo._MEMOS
