"""The planner's answers as the contract carries them (the common values convert in
`llmgw.rpc.common`)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from llmgw.common.v1 import common_pb2
from llmgw.engines.base import CardNeed, Verdict
from llmgw.planner.v1 import planner_pb2
from llmgw.rpc.common import scalars_to_proto
from planner_svc.domain.batch import BatchFit
from planner_svc.domain.context import (
    ContextChange,
    ProfileChange,
    ProfileNeed,
    within_margin_note,
)
from planner_svc.domain.context_plan import ContextPlan
from planner_svc.domain.gpus import GPUsChange

_VERDICTS = {
    Verdict.FITS: common_pb2.FIT_VERDICT_FITS,
    Verdict.WITHIN_MARGIN: common_pb2.FIT_VERDICT_WITHIN_MARGIN,
    Verdict.DOES_NOT_FIT: common_pb2.FIT_VERDICT_DOES_NOT_FIT,
    Verdict.NOT_CHECKED: common_pb2.FIT_VERDICT_NOT_CHECKED,
}


_BUILT_KEPT = 8
_built: OrderedDict[int, tuple[CardNeed, bool, str, common_pb2.Memory]] = OrderedDict()
"""The last card needs converted (by identity; each entry holds its need, so the identity
cannot be reused while it is kept): the profile as it stands is the same need, kept by
`domain.fit.measure`, in every answer about that profile. The message kept is only ever
copied from, never handed out."""


def _memory(need: ProfileNeed, profile: str = "") -> common_pb2.Memory | None:
    """A profile's need in bytes, None when it was not sized (the caller copies it: the
    message may be kept for the next answer)."""
    if need.card is not None:
        hit = _built.get(id(need.card))
        if hit is not None and hit[0] is need.card and hit[1:3] == (need.weights_known, profile):
            _built.move_to_end(id(need.card))
            return hit[3]
        msg = _card_memory(need.card, need.weights_known, profile)
        _built[id(need.card)] = (need.card, need.weights_known, profile, msg)
        _built.move_to_end(id(need.card))
        while len(_built) > _BUILT_KEPT:
            _built.popitem(last=False)
        return msg
    return _ram_memory(need)


def _card_memory(c: CardNeed, weights_known: bool, profile: str) -> common_pb2.Memory:
    """A card need as the contract carries it."""
    return _card_memory_into(c, weights_known, profile, common_pb2.Memory())


def _card_memory_into(
    c: CardNeed, weights_known: bool, profile: str, msg: common_pb2.Memory
) -> common_pb2.Memory:
    """`_card_memory`, written into `msg` (an empty message: an answer's own field, so
    nothing is copied again)."""
    verdict = c.verdict if weights_known else Verdict.NOT_CHECKED
    msg.weights_bytes = c.weights_bytes
    msg.kv_bytes = c.kv_bytes
    msg.per_card_bytes = c.per_card_bytes
    msg.budget_bytes = c.budget_bytes
    msg.cards = c.cards
    msg.overhead_bytes = c.overhead_bytes
    msg.weights_per_card_bytes = c.weights_per_card_bytes
    msg.kv_per_card_bytes = c.kv_per_card_bytes
    msg.activation_bytes = c.activation_bytes
    msg.non_torch_bytes = c.non_torch_bytes
    msg.cuda_graph_bytes = c.cuda_graph_bytes
    msg.other_bytes = c.other_bytes
    msg.kv_pool_bytes = c.kv_pool_bytes
    msg.kv_token_capacity = c.kv_token_capacity
    msg.max_concurrency = c.max_concurrency
    msg.margin_bytes = c.margin_bytes
    msg.verdict = _VERDICTS[verdict]
    if verdict is Verdict.WITHIN_MARGIN:
        msg.verdict_note = within_margin_note(profile or "this", c)
    msg.rules = c.rules
    msg.card_total_bytes = c.card_total_bytes
    msg.outside_budget_bytes = c.outside_bytes
    msg.outside_room_bytes = c.outside_room_bytes
    for d in c.devices:
        msg.devices.add(
            device=d.device,
            layers=d.layers,
            first_layer=d.first_layer,
            last_layer=d.last_layer,
            output=d.output,
            weights_bytes=d.weights_bytes,
            kv_bytes=d.kv_bytes,
            compute_bytes=d.compute_bytes,
        )
    msg.weights_unknown = not weights_known
    return msg


def _ram_memory(need: ProfileNeed) -> common_pb2.Memory | None:
    """A CPU profile's need (or a bare RAM figure), None when it was not sized."""
    if need.ram is not None:
        r = need.ram
        return common_pb2.Memory(
            ram_bytes=need.ram_bytes,
            weights_bytes=r.weights_bytes,
            kv_bytes=r.kv_bytes,
            weights_per_card_bytes=r.weights_bytes,
            kv_per_card_bytes=r.kv_bytes,
            other_bytes=r.other_bytes,
            cards=0,
            verdict=_VERDICTS[Verdict.NOT_CHECKED],
            rules="RAM: weights + KV + 1 GiB + 5 % of the weights (DESIGN §5)",
            weights_unknown=not need.weights_known,
        )
    if need.ram_bytes:
        return common_pb2.Memory(ram_bytes=need.ram_bytes)
    return None


