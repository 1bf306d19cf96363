"""Catalog entries as the fleet keeps them, the checks a model passes, and the replicas its
profiles want."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from fleet_svc.domain import errors
from fleet_svc.domain.gang import spans_nodes
from fleet_svc.domain.placement import Want
from fleet_svc.domain.replicas import RunSpec
from llmgw.engines import registry
from llmgw.engines.gang import MAX_GANG_NODES
from llmgw.engines.revision import revision_conflict
from llmgw.model import Model, Profile

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
"""Model names: DNS-label-like, so they are safe in URLs, metrics and file names."""
MAX_REPLICAS = 256

GB = 1_000_000_000
"""`Profile.min_memory_gb` counts decimal gigabytes."""


@dataclass(frozen=True)
class Entry:
    """A catalog model: the contract's typed value the fleet acts on, and what the fleet keeps
    of the caller's text without reading it, to give it back as written (the origin's repo and
    revision, an inline shape in its JSON form: only the planner reads a shape).

    `model.shape` is always None here: the shape travels as `shape`.
    """

    model: Model
    origin_repo: str = ""
    origin_revision: str = ""
    shape: Mapping[str, Any] | None = field(default=None, hash=False)

    @property
    def name(self) -> str:
        """The model's name."""
        return self.model.name

    def with_model(self, model: Model) -> Entry:
        """The same entry carrying `model` (its profiles or context changed)."""
        return replace(self, model=model)


@dataclass(frozen=True)
class Revision:
    """One revision of a catalog model: what it was, who wrote it when; a deletion is a
    revision too. `etag` is an opaque token derived from the entry's content (never the
    revision number), "" for a revision not written (a dry run's)."""

    entry: Entry
    revision: int
    updated_by: str
    updated_at: float
    deleted: bool = False
    declared_in: str = ""
    etag: str = ""

    @property
    def name(self) -> str:
        """The model's name."""
        return self.entry.name

    @property
    def model(self) -> Model:
        """The model of this revision."""
        return self.entry.model


@dataclass(frozen=True)
class ProfileWant:
    """A model's profile as the controller needs it: how many replicas, on what, run how."""

    model: str
    profile: str
    revision: int
    replicas: int
    want: Want
    spec: RunSpec


def check_name(name: str) -> None:
    """Refuse a model name the fleet cannot use.

    Raises:
        InvalidModel: not 1-63 lower-case letters, digits, '.', '_' or '-'.
    """
    if not NAME.fullmatch(name):
        raise errors.InvalidModel(
            f"model name {name!r} is not allowed: use 1-63 lower-case letters, digits, "
            "'.', '_' or '-', starting with a letter or digit",
            field="model.name",
        )


def check_profiles(model: Model) -> None:
    """Refuse profiles the fleet could not run (the contract's own checks already passed).

    Raises:
        InvalidModel: a profile names no engine or wants too many replicas.
    """
    for i, p in enumerate(model.profiles):
        if not p.engine:
            raise errors.InvalidModel(
                f"profile {p.name!r} names no engine", field=f"model.profiles[{i}].engine"
            )
        check_engine(p, i)
        nodes = gang_nodes(p)
        if nodes > 1 and (nodes > MAX_GANG_NODES or not spans_nodes(p.engine)):
            raise errors.InvalidModel(
                f"profile {p.name!r} spans {nodes} nodes, and "
                + (
                    f"a replica spans at most {MAX_GANG_NODES}"
                    if nodes > MAX_GANG_NODES
                    else f"its engine {p.engine!r} has no multi-node launch (vLLM, SGLang and "
                    "llama.cpp have one): set nodes 1"
                ),
                field=f"model.profiles[{i}].nodes",
            )
        if p.replicas > MAX_REPLICAS:
            raise errors.InvalidModel(
                f"profile {p.name!r} wants {p.replicas} replicas, more than {MAX_REPLICAS}",
                field=f"model.profiles[{i}].replicas",
            )
    check_pins(model)


