"""Planning the cards of each replica: tensor parallel held to the heads, or layer split."""

from __future__ import annotations

from dataclasses import dataclass, replace

from llmgw.engines.base import Engine
from llmgw.engines.tensor_parallel import TensorParallelEngine
from llmgw.model import Inventory, Model, Profile
from llmgw.shape import ModelShape
from planner_svc.domain import errors, gang_split
from planner_svc.domain.batch import BatchFit, batch_fit, check_sequences, slots_for, with_sequences
from planner_svc.domain.context import (
    ProfileChange,
    ProfileNeed,
    current_tokens,
    engine_of,
    margin_aside,
    profile_need,
)
from planner_svc.domain.fit import (
    DEFAULT_MAX_CARDS,
    card_counts,
    fewest_cards,
    longest_context,
    measure,
)

MAX_GPUS = 1024
"""A ceiling on cards per replica: past it a number is a typo, not a plan."""


@dataclass(frozen=True)
class GPUsChange:
    """The cards each replica of a model's profiles uses, before and after."""

    model: str
    gpus: int
    profiles: tuple[ProfileChange, ...]
    updated: tuple[Profile, ...]
    note: str = ""

    @property
    def batches(self) -> tuple[BatchFit, ...]:
        """Each sized profile's answer for the batch asked (empty when none was)."""
        return tuple(p.batch for p in self.profiles if p.batch is not None)


def plan_gpus(
    model: Model,
    shape: ModelShape | None,
    *,
    gpus: int,
    profile: str,
    inventory: Inventory,
    note: str = "",
    sequences: int = 0,
) -> GPUsChange:
    """A model's GPU profiles (or the one named) moved to `gpus` cards of one node each.

    Args:
        model: the catalog entry.
        shape: its shape; None when it could not be read (heads and memory not checked).
        gpus: cards per replica.
        profile: a profile's name, or "" for every GPU profile.
        inventory: the nodes; a count no node of the class has is refused.
        note: what could not be checked already.
        sequences: concurrent requests at the profile's context to size for (0: none),
            written to each engine's own flag (`batch.with_sequences`; llama.cpp's slots).
    Returns:
        The change and every profile of the model (changed or not).
    Raises:
        InvalidRequest, ProfileNotFound, EngineSingleCard, GPUCountUnavailable,
        HeadsNotDivisible, CardsTooSmall, UnknownEngine.
    """
    chosen = check_gpus_request(model, gpus=gpus, profile=profile)
    check_sequences(sequences)
    notes = [note] if note else []
    if shape is not None and shape.weights_bytes <= 0 and not note:
        notes.append(
            "its files' sizes are not known, so the memory it needs is not checked "
            "(the KV cache's figures are given)"
        )
    if not inventory.nodes:
        notes.append("no inventory was given, so no node was checked for the cards")
    changes: list[ProfileChange] = []
    updated: list[Profile] = []
    for p in model.profiles:
        if p.name not in chosen:
            updated.append(p)
            continue
        if sequences > 0:
            p = _with_batch(model, p, sequences)
        new_profile, change = _replan_profile(model, p, shape, gpus, inventory, notes)
        if sequences > 0:
            change = _batch_answer(change, p, model, sequences)
        updated.append(new_profile)
        changes.append(change)
    return GPUsChange(
        model=model.name,
        gpus=gpus,
        profiles=tuple(changes),
        updated=tuple(updated),
        note="; ".join(dict.fromkeys(notes)),
    )


def _with_batch(model: Model, profile: Profile, sequences: int) -> Profile:
    """The profile with a batch of `sequences` written to its engine's flag (llama.cpp: its
    slots, at the profile's context)."""
    engine = engine_of(profile)
    args = with_sequences(engine, profile.args, sequences)
    slots = slots_for(engine, engine.slots(profile.args), sequences)
    if slots != engine.slots(profile.args):
        args = engine.with_context(args, current_tokens(engine, profile, model), slots)
    return replace(profile, args=tuple(args))


def _batch_answer(
    change: ProfileChange, profile: Profile, model: Model, sequences: int
) -> ProfileChange:
    """The change with whether its batch fits (left out when the cards were not sized)."""
    card = change.need.card
    if card is None or card.budget_bytes <= 0 or not change.need.weights_known:
        return change
    engine = engine_of(profile)
    tokens = current_tokens(engine, profile, model)
    fit = batch_fit(
        profile.name,
        engine,
        sequences=sequences,
        tokens=tokens,
        cards_fit=card.fits,
        token_capacity=card.kv_token_capacity,
        pooled=engine.pool_tokens(tokens, 2) == tokens,
    )
    return replace(change, batch=fit)