_STANDING_KEPT = 8
_standing: OrderedDict[
    tuple[int, int], tuple[ProfileNeed, tuple[str, ...], str, str, str, common_pb2.ProfileChange]
] = OrderedDict()
"""The last profiles as they stand converted (by the identities of their need and arguments
before; each entry holds both, so neither identity can be reused while it is kept): every
answer about a profile carries the same name, engine, arguments and need before, which
`domain.context` keeps per profile, so they are converted once and copied. The message kept
is only ever copied from, never handed out."""


def _standing_part(c: ProfileChange) -> common_pb2.ProfileChange:
    """The part of a profile's change that is the profile as it stands (name, engine, need
    and arguments before), converted once per standing (the caller copies it)."""
    key = (id(c.need_before), id(c.args_before))
    hit = _standing.get(key)
    if (
        hit is not None
        and hit[0] is c.need_before
        and hit[1] is c.args_before
        and hit[2:5] == (c.profile, c.engine, c.before)
    ):
        _standing.move_to_end(key)
        return hit[5]
    msg = common_pb2.ProfileChange(profile=c.profile, engine=c.engine, before=c.before)
    msg.args_before.extend(c.args_before)
    before = _memory(c.need_before, c.profile)
    if before is not None:
        msg.memory_before.CopyFrom(before)
    _standing[key] = (c.need_before, c.args_before, c.profile, c.engine, c.before, msg)
    _standing.move_to_end(key)
    while len(_standing) > _STANDING_KEPT:
        _standing.popitem(last=False)
    return msg


def profile_change_to_proto(
    c: ProfileChange, into: common_pb2.ProfileChange | None = None
) -> common_pb2.ProfileChange:
    """One profile's part of a change, written into `into` (an empty message: a repeated
    field's new element, so nothing is copied again) or a new message."""
    msg = common_pb2.ProfileChange() if into is None else into
    msg.CopyFrom(_standing_part(c))
    msg.after = c.after
    msg.args.extend(c.args)
    after = _memory(c.need, c.profile)
    if after is not None:
        msg.memory.CopyFrom(after)
    return msg


def size_template(plan: ContextPlan, llamacpp_version: str) -> planner_pb2.SizeContextResponse:
    """What every answer of `plan` carries whatever the context, as `size_answer` writes it:
    the profiles' fields but their arguments, and each profile's change as it stands (name,
    engine, arguments and need before). `filled_size_answer` copies it and writes the rest."""
    answer = planner_pb2.SizeContextResponse(llamacpp_version=llamacpp_version)
    for p in plan.profiles:
        answer.profiles.add(**scalars_to_proto(p.profile.with_args(())))
    change = answer.change
    change.SetInParent()
    for p in plan.profiles:
        msg = change.profiles.add(
            profile=p.profile.name, engine=p.profile.engine, before=p.before_text
        )
        msg.args_before.extend(p.profile.args)
        before = _memory(p.before, p.profile.name)
        if before is not None:
            msg.memory_before.CopyFrom(before)
    return answer


def filled_size_answer(
    template: planner_pb2.SizeContextResponse, c: ContextChange
) -> planner_pb2.SizeContextResponse:
    """`size_answer(c, "", version)` for a change of the plan `template` was made of
    (`size_template`; `ContextPlan.change`: every profile sized on its cards, no batch): the
    template copied, and what the context changes written into it."""
    answer = planner_pb2.SizeContextResponse()
    answer.CopyFrom(template)
    for msg, p in zip(answer.profiles, c.updated, strict=True):
        msg.args.extend(p.args)
    change = answer.change
    for into, pc in zip(change.profiles, c.profiles, strict=True):
        into.after = pc.after
        into.args.extend(pc.args)
        card = pc.need.card
        assert card is not None  # a plan sizes every profile on its cards
        into.memory.SetInParent()  # present, as when copied in
        _card_memory_into(card, pc.need.weights_known, pc.profile, into.memory)
    # A plan answers only when every profile fits with its margin (`ContextPlan.change`),
    # so `plan_verdict` is FITS with no note.
    change.verdict = common_pb2.FIT_VERDICT_FITS
    change.model = c.model
    change.before = c.before
    change.after = c.after
    change.max_output = c.max_output
    change.trained = c.trained
    change.note = c.note
    return answer


