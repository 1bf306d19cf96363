"""A context sizing compiled once per model, shape, inventory, slots and batch: what no
context changes worked out ahead, so that a context never asked before costs its arithmetic.

`size_context` works out, for every context asked, each profile's engine, slots and
arguments, the profile as it stands, its card, its engine version and the engine's setting
(tensor parallel sizes, cache type, pool layout, weights a card) before it reaches the figures
the context moves. A `ContextPlan` holds all of that, and `ContextPlan.change(tokens)` is
`size_context`'s answer for `tokens`, built from the same functions (`NeedPlan.at` is the
engine's own `card_need`), or None where the plan does not decide it and `size_context` must
(a refusal, a profile that fits only within the margin, a card of unknown size): the caller
then sizes the context the full way, which raises or notes exactly as it always does.

Plans are made only for GPU profiles of tensor-parallel engines with known weights and no
batch asked; any other request gets no plan (`compile_context` returns None).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from llmgw.engines.base import CardNeed, SizingRequest, Verdict
from llmgw.engines.tensor_parallel import NeedPlan, TensorParallelEngine
from llmgw.frozen import made
from llmgw.model import Inventory, Model, Profile
from llmgw.shape import ModelShape
from planner_svc.domain import errors
from planner_svc.domain.cards import card_of
from planner_svc.domain.context import (
    _NEED_FIGURES,
    MAX_NEED_BYTES,
    MAX_TOKENS,
    ContextChange,
    ProfileChange,
    ProfileNeed,
    _standing,
    check_context_request,
    default_max_output,
)
from planner_svc.domain.fit import MIN_CONTEXT_TOKENS, describe_need, engine_version

_PROBES = (111_111, 222_222, 333_333)
"""Contexts written into a profile's arguments to find where the context's value stands
(distinct digits, so no other argument can be mistaken for it)."""


@dataclass(frozen=True)
class ArgsTemplate:
    """A profile's arguments for any context: `head`, the context's value after `prefix`,
    then `tail` (`engine.with_context` writes it in one place, in the spelling it stood)."""

    head: tuple[str, ...]
    prefix: str
    tail: tuple[str, ...]

    def at(self, tokens: int) -> tuple[str, ...]:
        """The arguments for a context of `tokens`."""
        return (*self.head, self.prefix + str(tokens), *self.tail)


def args_template(
    engine: TensorParallelEngine, args: tuple[str, ...], slots: int
) -> ArgsTemplate | None:
    """Where `engine.with_context(args, tokens, slots)` writes the context, as a template;
    None when its output is not the same list with one value changed for every probe."""
    outs = [tuple(engine.with_context(args, probe, slots)) for probe in _PROBES]
    first = outs[0]
    if any(len(out) != len(first) for out in outs):
        return None
    differ = [i for i in range(len(first)) if len({out[i] for out in outs}) > 1]
    if len(differ) != 1:
        return None
    i = differ[0]
    value = str(_PROBES[0])
    if not first[i].endswith(value):
        return None
    template = ArgsTemplate(first[:i], first[i][: -len(value)], first[i + 1 :])
    if any(template.at(probe) != out for probe, out in zip(_PROBES, outs, strict=True)):
        return None
    return template


@dataclass(frozen=True)
class ProfilePlan:
    """One profile's part of a plan: the profile, its arguments and its need for any
    context, and the profile as it stands."""

    profile: Profile
    args: ArgsTemplate
    need: NeedPlan
    rules_suffix: str
    """What `fit.measure` adds to the rules where the version is the nodes' ("" when not)."""
    before: ProfileNeed
    before_text: str


