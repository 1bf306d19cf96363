"""Whether a SetContext or SetGPUs asks for anything the model does not already say: a change
is a no-op by what its caller asked, never by what the planner filled in on the way (a default
max_output, a parallel flag the engine's default already equals)."""

from __future__ import annotations

from fleet_svc.domain.catalog import gang_nodes, node_cards
from llmgw.engines import registry
from llmgw.engines.errors import EngineError
from llmgw.model import Model, Profile


def context_asked(model: Model, *, tokens: int, slots: int) -> bool:
    """Whether serving `tokens` of context (and `slots` sequences, 0: keep) changes anything:
    the model's context, a profile's (its engine's reading of its args, where they say one),
    or a profile's slots. A profile whose engine is not known counts as a change (the planner
    refuses it)."""
    if model.context_length != tokens:
        return True
    for p in model.profiles:
        engine = registry.find(p.engine)
        if engine is None:
            return True
        try:
            said = engine.context_tokens(p.args)
            if said and said != tokens:
                return True
            if slots and engine.slots(p.args) != slots:
                return True
        except EngineError:
            return True
    return False


def _gpu_profiles(model: Model, profile: str) -> list[Profile]:
    return [p for p in model.profiles if (p.name == profile if profile else not p.on_cpu)]


def gpus_asked(model: Model, *, gpus: int, profile: str) -> bool:
    """Whether `gpus` cards a replica (of `profile`, or of every GPU profile when "") changes
    anything: a profile's cards, or the parallel sizes its args run with. A profile spanning
    nodes, or whose engine is not known, counts as a change (the planner decides it)."""
    targets = _gpu_profiles(model, profile)
    if not targets:
        return True
    for p in targets:
        engine = registry.find(p.engine)
        if engine is None or p.on_cpu or gang_nodes(p) != 1 or node_cards(p) != gpus:
            return True
        if engine.splits_by_heads:
            try:
                tp, pp = engine.tensor_parallel(p.args, 0)
            except EngineError:
                return True
            if tp * pp != gpus:
                return True
    return False
