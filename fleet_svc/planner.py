"""What the fleet asks of the planner, in the fleet's own terms: the one seam between them.

The fleet's application layer calls a `Planner`; `fleet_svc.rpc.planner` implements it over
gRPC and is the only fleet module that sees the planner's transport or its messages (its
refusals reach the caller unchanged; its silence is `PlannerUnavailable`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from fleet_svc.domain.catalog import Entry
from llmgw.model import Inventory, Profile


@dataclass(frozen=True)
class Planned:
    """The planner's answer: the profiles to write back and, for a context change, the context
    and output it sized. `report` is the planner's account of the change in its client's own
    form; the fleet hands it back to its caller unread."""

    profiles: tuple[Profile, ...]
    report: Any
    context_length: int = 0
    max_output: int = 0
    unchecked: str = ""
    """Why the plan is not checked (the planner could not read the model's shape: its verdict
    NOT_CHECKED); "" for a checked plan."""


class Planner(Protocol):
    """The planner's two calls the fleet makes."""

    async def size_context(
        self, entry: Entry, inventory: Inventory, *, tokens: int, slots: int
    ) -> Planned:
        """Profiles serving `tokens` of context (`slots` sequences for llama.cpp).

        Raises:
            PlannerUnavailable: the planner did not answer.
            Exception: the planner's refusal, as its client raises it.
        """

    async def plan_gpus(
        self, entry: Entry, inventory: Inventory, *, gpus: int, profile: str
    ) -> Planned:
        """Profiles running on `gpus` cards a replica (one profile, or every GPU one when "").

        Raises:
            as size_context.
        """

    async def close(self) -> None:
        """Release the connection."""
