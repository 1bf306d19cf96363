"""Fitting a profile on cards: its need at a context and card count, and the search for
the longest context and the fewest cards that fit."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from llmgw.engines.base import CardNeed, Engine
from llmgw.engines.memo import memo_table
from llmgw.engines.versions import parse_version
from llmgw.frozen import made
from llmgw.model import Inventory, Profile
from llmgw.shape import ModelShape
from planner_svc.domain.cards import GIB, card_of
from planner_svc.domain.memory import SizingRequest, card_need

MIN_CONTEXT_TOKENS = 256
"""The shortest context the planner accepts (the reference's SetContext rule)."""

DEFAULT_MAX_CARDS = 8
"""Cards per node assumed when the inventory has no node of a profile's class."""


@dataclass(frozen=True)
class Fit:
    """A profile's need on some cards, and whether it fits."""

    need: CardNeed

    @property
    def fits(self) -> bool:
        """Whether the fullest card holds it at the central figures (an unknown budget is
        taken as room)."""
        return self.need.fits

    @property
    def fits_safely(self) -> bool:
        """Whether it holds with every fitted figure at the far end of its margin."""
        return self.need.fits_with_margin


def measure(
    engine: Engine,
    profile: Profile,
    shape: ModelShape,
    inventory: Inventory,
    *,
    args: Sequence[str],
    tokens: int,
    slots: int,
    cards: int,
) -> Fit:
    """The need of `profile` served with `args` (already set for `tokens`/`slots`) on
    `cards` cards of its class.

    A need is a pure function of these, so the last few are kept with the shape (bounded,
    `NEEDS_KEPT`): a change sizes the profile as it stands as well as at the new context, and
    the profile as it stands is the same for every context asked of it; a context not
    measured before is computed."""
    card = card_of(profile.gpu_class, inventory)
    version = engine_version(engine, profile, inventory)
    from_nodes = bool(version) and not profile.engine_version.strip()
    key = (engine.name, tuple(args), tokens, slots, cards, card, version, from_nodes)
    kept = _needs_of(shape)
    need = kept.get(key)
    if need is not None:
        kept.move_to_end(key)
        return Fit(need)
    asked = made(
        SizingRequest,
        args=key[1],
        tokens=tokens,
        slots=slots,
        cards=cards,
        card_memory_bytes=card.nvml_bytes,
        card=card,
        engine_version=version,
    )
    need = card_need(engine.name, shape, asked)
    if from_nodes:
        need = replace(
            need, rules=f"{need.rules}; {version} is what the {profile.gpu_class} nodes run"
        )
    small = len(need.devices) <= NEEDS_DEVICES_KEPT and len(asked.args) <= NEEDS_ARGS_KEPT
    if small and sum(map(len, asked.args)) <= NEEDS_ARGS_CHARS_KEPT:
        kept[key] = need
        while len(kept) > NEEDS_KEPT:
            kept.popitem(last=False)
    return Fit(need)


def engine_version(engine: Engine, profile: Profile, inventory: Inventory) -> str:
    """The engine version whose rules size `profile`: the one it names, else the one the nodes
    of its class report running (the oldest, when they differ: by their version numbers, a
    replica may land on any of them), else "" (the newest rules known)."""
    if profile.engine_version.strip():
        return profile.engine_version
    if not inventory.reports_versions:
        return ""
    names = (engine.name, *engine.aliases)
    reported = {v for name in names for v in inventory.engine_versions(profile.gpu_class, name)}
    if not reported:
        return ""
    return min(reported, key=lambda v: (parse_version(v) or (1 << 30, 0, 0), v))


NEEDS_KEPT = 32
"""Needs kept per shape (the profiles as they stand, and the last contexts measured)."""

NEEDS_ARGS_KEPT = 64
NEEDS_ARGS_CHARS_KEPT = 4096
NEEDS_DEVICES_KEPT = 64
"""Needs of argument lists longer than these, or placed on more devices, are not kept (the
memory held stays bounded: at most NEEDS_KEPT small needs a shape)."""


def _needs_of(shape: ModelShape) -> OrderedDict[object, CardNeed]:
    """The needs kept with `shape` (in its `sizing_memo`, `llmgw.engines.memo`)."""
    return memo_table(shape, "needs")


def longest_context(
    engine: Engine,
    profile: Profile,
    shape: ModelShape,
    inventory: Inventory,
    *,
    args: Sequence[str],
    slots: int,
    cards: int,
    limit_tokens: int,
    with_margin: bool = False,
) -> int:
    """The longest context (in tokens per request, a multiple of 256) that fits on `cards`
    cards, at most `limit_tokens`, by the rule acceptance uses (`Fit.fits`: the central
    figures); 0 when not even the shortest fits.

    `with_margin` asks instead for the longest that fits with every fitted figure at the far
    end of its margin (`Fit.fits_safely`), the figure a refusal reports beside the first."""
    return _longest(
        engine, profile, shape, inventory, args, slots, cards, limit_tokens, with_margin
    )


def _longest(
    engine: Engine,
    profile: Profile,
    shape: ModelShape,
    inventory: Inventory,
    args: Sequence[str],
    slots: int,
    cards: int,
    limit_tokens: int,
    with_margin: bool,
) -> int:
    def fits(tokens: int) -> bool:
        trial = engine.with_context(args, tokens, slots)
        fit = measure(
            engine, profile, shape, inventory, args=trial, tokens=tokens, slots=slots, cards=cards
        )
        return fit.fits_safely if with_margin else fit.fits

    step = MIN_CONTEXT_TOKENS
    hi = max(limit_tokens // step, 1)
    if not fits(step):
        return 0
    if fits(hi * step):
        return hi * step
    lo = 1  # fits
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid * step):
            lo = mid
        else:
            hi = mid
    return lo * step


def card_counts(
    engine: Engine, shape: ModelShape | None, largest: int, args: Sequence[str] = ()
) -> list[int]:
    """The card counts a replica of this engine may use on a node of `largest` cards
    (`DEFAULT_MAX_CARDS` when no node of the class is known), served with `args`."""
    return engine.card_counts(shape, largest if largest > 0 else DEFAULT_MAX_CARDS, args)


def fewest_cards(
    engine: Engine,
    profile: Profile,
    shape: ModelShape,
    inventory: Inventory,
    *,
    args: Sequence[str],
    tokens: int,
    slots: int,
) -> int:
    """The fewest cards of a valid count (on one node of the class) that hold `tokens`;
    0 when no count there does."""
    largest = inventory.largest_count(profile.gpu_class)
    for n in card_counts(engine, shape, largest, args):
        trial = engine.with_cards(args, n)
        if measure(
            engine, profile, shape, inventory, args=trial, tokens=tokens, slots=slots, cards=n
        ).fits:
            return n
    return 0


def describe_need(need: CardNeed) -> str:
    """A profile's need for people: "13.2 GiB a card of 2, of 72.0 usable"."""
    text = f"{need.per_card_bytes / GIB:.1f} GiB a card of {need.cards}"
    if need.budget_bytes > 0:
        text += f", of {need.budget_bytes / GIB:.1f} usable"
    return text


def describe_ram(ram_bytes: int) -> str:
    """A CPU profile's need for people, in whole GB as the catalog keeps it."""
    return f"{ram_gb(ram_bytes)} GB of RAM"


def ram_gb(ram_bytes: int) -> int:
    """RAM rounded up to whole GB (10^9 bytes), as `min_memory_gb` holds it."""
    return -(-ram_bytes // 1_000_000_000)