@dataclass(frozen=True)
class ContextPlan:
    """`size_context` of one model, shape, inventory, slots and batch, for any context."""

    model: Model
    trained: int
    note: str
    profiles: tuple[ProfilePlan, ...]

    def change(self, tokens: int) -> ContextChange | None:
        """`size_context`'s change for a context of `tokens` when every profile fits with
        its margin; None when the full sizing must answer (it then refuses or notes)."""
        if tokens < MIN_CONTEXT_TOKENS or tokens > MAX_TOKENS:
            return None
        if 0 < self.trained < tokens:
            return None
        changes = []
        updated = []
        for plan in self.profiles:
            args = plan.args.at(tokens)
            card = plan.need.at(tokens, args)
            if plan.rules_suffix:
                card = _with_rules(card, card.rules + plan.rules_suffix)
            if card.verdict is not Verdict.FITS or max(_NEED_FIGURES(card)) > MAX_NEED_BYTES:
                return None
            profile = plan.profile
            need = made(ProfileNeed, card=card, ram_bytes=0, ram=None, weights_known=True)
            changes.append(
                made(
                    ProfileChange,
                    profile=profile.name,
                    engine=profile.engine,
                    before=plan.before_text,
                    after=describe_need(card),
                    args=args,
                    args_before=profile.args,
                    need=need,
                    need_before=plan.before,
                    batch=None,
                )
            )
            updated.append(profile.with_args(args))
        model = self.model
        max_output = model.max_output
        if max_output == 0 or max_output == default_max_output(model.context_length):
            max_output = default_max_output(tokens)
        return made(
            ContextChange,
            model=model.name,
            before=model.context_length,
            after=tokens,
            max_output=min(max_output, tokens),
            trained=self.trained,
            profiles=tuple(changes),
            updated=tuple(updated),
            note=self.note,
        )


def _with_rules(card: CardNeed, rules: str) -> CardNeed:
    """`card` with other rules (a copy of its fields, as `dataclasses.replace` would make)."""
    copy = object.__new__(CardNeed)
    copy.__dict__.update(card.__dict__, rules=rules)
    return copy


def compile_context(
    model: Model,
    shape: ModelShape | None,
    inventory: Inventory,
    *,
    slots: int,
    sequences: int = 0,
    note: str = "",
) -> ContextPlan | None:
    """The plan of `size_context(model, shape, slots=slots, inventory=inventory, note=note,
    sequences=sequences)` for any context; None when the request is not one a plan decides
    (no shape, unknown weights, a batch asked, a CPU profile, an engine that is not tensor
    parallel, arguments whose context is not written in one place, or anything refused: the
    full sizing then answers every context of it)."""
    if shape is None or shape.weights_bytes <= 0 or sequences != 0 or not model.profiles:
        return None
    try:
        check_context_request(MIN_CONTEXT_TOKENS, slots)
        plans = tuple(
            _profile_plan(model, profile, shape, inventory, slots=slots)
            for profile in model.profiles
        )
    except (errors.PlannerError, errors.EngineError, errors.InvalidShape):
        return None
    if any(plan is None for plan in plans):
        return None
    return ContextPlan(
        model=model,
        trained=shape.trained_context,
        note=note,
        profiles=tuple(plan for plan in plans if plan is not None),
    )


def _profile_plan(
    model: Model, profile: Profile, shape: ModelShape, inventory: Inventory, *, slots: int
) -> ProfilePlan | None:
    """One profile's plan (as `_resize_profile` sizes it), None when it cannot have one.

    Raises:
        UnknownEngine, EngineNoContext, SlotsOutOfRange, EngineRefuses (not planned).
    """
    if profile.on_cpu:
        return None
    standing = _standing(model, profile, shape, inventory, slots=slots, sequences=0)
    engine = standing.engine
    if not isinstance(engine, TensorParallelEngine):
        return None
    template = args_template(engine, standing.args, standing.slots)
    if template is None:
        return None
    card = card_of(profile.gpu_class, inventory)
    if card.nvml_bytes <= 0 and card.cuda_bytes <= 0:
        return None
    version = engine_version(engine, profile, inventory)
    from_nodes = bool(version) and not profile.engine_version.strip()
    asked = SizingRequest(
        args=template.at(MIN_CONTEXT_TOKENS),
        tokens=MIN_CONTEXT_TOKENS,
        slots=standing.slots,
        cards=profile.cards,
        card_memory_bytes=card.nvml_bytes,
        card=card,
        engine_version=version,
    )
    need = engine.need_plan(shape, asked)
    other = engine.need_plan(shape, replace(asked, args=template.at(_PROBES[0])))
    if other.masked != need.masked:
        return None  # the context's value is not masked out of the setting's key
    return ProfilePlan(
        profile=profile,
        args=template,
        need=need,
        rules_suffix=f"; {version} is what the {profile.gpu_class} nodes run" if from_nodes else "",
        before=standing.before,
        before_text=standing.before_text,
    )
