"""Whether a SetContext or SetGPUs asks for anything the model does not already say: a change
is a no-op by what its caller asked, never by what the planner filled in on the way (a default
max_output, a parallel flag the engine's default already equals)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleet_svc.domain.catalog import gang_nodes, node_cards
from llmgw.engines import registry
from llmgw.engines.base import Engine
from llmgw.engines.errors import EngineError
from llmgw.model import Model, Profile


@dataclass(frozen=True)
class ContextAsk:
    """What a SetContext asks: `tokens` of context a request, `slots` llama.cpp slots (0: keep
    each profile's), `sequences` concurrent requests of `tokens` the context must fit (0: none
    asked; the planner writes it to each engine's batch flag, llama.cpp's slots)."""

    tokens: int
    slots: int = 0
    sequences: int = 0


@dataclass(frozen=True)
class GPUsAsk:
    """What a SetGPUs asks: `gpus` cards a replica of `profile` ("": every GPU profile), and
    `sequences` concurrent requests at each profile's context to fit (0: none asked)."""

    gpus: int
    profile: str = ""
    sequences: int = 0


def _batch_differs(engine: Engine, args: Sequence[str], sequences: int) -> bool:
    """Whether a batch of `sequences` (0: none asked) is not what `args` run with: the
    engine's batch flag's value (`batch_flag`, as the planner writes it), or for an engine
    without one its slots (llama.cpp's `--parallel`).

    Raises:
        EngineError: args the engine's grammar refuses.
    """
    if sequences <= 0:
        return False
    flag = getattr(engine, "batch_flag", ())
    if isinstance(flag, tuple) and flag:
        return engine.grammar.get_int(args, flag) != sequences
    return engine.slots(args) != sequences


def context_asked(model: Model, ask: ContextAsk) -> bool:
    """Whether serving `ask.tokens` of context (with its slots and batch) changes anything:
    the model's context, a profile's (its engine's reading of its args, where they say one),
    a profile's slots or its batch. A profile whose engine is not known counts as a change
    (the planner refuses it)."""
    if model.context_length != ask.tokens:
        return True
    for p in model.profiles:
        engine = registry.find(p.engine)
        if engine is None:
            return True
        try:
            said = engine.context_tokens(p.args)
            if said and said != ask.tokens:
                return True
            if ask.slots and engine.slots(p.args) != ask.slots:
                return True
            if _batch_differs(engine, p.args, ask.sequences):
                return True
        except EngineError:
            return True
    return False


def _gpu_profiles(model: Model, profile: str) -> list[Profile]:
    return [p for p in model.profiles if (p.name == profile if profile else not p.on_cpu)]


def gpus_asked(model: Model, ask: GPUsAsk) -> bool:
    """Whether `ask.gpus` cards a replica (of `ask.profile`, or of every GPU profile when "")
    changes anything: a profile's cards, the parallel sizes its args run with, or its batch. A
    profile spanning nodes, or whose engine is not known, counts as a change (the planner
    decides it)."""
    targets = _gpu_profiles(model, ask.profile)
    if not targets:
        return True
    for p in targets:
        engine = registry.find(p.engine)
        if engine is None or p.on_cpu or gang_nodes(p) != 1 or node_cards(p) != ask.gpus:
            return True
        try:
            if engine.splits_by_heads:
                tp, pp = engine.tensor_parallel(p.args, 0)
                if tp * pp != ask.gpus:
                    return True
            if _batch_differs(engine, p.args, ask.sequences):
                return True
        except EngineError:
            return True
    return False
