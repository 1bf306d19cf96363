"""Context plans kept for the servicer: a SizeContext of a context never asked before, of a
model, shape and inventory asked before, answered from the plan compiled for them
(`domain.context_plan`) and an answer template (`convert.size_template`).

A plan is kept by the identities of the decoded model and inventory
(`planner_svc.rpc.decoded`: the same objects for the same messages) and of the shape, and by
the request's slots, batch and note: `PlannerServicer._like`'s key, which is None for
messages too large to be kept decoded (those get no plan). Each entry holds those values, so
no identity in its key can be reused while it lives. A key is compiled the second time it is
seen, so values that are new objects every call (a shape given its weights from the files'
sizes) cost nothing but a look-up. Bounded: FRESH_PLANS_KEPT keys, the least recently used
go first. The plans live here, not on the model, shape or inventory values.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from llmgw.model import Inventory, Model
from llmgw.planner.v1 import planner_pb2
from llmgw.shape import ModelShape
from planner_svc.domain.context import ContextChange
from planner_svc.domain.context_plan import ContextPlan, compile_context
from planner_svc.rpc import convert

FRESH_PLANS_KEPT = 64
"""Keys (model × shape × inventory × slots × batch) whose plans are kept, at most."""

_SEEN = object()
"""An entry's plan before it is compiled: the key was seen once."""


class FreshPlans:
    """A bounded memory of compiled context plans and their answer templates."""

    def __init__(self, llamacpp_version: str, limit: int = FRESH_PLANS_KEPT) -> None:
        self._version = llamacpp_version
        self._limit = limit
        self._kept: OrderedDict[
            Hashable,
            tuple[object, planner_pb2.SizeContextResponse | None, tuple[object, ...]],
        ] = OrderedDict()

    def __len__(self) -> int:
        """How many keys are kept (compiled or seen once)."""
        return len(self._kept)

    def answer(
        self,
        key: Hashable | None,
        model: Model,
        shape: ModelShape | None,
        inventory: Inventory,
        *,
        tokens: int,
        slots: int,
        sequences: int,
        note: str,
    ) -> tuple[planner_pb2.SizeContextResponse, ContextChange] | None:
        """The answer and change for `tokens` from the plan kept under `key` (compiled now
        if the key was seen before); None when there is no plan or it does not decide this
        context (the caller sizes it the full way)."""
        if key is None:
            return None
        entry = self._kept.get(key)
        if entry is None:
            self._keep(key, (_SEEN, None, (model, shape, inventory)))
            return None
        self._kept.move_to_end(key)
        plan, template, held = entry
        if plan is _SEEN:
            plan = compile_context(
                model, shape, inventory, slots=slots, sequences=sequences, note=note
            )
            template = convert.size_template(plan, self._version) if plan is not None else None
            self._kept[key] = (plan, template, held)
        if not isinstance(plan, ContextPlan) or template is None:
            return None
        change = plan.change(tokens)
        if change is None:
            return None
        return convert.filled_size_answer(template, change), change

    def _keep(
        self,
        key: Hashable,
        entry: tuple[object, planner_pb2.SizeContextResponse | None, tuple[object, ...]],
    ) -> None:
        self._kept[key] = entry
        while len(self._kept) > self._limit:
            self._kept.popitem(last=False)
