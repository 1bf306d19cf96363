"""What the application layer's changes are given and answer (options, results), and the
view of the controller a change reads while its transaction runs on a store thread."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from fleet_svc.domain.canary import Policy
from fleet_svc.domain.catalog import Revision
from fleet_svc.domain.nodes import NodeView
from fleet_svc.domain.replicas import ReplicaState
from fleet_svc.domain.rollout import RolloutState, Strategy

ADOPT_WAIT_S = 5.0
"""How long a change's answer waits for the controller to take the change up, so the caller
reads its rollout started (or cancelled); past it (a store failing for the controller) the
answer goes out and the next tick takes the change up."""
TRAFFIC_KEPT_S = 86400.0
"""How long the gateways' traffic reports are kept (a canary's step windows lie within)."""
ACTIVE = (RolloutState.PENDING.value, RolloutState.RUNNING.value)
"""The stored states of a rollout that has not ended."""


@dataclass(frozen=True)
class View:
    """The controller's replicas and nodes as a change reads them (never writes them): the
    room it checks and the steps it plans. Taken on the event loop, where the controller
    changes them, before the change's transaction runs on a store thread."""

    replicas: Mapping[str, ReplicaState]
    nodes: Mapping[str, NodeView]
    handed: list[str] = field(default_factory=list)
    """Filled by the change: the rollouts and requests it wrote for the controller."""


CURRENT_VIEW: contextvars.ContextVar[View] = contextvars.ContextVar("fleet_view")
"""The view the change being committed reads (FleetApp.once sets it for its transaction)."""

T = TypeVar("T")


def in_view(commit: Callable[[], T], view: View) -> T:
    CURRENT_VIEW.set(view)
    return commit()


@dataclass(frozen=True)
class ChangeOptions:
    """How a change is carried out: who asks, whether only to check, and how to roll it out."""

    by: str
    dry_run: bool = False
    strategy: Strategy = Strategy.BESIDE
    supersede: bool = False
    """Cancel a rollout of the model in progress instead of being refused by it."""
    surge: int = 0
    allow_unchecked: bool = False
    """Apply a plan the planner could not check (the model's shape unread)."""
    canary: Policy | None = None
    """The canary's policy (strategy CANARY; None for the others)."""


@dataclass(frozen=True)
class Applied:
    """What a change did: the revision (as committed; for a dry run as it would be, unwritten:
    revision 0, no etag) and the rollout carrying it out ("" for a dry run or when no replica
    needs replacing). `unchanged`: the model already was as asked, so nothing was written and
    `revision` is the current one."""

    revision: Revision
    rollout_id: str
    restarted: int
    unchanged: bool = False
