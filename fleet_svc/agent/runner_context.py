"""What every replica runner of an agent shares (RunnerContext), and where runners' spans come
from (Spans)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from fleet_svc.agent.cards import CardBackend
from fleet_svc.agent.config import AgentConfig
from fleet_svc.agent.fetch import ModelCache
from llmgw.clock import Clock


class Spans(Protocol):
    """Where a runner's spans come from: llmgw.tracing.ChildSpans where the agent traces
    (OpenTelemetry stays out of the agent's core), NoSpans where it does not."""

    def start(self, name: str, traceparent: str, **attributes: str | int) -> Any:
        """A span started as a child of `traceparent`; None when there is none to join."""

    def current(self, span: Any) -> AbstractContextManager[None]:
        """`span` (or None) made current for a block, so log lines there carry its ids."""

    def end(self, span: Any, error: str = "") -> None:
        """End a span that `start` returned, failed with `error` when one is given."""


class NoSpans:
    """No tracing: no span is ever started."""

    def start(self, name: str, traceparent: str, **attributes: str | int) -> Any:
        return None

    def current(self, span: Any) -> AbstractContextManager[None]:
        return nullcontext()

    def end(self, span: Any, error: str = "") -> None:
        pass


@dataclass(frozen=True)
class RunnerContext:
    """What every runner of an agent shares."""

    config: AgentConfig
    cards: CardBackend
    state_dir: Path
    clock: Clock
    rand: Callable[[], float]
    http: httpx.AsyncClient
    spans: Spans = field(default_factory=NoSpans)
    models: ModelCache | None = None
    """Where URL sources are fetched to for engines that have the agent fetch them (None:
    such a replica cannot start)."""

    @property
    def records_dir(self) -> Path:
        """Where each running replica's record is kept for an agent that restarts."""
        return self.state_dir / "replicas"

    @property
    def logs_dir(self) -> Path:
        """Where the replicas' logs are."""
        return self.state_dir / "logs"
