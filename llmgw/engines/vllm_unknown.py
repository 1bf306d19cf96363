"""The margin of a vLLM version in no known range: the central figures are the newest range's,
and the margin is widened by the spread of every range's profiling peak and non-torch memory
for the same settings (V0's batch follows the context when chunked prefill is off, V1's does
not). Kept apart from `vllm_memory`, which works out one range's figures.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace

from llmgw.cardclass import GIB
from llmgw.engines.base import CardTotals, Overhead
from llmgw.engines.grammar import Grammar
from llmgw.engines.memo import memo_table
from llmgw.engines.torch_overhead import ForwardCost, forward_cost
from llmgw.engines.vllm_offload import v0_offload_copy_bytes
from llmgw.engines.vllm_peak import (
    EXPERT_PARALLEL,
    BatchFlags,
    MmInputs,
    batch_flags,
    mm_inputs,
    profile_at,
    profile_peak,
)
from llmgw.engines.vllm_rules import UNKNOWN_VERSION_NOTE, VLLM_RULES, VllmRules
from llmgw.frozen import made
from llmgw.shape import ModelShape

SPREADS_KEPT = 64
"""Spreads kept per shape: the per-setting parts and the per-batch figures together."""

CONTEXT_FLAG = "--max-model-len"


def without_context(args: Sequence[str]) -> tuple[str, ...]:
    """`args` with the value of `--max-model-len` (as the planner writes it: `--max-model-len
    N` or `--max-model-len=N`) left out; other spellings stay, so they only miss the memo."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg == CONTEXT_FLAG and i + 1 < len(out) and not out[i + 1].startswith("-"):
            out[i + 1] = ""
        elif arg.startswith(CONTEXT_FLAG + "="):
            out[i] = CONTEXT_FLAG + "="
    return tuple(out)


def widen_unknown_margin(
    grammar: Grammar,
    shape: ModelShape,
    args: Sequence[str],
    over: Overhead,
    *,
    tokens: int,
    tp: int,
    pp: int,
    card: CardTotals,
) -> Overhead:
    """`over` (the central figures of a version in no known range) with the spread of every
    range's peak and non-torch memory (`_unknown_spread`) added to its margin, and said."""
    spread = _unknown_spread(grammar, shape, args, tokens=tokens, tp=tp, pp=pp, card=card)
    return made(
        Overhead,
        **{
            **over.__dict__,
            "margin_bytes": over.margin_bytes + spread,
            "rules": f"{over.rules}; {UNKNOWN_VERSION_NOTE} ({spread / GIB:.2f} GiB more)",
        },
    )


def unknown_margin_tokens(
    grammar: Grammar, args: Sequence[str], *, card: CardTotals
) -> Callable[[int], Hashable]:
    """What of a context `widen_unknown_margin` reads under `args` on `card`: the batch V0
    would profile (every other range's batch is the context's only when chunked prefill is
    off, and then V0's is too)."""
    flags = batch_flags(grammar, args, card)

    def v0_batch(tokens: int) -> Hashable:
        v0 = profile_at(VLLM_RULES[0], "", flags, tokens)
        return (v0.batched_tokens, v0.chunked_prefill)

    return v0_batch


@dataclass(frozen=True)
class _SpreadSetting:
    """What `_unknown_spread` reads that no context changes, for one setting: the batch flags,
    the forward pass's cost, the multimodal inputs, V0's offload copy, and (with chunked
    prefill allowed) the lowest and highest figure of the V1 ranges, whose batch no context
    moves."""

    flags: BatchFlags
    forward: ForwardCost
    mm: MmInputs
    copied: int
    newer: tuple[int, int] | None


def _spread_figure(
    shape: ModelShape, setting: _SpreadSetting, rules: VllmRules, tp: int, tokens: int
) -> int:
    """One range's peak and non-torch memory (and V0's offload copy) for a context of
    `tokens`: what the spread is taken over. Model Runner V2's penalty counts, which follow the
    requests, stay out: the central figure (the newest range's, V2's) holds them, and a range
    without them needs less."""
    profile = profile_at(rules, "", setting.flags, tokens)
    peak = profile_peak(shape, setting.forward, profile, rules, tp, setting.mm)[0]
    return peak + rules.non_torch_bytes + (setting.copied if rules.v0 else 0)


_V0_RULES = tuple(rules for rules in VLLM_RULES if rules.v0)
_V1_RULES = tuple(rules for rules in VLLM_RULES if not rules.v0)


def _unknown_spread(
    grammar: Grammar,
    shape: ModelShape,
    args: Sequence[str],
    *,
    tokens: int,
    tp: int,
    pp: int,
    card: CardTotals,
) -> int:
    """The spread of every range's peak and non-torch memory for these settings: the margin
    a version in no known range carries (each range with its own batch: V0 profiles the whole
    context when chunked prefill is off).

    What no context changes is worked out once per setting (`_SpreadSetting`, kept per shape
    under the arguments less the context, the card and the parallel sizes); a context then
    costs V0's ranges' figures at the batch V0 would profile (all of the ranges' when chunked
    prefill is off), kept under that batch."""
    kept = memo_table(shape, "vllm_spreads")
    setting_key = (without_context(args), card, tp, pp)
    setting = kept.get(setting_key)
    if not isinstance(setting, _SpreadSetting):
        setting = kept[setting_key] = _spread_setting(grammar, shape, args, tp=tp, pp=pp, card=card)
    v0 = profile_at(VLLM_RULES[0], "", setting.flags, tokens)
    key = (setting_key, v0.batched_tokens, v0.chunked_prefill)
    spread = kept.get(key)
    if isinstance(spread, int):
        return spread
    if setting.newer is None:
        figures = [_spread_figure(shape, setting, rules, tp, tokens) for rules in VLLM_RULES]
    else:
        figures = [*setting.newer]
        figures.extend(_spread_figure(shape, setting, rules, tp, tokens) for rules in _V0_RULES)
    kept[key] = spread = max(figures) - min(figures)
    while len(kept) > SPREADS_KEPT:
        kept.popitem(last=False)
    return spread


def _spread_setting(
    grammar: Grammar, shape: ModelShape, args: Sequence[str], *, tp: int, pp: int, card: CardTotals
) -> _SpreadSetting:
    """`_unknown_spread`'s part that no context changes (`_SpreadSetting`)."""
    flags = batch_flags(grammar, args, card)
    setting = _SpreadSetting(
        flags=flags,
        forward=forward_cost(shape, tp=tp, expert_parallel=grammar.has(args, EXPERT_PARALLEL)),
        mm=mm_inputs(grammar, args),
        copied=v0_offload_copy_bytes(grammar, shape, args, tp, pp),
        newer=None,
    )
    if flags.no_chunked:
        return setting
    # With chunked prefill allowed only V0's batch follows the context (V1 profiles its
    # batched tokens whatever the context): the V1 ranges' figures are the same for any.
    ones = [_spread_figure(shape, setting, rules, tp, 0) for rules in _V1_RULES]
    return replace(setting, newer=(min(ones), max(ones)))
