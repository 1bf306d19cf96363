"""Sizing a new context: each profile's engine arguments and memory, or a refusal."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields, replace

from llmgw.engines import registry
from llmgw.engines.base import Engine, Verdict
from llmgw.engines.memo import memo_table
from llmgw.frozen import made
from llmgw.model import Inventory, Model, Profile
from llmgw.shape import ModelShape
from planner_svc.domain import errors
from planner_svc.domain.batch import BatchFit, batch_fit, check_sequences, slots_for, with_sequences
from planner_svc.domain.fit import (
    MIN_CONTEXT_TOKENS,
    describe_need,
    describe_ram,
    fewest_cards,
    longest_context,
    measure,
    ram_gb,
)
from planner_svc.domain.memory import CardNeed, RamNeed, ram_need

MAX_SLOTS = 64
"""llama.cpp slots a profile may ask for (the reference's SetContext rule)."""

MAX_TOKENS = 1 << 24
"""A ceiling on any context, trained or not: past it a number is a typo, not a plan."""

MAX_NEED_BYTES = 1 << 60
"""A ceiling on any memory figure (1 EiB): far past any machine, and below int64's 2^63 so
every figure and sum the contract carries (`Memory.*_bytes`, `min_memory_gb`) fits its field."""

MAX_OUTPUT_CAP_TOKENS = 32_768
"""The default max_output is a quarter of the context, at most this (the reference's rule)."""


def default_max_output(tokens: int) -> int:
    """The max_output a model gets by default for a context of `tokens`."""
    return min(tokens // 4, MAX_OUTPUT_CAP_TOKENS)


@dataclass(frozen=True)
class ProfileNeed:
    """What a profile needs: bytes (GPU) or RAM (CPU); None fields when not sized. `ram` is
    a CPU profile's breakdown (`ram_bytes` its whole); `weights_known` is False when the
    model's files' sizes are not known (then only the KV figures mean anything)."""

    card: CardNeed | None = None
    ram_bytes: int = 0
    ram: RamNeed | None = None
    weights_known: bool = True

    def describe(self) -> str:
        """For people: "13.2 GiB a card of 2, of 72.0 usable" or "18 GB of RAM"."""
        if not self.weights_known:
            return ""
        if self.card is not None:
            return describe_need(self.card)
        if self.ram_bytes:
            return describe_ram(self.ram_bytes)
        return ""


@dataclass(frozen=True)
class ProfileChange:
    """One profile before and after a change."""

    profile: str
    engine: str
    before: str
    after: str
    args: tuple[str, ...]
    args_before: tuple[str, ...]
    need: ProfileNeed = field(default_factory=ProfileNeed)
    need_before: ProfileNeed = field(default_factory=ProfileNeed)
    batch: BatchFit | None = None
    """Whether the batch asked for fits (None: no batch asked, or not sized)."""


@dataclass(frozen=True)
class ContextChange:
    """A model's context before and after, what its profiles become, and what was not
    checked (`note`, said once)."""

    model: str
    before: int
    after: int
    max_output: int
    trained: int
    profiles: tuple[ProfileChange, ...]
    updated: tuple[Profile, ...]
    note: str = ""

    @property
    def batches(self) -> tuple[BatchFit, ...]:
        """Each sized profile's answer for the batch asked (empty when none was)."""
        return tuple(p.batch for p in self.profiles if p.batch is not None)


def check_context_request(tokens: int, slots: int) -> None:
    """Refuse a context request whose numbers are out of range.

    Raises:
        ContextTooShort: tokens < 256.
        ContextOverLimit: tokens past MAX_TOKENS.
        SlotsOutOfRange: slots not in 0..64.
    """
    if tokens < MIN_CONTEXT_TOKENS:
        raise errors.ContextTooShort(
            f"a context of {tokens} tokens is too short: ask for at least {MIN_CONTEXT_TOKENS}",
            tokens=tokens,
        )
    if tokens > MAX_TOKENS:
        raise errors.ContextOverLimit(
            f"a context of {tokens} tokens is past any model's ({MAX_TOKENS}): check the number",
            tokens=tokens,
            maximum=MAX_TOKENS,
        )
    if slots < 0 or slots > MAX_SLOTS:
        raise errors.SlotsOutOfRange(
            f"{slots} slots is out of range: slots are 1 to {MAX_SLOTS} (0 keeps the current)",
            slots=slots,
        )


def check_size_request(model: Model, *, tokens: int, slots: int) -> None:
    """Refuse a SizeContext request on what needs no shape: its numbers, and each profile's
    engine (known, and taking a context). Made before a source is fetched.

    Raises:
        ContextTooShort, ContextOverLimit, SlotsOutOfRange, UnknownEngine, EngineNoContext.
    """
    check_context_request(tokens, slots)
    for profile in model.profiles:
        _context_engine(profile)


def _context_engine(profile: Profile) -> Engine:
    """The profile's engine, refused when it takes no context this way.

    Raises:
        UnknownEngine, EngineNoContext.
    """
    engine = engine_of(profile)
    if not engine.takes_context:
        raise errors.EngineNoContext(
            f"a {profile.engine} profile ({profile.name}) does not take a context this way: "
            "change that profile's arguments, or remove it first",
            profile=profile.name,
            engine=profile.engine,
        )
    return engine


def size_context(
    model: Model,
    shape: ModelShape | None,
    *,
    tokens: int,
    slots: int,
    inventory: Inventory,
    note: str = "",
    sequences: int = 0,
) -> ContextChange:
    """A model's profiles resized for a context of `tokens` (and, for llama.cpp, `slots`).

    Args:
        model: the catalog entry.
        shape: the model's shape; None when it could not be read (then `note` says why, and
            memory is not checked).
        tokens: the context one request may use.
        slots: llama.cpp's concurrent requests (1..64); 0 keeps each profile's current.
        inventory: the nodes, for the memory of the profiles' cards.
        note: what could not be checked already (the shape's absence).
        sequences: concurrent requests of `tokens` each to size for (0: none asked), written
            to each engine's own flag (`batch.batch_flag`; llama.cpp's slots); the change
            says per profile whether that batch fits and how many of the context its pool
            holds.
    Returns:
        The change and the updated profiles.
    Raises:
        ContextTooShort, SlotsOutOfRange, ContextOverTrained, EngineNoContext, UnknownEngine,
        CardsTooSmall, EngineRefuses.
    """
    check_context_request(tokens, slots)
    check_sequences(sequences)
    trained = shape.trained_context if shape is not None else 0
    if trained > 0 and tokens > trained:
        raise errors.ContextOverTrained(
            f"{model.name} was trained for {trained} tokens; a longer context answers worse, "
            f"and llama.cpp or vLLM refuses it: ask for {trained} or fewer",
            tokens=tokens,
            trained=trained,
        )
    notes = [note] if note else []
    if shape is not None and shape.weights_bytes <= 0 and not note:
        notes.append(
            "its files' sizes are not known, so the memory it needs is not checked "
            "(the KV cache's figures are given)"
        )
    sized = shape
    changes: list[ProfileChange] = []
    updated: list[Profile] = []
    for profile in model.profiles:
        new_profile, change = _resize_profile(
            model,
            profile,
            sized,
            tokens=tokens,
            slots=slots,
            inventory=inventory,
            notes=notes,
            sequences=sequences,
        )
        updated.append(new_profile)
        changes.append(change)
    max_output = model.max_output
    if max_output == 0 or max_output == default_max_output(model.context_length):
        max_output = default_max_output(tokens)
    max_output = min(max_output, tokens)
    return made(
        ContextChange,
        model=model.name,
        before=model.context_length,
        after=tokens,
        max_output=max_output,
        trained=trained,
        profiles=tuple(changes),
        updated=tuple(updated),
        note="; ".join(dict.fromkeys(notes)),
    )


def engine_of(profile: Profile) -> Engine:
    """The profile's engine, from the registry.

    Raises:
        UnknownEngine: the planner does not know it.
    """
    engine = registry.find(profile.engine)
    if engine is None:
        raise errors.UnknownEngine(
            f"the {profile.name} profile names an engine the planner does not know "
            f"({profile.engine!r}): use vllm, sglang, trtllm or llamacpp",
            profile=profile.name,
            engine=profile.engine,
        )
    return engine


def current_tokens(engine: Engine, profile: Profile, model: Model) -> int:
    """The context one request of this profile may use now (from its args, else the model's)."""
    tokens = engine.context_tokens(profile.args)
    return tokens if tokens > 0 else model.context_length


def profile_need(
    engine: Engine,
    profile: Profile,
    shape: ModelShape,
    inventory: Inventory,
    *,
    args: tuple[str, ...],
    tokens: int,
    slots: int,
) -> ProfileNeed:
    """What a profile needs served with `args` for `tokens` per request and `slots`."""
    known = shape.weights_bytes > 0
    if profile.on_cpu:
        pool = engine.pool_tokens(tokens, slots)
        ram = ram_need(shape, pool, sequences=max(slots, 1))
        _check_in_range(profile, ram.total_bytes, ram.kv_bytes, ram.weights_bytes)
        return ProfileNeed(ram_bytes=ram.total_bytes, ram=ram, weights_known=known)
    fit = measure(
        engine,
        profile,
        shape,
        inventory,
        args=args,
        tokens=tokens,
        slots=slots,
        cards=profile.cards,
    )
    need = fit.need
    _check_in_range(profile, *_NEED_FIGURES(need))
    return made(ProfileNeed, card=need, ram_bytes=0, ram=None, weights_known=known)


_NEED_FIGURES = operator.attrgetter(*(f.name for f in fields(CardNeed) if f.type in ("int", int)))
"""CardNeed's byte and count fields (its whole-number figures), read in one call."""


def _check_in_range(profile: Profile, *figures: int) -> None:
    """Refuse a need whose figures are past MAX_NEED_BYTES (a huge inline shape times a long
    context), before they reach a field they would overflow.

    Raises:
        MemoryOutOfRange: the largest figure is past the ceiling.
    """
    largest = max(figures, default=0)
    if largest > MAX_NEED_BYTES:
        raise errors.MemoryOutOfRange(
            f"the {profile.name} profile would need {largest} bytes, past any machine's "
            f"{MAX_NEED_BYTES}: check the model's shape and the context asked for",
            profile=profile.name,
            need_bytes=largest,
            maximum_bytes=MAX_NEED_BYTES,
        )


@dataclass(frozen=True)
class _Standing:
    """What resizing a profile reads that no context changes: its engine, the slots and the
    arguments (batch set) a new context is written into, and its need as it stands."""

    engine: Engine
    slots: int
    args: tuple[str, ...]
    before: ProfileNeed
    before_text: str
    held: tuple[object, ...]
    """The profile and inventory its key names by identity, held so that no identity can be
    reused while the entry lives (never the model: an inline shape's model holds the shape,
    and the shape's own memo holding it would keep the shape alive for good)."""


STANDING_KEPT = 32
"""Profiles as they stand kept per shape (models × profiles × inventories × slots ×
batches asked of it; the least recently used go first)."""


def _standing(
    model: Model,
    profile: Profile,
    shape: ModelShape,
    inventory: Inventory,
    *,
    slots: int,
    sequences: int,
) -> _Standing:
    """`profile` as it stands, worked out once per shape, profile, inventory, model context,
    slots and batch and kept in the shape's `sizing_memo` (`llmgw.engines.memo`): each context
    asked of it then costs only its own sizing. The profile and inventory are the servicer's
    decoded values (`planner_svc.rpc.decoded`), the same objects for the same messages; of the
    model only its context is read (`current_tokens`, where the arguments name none).

    Raises:
        UnknownEngine, EngineNoContext, SlotsOutOfRange (not kept).
    """
    key = ("standing", id(profile), id(inventory), model.context_length, slots, sequences)
    kept = memo_table(shape, "standing")
    hit = kept.get(key)
    if hit is not None:
        kept.move_to_end(key)
        return hit  # type: ignore[no-any-return]
    engine = _context_engine(profile)
    use_slots = slots_for(engine, slots or engine.slots(profile.args), sequences)
    batched = tuple(with_sequences(engine, profile.args, sequences))
    old_tokens = current_tokens(engine, profile, model)
    before = ProfileNeed()
    if old_tokens >= 1:
        try:
            before = profile_need(
                engine,
                profile,
                shape,
                inventory,
                args=profile.args,
                tokens=old_tokens,
                slots=engine.slots(profile.args),
            )
        except (errors.PlannerError, errors.EngineError, errors.InvalidShape):
            before = ProfileNeed()  # the old settings need not be valid for the new ones to be
    text = before.describe() if not profile.on_cpu else f"{profile.min_memory_gb} GB of RAM"
    standing = _Standing(engine, use_slots, batched, before, text, (profile, inventory))
    kept[key] = standing
    while len(kept) > STANDING_KEPT:
        kept.popitem(last=False)
    return standing


def _resize_profile(
    model: Model,
    profile: Profile,
    shape: ModelShape | None,
    *,
    tokens: int,
    slots: int,
    inventory: Inventory,
    notes: list[str],
    sequences: int = 0,
) -> tuple[Profile, ProfileChange]:
    """One profile for the new context (and batch), refused where its cards would not hold
    it."""
    if shape is None:
        unsized = _context_engine(profile)
        asked_slots = slots_for(unsized, slots or unsized.slots(profile.args), sequences)
        written = with_sequences(unsized, profile.args, sequences)
        args = tuple(unsized.with_context(written, tokens, asked_slots))
        return profile.with_args(args), ProfileChange(
            profile=profile.name,
            engine=profile.engine,
            before="",
            after="",
            args=args,
            args_before=profile.args,
        )
    standing = _standing(model, profile, shape, inventory, slots=slots, sequences=sequences)
    engine, use_slots, batched, before = (
        standing.engine,
        standing.slots,
        standing.args,
        standing.before,
    )
    args = tuple(engine.with_context(batched, tokens, use_slots))
    new_profile = profile.with_args(args)
    after = profile_need(
        engine, profile, shape, inventory, args=args, tokens=tokens, slots=use_slots
    )
    change = made(
        ProfileChange,
        profile=profile.name,
        engine=profile.engine,
        before=standing.before_text,
        after=after.describe(),
        args=args,
        args_before=profile.args,
        need=after,
        need_before=before,
        batch=None,
    )
    sized_on_cards = after.card is None or (after.card.budget_bytes > 0 and after.weights_known)
    if sequences > 0 and sized_on_cards:
        card_fits = after.card is None or after.card.fits
        capacity = after.card.kv_token_capacity if after.card is not None else 0
        change = replace(
            change,
            batch=batch_fit(
                profile.name,
                engine,
                sequences=sequences,
                tokens=tokens,
                cards_fit=card_fits,
                token_capacity=capacity,
                pooled=after.card is not None and engine.pool_tokens(tokens, 2) == tokens,
            ),
        )
    if not after.weights_known:
        return new_profile, change
    if profile.on_cpu:
        return replace(new_profile, min_memory_gb=ram_gb(after.ram_bytes)), change
    card = after.card
    assert card is not None  # a GPU profile is always measured on cards
    if card.verdict is Verdict.WITHIN_MARGIN:
        notes.append(within_margin_note(profile.name, card))
    if card.budget_bytes <= 0:
        notes.append(
            f"the memory of a {profile.gpu_class} card is not known (no node of that class in "
            "the inventory), so the cards are not checked"
        )
        return new_profile, change
    if not card.fits:
        longest = longest_context(
            engine,
            profile,
            shape,
            inventory,
            args=profile.args,
            slots=use_slots,
            cards=profile.cards,
            limit_tokens=shape.trained_context or tokens,
        )
        safe = longest and longest_context(
            engine,
            profile,
            shape,
            inventory,
            args=profile.args,
            slots=use_slots,
            cards=profile.cards,
            limit_tokens=longest,
            with_margin=True,
        )
        fewest = fewest_cards(
            engine, profile, shape, inventory, args=args, tokens=tokens, slots=use_slots
        )
        raise errors.CardsTooSmall(
            _too_small_message(profile, tokens, card, longest, fewest, safe),
            profile=profile.name,
            need_bytes=card.per_card_bytes,
            budget_bytes=card.budget_bytes,
            cards=card.cards,
            longest_context_tokens=longest,
            fewest_cards=fewest,
        )
    return new_profile, change


def margin_aside(longest: int, safe: int) -> str:
    """What a refusal says beside its longest context when the margin would take some of it:
    the longest that fits with every fitted figure at the far end of its margin."""
    if safe >= longest or longest <= 0:
        return ""
    if safe <= 0:
        return " (none fits with the figures' margin: the engine may refuse any at start)"
    return f" ({safe} with the figures' margin)"


def within_margin_note(profile: str, card: CardNeed) -> str:
    """What could go either way for a profile that fits only within the margin."""
    gib = 1 << 30
    room = card.budget_bytes - card.per_card_bytes
    return (
        f"the {profile} profile fits only within the margin: {room / gib:.2f} GiB are left of "
        f"{card.budget_bytes / gib:.1f} GiB usable a card, and its activation, non-torch, "
        f"CUDA-graph and card-size figures may be off by {card.margin_bytes / gib:.2f} GiB "
        f"({card.rules}); the engine may refuse it at start"
    )


def _too_small_message(
    profile: Profile, tokens: int, card: CardNeed, longest: int, fewest: int, safe: int = 0
) -> str:
    """The CARDS_TOO_SMALL sentence: what was refused, why, what would work."""
    gib = 1 << 30
    if card.per_card_bytes <= card.budget_bytes:
        text = (
            f"with {tokens} tokens the {profile.name} profile leaves "
            f"{card.outside_room_bytes / gib:.2f} GiB outside its budget on each of its "
            f"{card.cards} {profile.gpu_class} cards, less than the "
            f"{card.outside_bytes / gib:.2f} GiB the engine needs there (CUDA context and "
            "graphs): lower the engine's memory share"
        )
    else:
        text = (
            f"with {tokens} tokens the {profile.name} profile needs "
            f"{card.per_card_bytes / gib:.1f} GiB on each of its {card.cards} "
            f"{profile.gpu_class} cards, more than the {card.budget_bytes / gib:.1f} GiB usable"
        )
    remedies = []
    if longest > 0:
        remedies.append(f"a context of at most {longest} tokens{margin_aside(longest, safe)}")
    if fewest > 0:
        remedies.append(f"the model on {fewest} cards")
    if remedies:
        return text + ": " + ", or ".join(remedies)
    return text + ": no context or card count of one node holds it"
