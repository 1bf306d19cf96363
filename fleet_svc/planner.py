"""What the fleet asks of the planner, in the fleet's own terms: the one seam between them.

The fleet's application layer calls a `Planner`; `fleet_svc.rpc.planner` implements it over
gRPC and is the only fleet module that sees the planner's transport or its messages (its
refusals reach the caller unchanged; its silence is `PlannerUnavailable`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from fleet_svc.domain.asked import ContextAsk, GPUsAsk
from fleet_svc.domain.catalog import Entry
from llmgw.model import Inventory, Profile


@dataclass(frozen=True)
class BatchAnswer:
    """The planner's word on a batch asked of one profile: whether `sequences` concurrent
    requests of `tokens` fit (the cards hold the profile and its KV pool every request at full
    length), how many of that length the pool holds, and the engine flag it was written to."""

    profile: str
    engine: str
    sequences: int
    tokens: int
    fits: bool
    contexts_held: int
    flag: str


@dataclass(frozen=True)
class Planned:
    """The planner's answer: the profiles to write back and, for a context change, the context
    and output it sized. `report` is the planner's account of the change as it sent it (its
    serialized change message): the fleet reads what it needs into the fields beside it and
    hands the rest back to its caller unread, so no planner message travels through the
    fleet's core."""

    profiles: tuple[Profile, ...]
    report: bytes
    context_length: int = 0
    max_output: int = 0
    unchecked: str = ""
    """Why the plan is not checked (the planner could not read the model's shape: its verdict
    NOT_CHECKED); "" for a checked plan."""
    batches: tuple[BatchAnswer, ...] = ()
    """Per sized profile, when a batch was asked: whether it fits (empty otherwise)."""


class Planner(Protocol):
    """The planner's two calls the fleet makes."""

    async def size_context(self, entry: Entry, inventory: Inventory, ask: ContextAsk) -> Planned:
        """Profiles serving `ask.tokens` of context (`ask.slots` slots for llama.cpp, and a
        batch of `ask.sequences` where asked).

        Raises:
            PlannerUnavailable: the planner did not answer.
            Exception: the planner's refusal, as its client raises it.
        """

    async def plan_gpus(self, entry: Entry, inventory: Inventory, ask: GPUsAsk) -> Planned:
        """Profiles running on `ask.gpus` cards a replica (one profile, or every GPU one when
        ""), with a batch of `ask.sequences` where asked.

        Raises:
            as size_context.
        """

    async def close(self) -> None:
        """Release the connection."""