def check_gpus_request(model: Model, *, gpus: int, profile: str) -> set[str]:
    """The profiles a PlanGPUs request is about, refused when its numbers or names are wrong:
    the checks that need no shape, so they are made before a source is fetched.

    Raises:
        GPUCountOutOfRange, ProfileNotFound, ProfileOnCPU, NoGPUProfile.
    """
    if gpus < 1 or gpus > MAX_GPUS:
        raise errors.GPUCountOutOfRange(
            f"{gpus} cards a replica is out of range: ask for 1 to {MAX_GPUS}",
            gpus=gpus,
            maximum=MAX_GPUS,
        )
    return _chosen_profiles(model, profile)


def _chosen_profiles(model: Model, name: str) -> set[str]:
    """The profiles a request is about: the one named, or every GPU profile."""
    if name:
        match = [p for p in model.profiles if p.name == name]
        if not match:
            have = ", ".join(p.name for p in model.profiles) or "none"
            raise errors.ProfileNotFound(
                f"{model.name} has no profile {name!r} (it has: {have})", profile=name
            )
        if match[0].on_cpu:
            raise errors.ProfileOnCPU(
                f"the {name} profile runs on CPUs: give it a gpu_class before planning cards",
                profile=name,
            )
        return {name}
    chosen = {p.name for p in model.profiles if not p.on_cpu}
    if not chosen:
        raise errors.NoGPUProfile(
            f"{model.name} has no GPU profile to plan cards for: give a profile a gpu_class",
            model=model.name,
        )
    return chosen


def _replan_profile(
    model: Model,
    profile: Profile,
    shape: ModelShape | None,
    gpus: int,
    inventory: Inventory,
    notes: list[str],
) -> tuple[Profile, ProfileChange]:
    """One profile on `gpus` cards, refused where the engine, nodes, heads or cards say no
    (the cards only when the weights are known: without them the KV figures and the rest of
    the breakdown come back, unchecked)."""
    engine = engine_of(profile)
    if engine.single_card and gpus != 1:
        raise errors.EngineSingleCard(
            f"the {profile.name} profile's engine ({profile.engine}) runs on one card only: "
            "serve more replicas instead",
            profile=profile.name,
            engine=profile.engine,
        )
    largest = inventory.largest_count(profile.gpu_class)
    if inventory.nodes and gpus > largest:
        where = (
            f"the largest {profile.gpu_class} node has {largest}"
            if largest
            else f"no node has {profile.gpu_class} cards"
        )
        raise errors.GPUCountUnavailable(
            f"no node has {gpus} {profile.gpu_class} cards for the {profile.name} profile: {where}",
            profile=profile.name,
            gpu_class=profile.gpu_class,
            gpus=gpus,
            largest=largest,
        )
    nodes = gang_nodes(profile)
    if nodes > 1 and inventory.nodes:
        _check_gang_nodes(profile, inventory, gpus, nodes)
    if nodes > 1 and isinstance(engine, TensorParallelEngine):
        args, new_profile = _split_gang(model, profile, engine, shape, gpus, nodes, largest, notes)
    else:
        _check_heads(model, profile, engine, shape, gpus, largest, notes)
        args = tuple(engine.with_cards(profile.args, gpus))
        tp = engine.replica_tp(gpus, profile.tp)
        new_profile = replace(profile, args=args, gpus_per_node=gpus, tp=tp)
    change = ProfileChange(
        profile=profile.name,
        engine=profile.engine,
        before=f"{profile.cards} cards",
        after=f"{new_profile.cards} cards",
        args=args,
        args_before=profile.args,
    )
    if shape is None:
        return new_profile, change
    sized = shape
    tokens = current_tokens(engine, profile, model)
    slots = engine.slots(profile.args)
    if tokens <= 0:
        notes.append("its context is not known, so the memory it needs is not checked")
        return new_profile, change
    before = profile_need(
        engine, profile, sized, inventory, args=profile.args, tokens=tokens, slots=slots
    )
    after = profile_need(
        engine, new_profile, sized, inventory, args=args, tokens=tokens, slots=slots
    )
    change = replace(
        change, before=before.describe(), after=after.describe(), need=after, need_before=before
    )
    card = after.card
    if not after.weights_known:
        return new_profile, change
    if card is None or card.budget_bytes <= 0:
        if card is not None:
            notes.append(
                f"the memory of a {profile.gpu_class} card is not known, so the cards are not "
                "checked"
            )
        return new_profile, change
    if not card.fits:
        longest = longest_context(
            engine,
            new_profile,
            sized,
            inventory,
            args=args,
            slots=slots,
            cards=new_profile.cards,
            limit_tokens=sized.trained_context or tokens,
        )
        gang = nodes > 1 and isinstance(engine, TensorParallelEngine)
        if nodes > 1 and isinstance(engine, TensorParallelEngine):
            fewest = _fewest_gang_cards(
                engine, profile, sized, inventory, nodes=nodes, tokens=tokens, slots=slots
            )
        else:
            fewest = fewest_cards(
                engine, profile, sized, inventory, args=profile.args, tokens=tokens, slots=slots
            )
        safe = longest and longest_context(
            engine,
            new_profile,
            sized,
            inventory,
            args=args,
            slots=slots,
            cards=new_profile.cards,
            limit_tokens=longest,
            with_margin=True,
        )
        gib = 1 << 30
        remedies = []
        each = f" on each of {nodes} nodes" if gang else ""
        if longest:
            aside = margin_aside(longest, safe)
            remedies.append(f"a context of at most {longest} tokens on {gpus} cards{each}{aside}")
        if fewest:
            remedies.append(f"{fewest} cards{each} for {tokens} tokens")
        if card.per_card_bytes > card.budget_bytes:
            why = (
                f"needs {card.per_card_bytes / gib:.1f} GiB a card for its weights and {tokens} "
                f"tokens, more than the {card.budget_bytes / gib:.1f} GiB usable"
            )
        else:
            why = (
                f"leaves {card.outside_room_bytes / gib:.2f} GiB outside its budget a card, less "
                f"than the {card.outside_bytes / gib:.2f} GiB the engine needs there (CUDA "
                "context and graphs)"
            )
        raise errors.CardsTooSmall(
            f"on {gpus} {profile.gpu_class} cards{each} the {profile.name} profile {why}: "
            + (", or ".join(remedies) if remedies else "no count of one node holds it"),
            profile=profile.name,
            need_bytes=card.per_card_bytes,
            budget_bytes=card.budget_bytes,
            cards=gpus,
            longest_context_tokens=longest,
            fewest_cards=fewest,
        )
    return new_profile, change


