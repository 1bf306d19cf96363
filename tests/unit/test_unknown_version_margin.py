"""An unknown vLLM version's margin, kept per setting and widened per context, against the
spread worked out whole; and sizing with every kept figure against a shape with none, over a
grid of contexts, versions and engines."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llmgw.cardclass import MIB
from llmgw.engines.base import SizingRequest
from llmgw.engines.torch_overhead import forward_cost
from llmgw.engines.vllm import GRAMMAR, VLLM
from llmgw.engines.vllm_memory import vllm_central_overhead
from llmgw.engines.vllm_offload import v0_offload_copy_bytes
from llmgw.engines.vllm_peak import (
    EXPERT_PARALLEL,
    batch_flags,
    mm_inputs,
    profile_at,
    profile_peak,
)
from llmgw.engines.vllm_rules import UNKNOWN_VERSION_NOTE, VLLM_RULES
from llmgw.model import Inventory, Model, Node, Profile
from llmgw.shape import ModelShape
from planner_svc.domain.cards import card_of
from planner_svc.domain.context import size_context
from planner_svc.domain.memory import card_need
from planner_svc.rpc.convert import context_change_to_proto
from tests.support.shapes import LLAMA_31_8B

GIB = 1 << 30
H100 = Inventory(
    nodes=(Node("n1", "H100-80GB", gpus=8, free_gpus=8, gpu_memory_bytes=81559 * MIB),)
)
L4 = Inventory(nodes=(Node("n1", "L4", gpus=4, free_gpus=4, gpu_memory_bytes=23034 * MIB),))

# Both sides of V0's thresholds: the large card's 8,192 batched tokens, V0's chunked prefill
# from 32,768 on, and the small card's 2,048.
CONTEXTS = [1024, 2048, 2049, 4096, 8192, 8193, 12_345, 16384, 32768, 32769, 65536, 131072]


def fresh() -> ModelShape:
    """Llama-3.1-8B as a shape of its own: nothing kept for it yet."""
    return replace(LLAMA_31_8B, trained_context=0)


def spread_whole(
    shape: ModelShape, args: tuple[str, ...], tokens: int, tp: int, card: object
) -> int:
    """The spread of every range's peak and non-torch memory (and V0's offload copy) for a
    context of `tokens`, worked out range by range with nothing kept: its definition."""
    flags = batch_flags(GRAMMAR, args, card)  # type: ignore[arg-type]
    forward = forward_cost(shape, tp=tp, expert_parallel=GRAMMAR.has(args, EXPERT_PARALLEL))
    mm = mm_inputs(GRAMMAR, args)
    figures = []
    for rules in VLLM_RULES:
        profile = profile_at(rules, "", flags, tokens)
        peak = profile_peak(shape, forward, profile, rules, tp, mm)[0]
        copied = v0_offload_copy_bytes(GRAMMAR, shape, args, tp, 1) if rules.v0 else 0
        figures.append(peak + rules.non_torch_bytes + copied)
    return max(figures) - min(figures)


@pytest.mark.parametrize("version", ["", "nightly"])
@pytest.mark.parametrize(
    ("extra", "cards", "inventory"),
    [
        ((), 1, H100),
        (("--no-enable-chunked-prefill",), 1, H100),
        (("--enable-chunked-prefill",), 1, H100),
        (("--max-num-batched-tokens", "4096", "--max-num-seqs", "64"), 1, H100),
        (("-tp", "2"), 2, H100),
        (("--cpu-offload-gb", "4"), 1, H100),
        ((), 1, L4),
    ],
)
def test_unknown_version_margin_is_the_spread_worked_out_whole(
    version: str, extra: tuple[str, ...], cards: int, inventory: Inventory
) -> None:
    """A version in no range gets its range's central figures with every range's spread added
    to the margin and said in the rules, exactly as working the spread out whole for that
    context gives it, for contexts asked rising then falling on one shape (so a figure kept
    for one context would show in another's answer); and the engine's own overhead, asked of
    a shape with nothing kept, agrees."""
    warm = fresh()
    card = card_of(inventory.nodes[0].gpu_class, inventory)
    for tokens in [*CONTEXTS, *reversed(CONTEXTS)]:
        args = ("--max-model-len", str(tokens), *extra)
        asked = SizingRequest(
            args=args,
            tokens=tokens,
            slots=1,
            cards=cards,
            card_memory_bytes=card.nvml_bytes,
            card=card,
            engine_version=version,
        )
        need = card_need("vllm", warm, asked)
        tp = cards
        central = vllm_central_overhead(
            GRAMMAR, fresh(), args, tokens=tokens, tp=tp, pp=1, card=card, engine_version=version
        )
        spread = spread_whole(fresh(), args, tokens, tp, card)
        assert need.margin_bytes == central.margin_bytes + spread, tokens
        assert (
            need.rules == f"{central.rules}; {UNKNOWN_VERSION_NOTE} ({spread / GIB:.2f} GiB more)"
        )
        whole = VLLM.overhead_and_budget(
            fresh(),
            args,
            tokens=tokens,
            tp=tp,
            pp=1,
            weights_card_bytes=need.weights_per_card_bytes,
            card=card,
            engine_version=version,
        )
        assert (need.margin_bytes, need.rules, need.overhead_bytes) == (
            whole.margin_bytes,
            whole.rules,
            whole.total_bytes,
        ), tokens


# (engine, its context flag's arguments, versions to ask at: none named, in ranges, in none)
ENGINES = [
    ("vllm", ("--max-model-len", "8192"), ["", "0.7.2", "0.10.2", "0.31.0", "9.9", "nightly"]),
    ("vllm", ("--max-model-len", "8192", "--no-enable-chunked-prefill"), ["", "0.7.2", "nightly"]),
    ("sglang", ("--context-length", "8192"), ["", "0.4.6"]),
    ("trtllm", ("--max_seq_len", "8192"), ["", "0.20.0"]),
]


@pytest.mark.parametrize(("engine", "args", "versions"), ENGINES)
def test_size_context_with_kept_figures_equals_a_shape_with_none(
    engine: str, args: tuple[str, ...], versions: list[str]
) -> None:
    """Over a grid of contexts and versions, sizing one shape context after context (every
    per-setting figure kept and reused) answers exactly, down to the message, what a shape
    with nothing kept answers for each context."""
    for version in versions:
        profile = Profile("gpu", engine, args, gpu_class="H100-80GB", engine_version=version)
        model = Model(name="llama-8b", context_length=8192, profiles=(profile,))
        warm = fresh()
        for tokens in [*CONTEXTS, *reversed(CONTEXTS)]:
            kept = size_context(model, warm, tokens=tokens, slots=0, inventory=H100)
            cold = size_context(model, fresh(), tokens=tokens, slots=0, inventory=H100)
            assert kept == cold, (version, tokens)
            assert context_change_to_proto(kept) == context_change_to_proto(cold)