def size_answer(
    c: ContextChange, unchecked: str, llamacpp_version: str
) -> planner_pb2.SizeContextResponse:
    """A SizeContext answer: the updated profiles, the change (`unchecked` as for
    `context_change_to_proto`) and the batches, each written into the answer's own fields
    (a sub-message passed to a constructor is copied)."""
    answer = planner_pb2.SizeContextResponse(llamacpp_version=llamacpp_version)
    for p in c.updated:
        answer.profiles.add(**scalars_to_proto(p))
    for b in c.batches:
        _batch_into(b, answer.batches.add())
    context_change_to_proto(c, unchecked, answer.change)
    return answer


# Worst last: a plan's verdict is the worst of its profiles' card verdicts.
_ORDER = (
    common_pb2.FIT_VERDICT_FITS,
    common_pb2.FIT_VERDICT_WITHIN_MARGIN,
    common_pb2.FIT_VERDICT_DOES_NOT_FIT,
)


def plan_verdict(
    profiles: Sequence[common_pb2.ProfileChange], unchecked: str
) -> tuple[common_pb2.FitVerdict.ValueType, str]:
    """A whole plan's verdict and its note: NOT_CHECKED with `unchecked` (why) when the
    model's shape could not be read, else the worst card verdict of its profiles (UNSPECIFIED
    when none has one: CPU profiles, unknown weights)."""
    if unchecked:
        return common_pb2.FIT_VERDICT_NOT_CHECKED, unchecked
    seen = [p.memory.verdict for p in profiles if p.memory.verdict in _ORDER]
    if not seen:
        return common_pb2.FIT_VERDICT_UNSPECIFIED, ""
    return max(seen, key=_ORDER.index), ""


def context_change_to_proto(
    c: ContextChange, unchecked: str = "", into: common_pb2.ContextChange | None = None
) -> common_pb2.ContextChange:
    """A context change as the contract carries it; `unchecked` says why the model's shape
    could not be read ("" when it was). Written into `into` (an empty message: the answer's
    own field, so the change is not copied into it) or a new message."""
    msg = common_pb2.ContextChange() if into is None else into
    msg.SetInParent()  # present in its answer, as when it was passed to the constructor
    for p in c.profiles:
        profile_change_to_proto(p, msg.profiles.add())
    msg.verdict, msg.verdict_note = plan_verdict(msg.profiles, unchecked)
    msg.model = c.model
    msg.before = c.before
    msg.after = c.after
    msg.max_output = c.max_output
    msg.trained = c.trained
    msg.note = c.note
    return msg


def gpus_change_to_proto(
    c: GPUsChange, unchecked: str = "", into: common_pb2.GPUsChange | None = None
) -> common_pb2.GPUsChange:
    """A GPU change as the contract carries it (`unchecked` and `into` as for a context
    change)."""
    msg = common_pb2.GPUsChange() if into is None else into
    msg.SetInParent()  # present in its answer, as when it was passed to the constructor
    for p in c.profiles:
        profile_change_to_proto(p, msg.profiles.add())
    msg.verdict, msg.verdict_note = plan_verdict(msg.profiles, unchecked)
    msg.model = c.model
    msg.gpus = c.gpus
    msg.note = c.note
    return msg


def batch_to_proto(b: BatchFit) -> planner_pb2.BatchFit:
    """Whether a batch fits a profile, as the contract carries it."""
    return _batch_into(b, planner_pb2.BatchFit())


def _batch_into(b: BatchFit, msg: planner_pb2.BatchFit) -> planner_pb2.BatchFit:
    """`batch_to_proto`, written into `msg` (an empty message)."""
    msg.profile = b.profile
    msg.engine = b.engine
    msg.sequences = b.sequences
    msg.tokens = b.tokens
    msg.fits = b.fits
    msg.contexts_held = b.contexts_held
    msg.flag = b.flag
    return msg