def _asks_tp_across(engine: TensorParallelEngine, profile: Profile, nodes: int) -> bool:
    """Whether a gang's profile runs tensor parallel over all its nodes now (its cards a
    node, or its tp × pp ranks shared over its nodes)."""
    ranks = max(profile.tp, 1) * max(profile.pp, 1)
    before = profile.gpus_per_node or max(-(-ranks // nodes), 1)
    return gang_split.asks_tp_across(engine, profile.args, nodes, before)


def _gang_largest(inventory: Inventory, gpu_class: str, nodes: int) -> int:
    """The most cards a node a gang of `nodes` nodes of the class can take: the `nodes`-th
    largest node's count (0 when the class has fewer nodes)."""
    counts = sorted((n.gpus for n in inventory.of_class(gpu_class)), reverse=True)
    return counts[nodes - 1] if len(counts) >= nodes else 0


def _check_gang_nodes(profile: Profile, inventory: Inventory, gpus: int, nodes: int) -> None:
    """Refuse `gpus` cards a node for a gang when fewer than `nodes` nodes of its class have
    that many (the fleet could never place it).

    Raises:
        GPUCountUnavailable: with the most cards a node a gang of that size could take.
    """
    most = _gang_largest(inventory, profile.gpu_class, nodes)
    if gpus <= most:
        return
    have = sum(1 for n in inventory.of_class(profile.gpu_class) if n.gpus >= gpus)
    fits = (
        f"a gang of {nodes} takes at most {most} cards a node"
        if most
        else f"the inventory has {len(inventory.of_class(profile.gpu_class))} such nodes"
    )
    raise errors.GPUCountUnavailable(
        f"the {profile.name} profile spans {nodes} nodes, and {have} {profile.gpu_class} "
        f"node(s) have {gpus} cards: {fits}",
        profile=profile.name,
        gpu_class=profile.gpu_class,
        gpus=gpus,
        largest=most,
    )


def _fewest_gang_cards(
    engine: TensorParallelEngine,
    profile: Profile,
    shape: ModelShape,
    inventory: Inventory,
    *,
    nodes: int,
    tokens: int,
    slots: int,
) -> int:
    """The fewest cards a node (a split of `gang_split` existing) on which a gang of `nodes`
    holds `tokens`; 0 when no count its nodes have does."""
    across = _asks_tp_across(engine, profile, nodes)
    for c in range(1, _gang_largest(inventory, profile.gpu_class, nodes) + 1):
        answer = gang_split.choose(
            engine, shape, profile.args, nodes=nodes, gpus_per_node=c, tp_across=across
        )
        if answer.split is None:
            continue
        trial = gang_split.with_split(engine, profile.args, answer.split)
        fit = measure(
            engine,
            profile,
            shape,
            inventory,
            args=trial,
            tokens=tokens,
            slots=slots,
            cards=c * nodes,
        )
        if fit.fits:
            return c
    return 0


def _check_heads(
    model: Model,
    profile: Profile,
    engine: Engine,
    shape: ModelShape | None,
    gpus: int,
    largest: int,
    notes: list[str],
) -> None:
    """Refuse tensor parallel over `gpus` cards of one node that the engine would not load.

    Raises:
        HeadsNotDivisible: a check of `heads.tp_failure` fails.
    """
    if not engine.splits_by_heads:
        return
    if shape is None:
        notes.append("its heads are not known, so tensor parallel is not checked against them")
        return
    if engine.splits_heads(gpus, shape, profile.args):
        return
    largest_count = largest or max(DEFAULT_MAX_CARDS, gpus)
    valid = tuple(card_counts(engine, shape, largest_count, profile.args))
    failed = (
        engine.tp_failure(gpus, shape, profile.args)
        if isinstance(engine, TensorParallelEngine)
        else None
    ) or "its heads do not split evenly"
    raise errors.HeadsNotDivisible(
        f"tensor parallel {gpus} cannot load {model.name}: {failed}; the counts that "
        "pass every check are " + (", ".join(str(n) for n in valid) or "none"),
        gpus=gpus,
        attention_heads=shape.attention_heads,
        kv_heads=shape.kv_heads,
        valid_counts=valid,
        check=failed,
    )


def gang_nodes(profile: Profile) -> int:
    """The nodes one replica of `profile` spans: `nodes` when set, else its pipeline stages
    (as `Profile.cards` and the fleet's placement count them), else one."""
    return profile.nodes if profile.nodes >= 1 else max(profile.pp, 1)


def _split_gang(
    model: Model,
    profile: Profile,
    engine: TensorParallelEngine,
    shape: ModelShape | None,
    gpus: int,
    nodes: int,
    largest: int,
    notes: list[str],
) -> tuple[tuple[str, ...], Profile]:
    """A gang's profile on `gpus` cards of each of its `nodes` nodes, its tp × pp re-split
    over them by `gang_split`'s rule (so the world the engine forms is nodes × gpus).

    Raises:
        HeadsNotDivisible: no split of the rule passes the engine's checks.
    """
    across = _asks_tp_across(engine, profile, nodes)
    answer = gang_split.choose(
        engine, shape, profile.args, nodes=nodes, gpus_per_node=gpus, tp_across=across
    )
    if shape is None:
        notes.append("its heads are not known, so tensor parallel is not checked against them")
    if answer.split is None:
        valid = gang_split.counts_that_split(
            engine,
            shape,
            profile.args,
            nodes=nodes,
            largest=largest or max(DEFAULT_MAX_CARDS, gpus),
            tp_across=across,
        )
        raise errors.HeadsNotDivisible(
            f"no split of {nodes} nodes x {gpus} cards ({nodes * gpus} ranks) into tensor x "
            f"pipeline parallel loads {model.name}: {answer.refusals()}; the cards a node that "
            "split are " + (", ".join(str(n) for n in valid) or "none"),
            gpus=gpus,
            attention_heads=shape.attention_heads if shape else 0,
            kv_heads=shape.kv_heads if shape else 0,
            valid_counts=valid,
            check=answer.refused[0][1] if answer.refused else "",
        )
    split = answer.split
    if answer.preferred is not None and split != answer.preferred:
        notes.append(
            f"the {profile.name} profile runs tp {split.tp} x pp {split.pp} over {nodes} nodes: "
            f"tp {answer.preferred.tp} x pp {answer.preferred.pp} fails ({answer.refused[0][1]})"
        )
    args = tuple(gang_split.with_split(engine, profile.args, split))
    return args, replace(
        profile, args=args, gpus_per_node=gpus, tp=split.tp, pp=split.pp, nodes=nodes
    )


__all__ = ["GPUsChange", "ProfileNeed", "check_gpus_request", "plan_gpus"]