def check_pins(model: Model) -> None:
    """Refuse a profile whose arguments pin another Hugging Face revision than the model's
    source (`llmgw.engines.revision`): what the planner sized is what the engine loads.

    Raises:
        InvalidModel: naming the profile's args.
    """
    for i, p in enumerate(model.profiles):
        why = revision_conflict(p.engine, p.args, model.source)
        if why:
            raise errors.InvalidModel(
                f"profile {p.name!r}: {why}", field=f"model.profiles[{i}].args"
            )


def check_engine(profile: Profile, index: int) -> None:
    """Refuse an engine not known by that exact name: the agents' configs and the planner's
    rules key on the registry's names, so an alias or a typo stored would only fail later,
    on a node ("not in this agent's config").

    Raises:
        UnknownEngine: naming the field and the engines the registry knows.
    """
    known = tuple(registry.names())
    if profile.engine in known:
        return
    alias = registry.find(profile.engine)
    hint = f"write {alias.name!r}" if alias is not None else "use one of " + ", ".join(known)
    raise errors.UnknownEngine(
        f"profile {profile.name!r} names the engine {profile.engine[:64]!r}, which llmgw does not "
        f"run by that name: {hint}",
        field=f"model.profiles[{index}].engine",
        engine=profile.engine,
        known=known,
    )


def gang_nodes(profile: Profile) -> int:
    """The nodes one replica of `profile` spans: `nodes` when set, else its pipeline
    stages (`pp` across nodes, as `Profile.cards` counts them), else one."""
    if profile.nodes >= 1:
        return profile.nodes
    return max(profile.pp, 1)


def node_cards(profile: Profile) -> int:
    """The cards one replica of a GPU profile takes on each of its nodes.

    On one node: cards per node, or the tensor parallel size. A gang takes `gpus_per_node`
    on each node — its tp may span nodes, so tp is no floor there — or, when unset, its
    tp × pp ranks shared evenly over its nodes.
    """
    nodes = gang_nodes(profile)
    if nodes > 1:
        if profile.gpus_per_node > 0:
            return profile.gpus_per_node
        ranks = max(profile.tp, 1) * max(profile.pp, 1)
        return max(-(-ranks // nodes), 1)
    return max(profile.gpus_per_node, profile.tp, 1)


def want_of(profile: Profile) -> Want:
    """What one replica of `profile` needs of each node it runs on: cards of its class, or
    RAM; on `gang_nodes` nodes at once."""
    nodes = gang_nodes(profile)
    if profile.on_cpu:
        return Want(ram_bytes=profile.min_memory_gb * GB, nodes=nodes)
    return Want(gpu_class=profile.gpu_class, gpus=node_cards(profile), nodes=nodes)


def wants_of(revisions: Iterable[Revision]) -> list[ProfileWant]:
    """Every profile's wanted replicas, of the current revisions of the catalog."""
    out = []
    for rev in revisions:
        model = rev.model
        for p in model.profiles:
            out.append(
                ProfileWant(
                    model=model.name,
                    profile=p.name,
                    revision=rev.revision,
                    replicas=p.replicas,
                    want=want_of(p),
                    spec=RunSpec(engine=p.engine, args=p.args, source=model.source),
                )
            )
    return out


def changed_profiles(old: Model, new: Model) -> set[str]:
    """The profiles of `new` whose replicas must be replaced to serve it: new profiles, ones
    whose replicas would run otherwise (engine, args, cards: anything but the replica count),
    and every profile when the weights' source changed. A change of the count alone is not
    one: the controller adds or removes replicas, the others keep running."""
    before = {p.name: p for p in old.profiles}
    return {
        p.name
        for p in new.profiles
        if p.name not in before
        or replace(before[p.name], replicas=0) != replace(p, replicas=0)
        or old.source != new.source
    }
