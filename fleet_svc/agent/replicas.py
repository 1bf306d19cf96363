"""The node's replicas: one runner per desired replica, made to match each desired set."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx
import structlog

from fleet_svc.agent.admission import SourceRules
from fleet_svc.agent.cards import CardBackend
from fleet_svc.agent.config import AgentConfig
from fleet_svc.agent.fetch import ModelCache
from fleet_svc.agent.process import AdoptedProcess, read_records
from fleet_svc.agent.reconcile import plan_changes
from fleet_svc.agent.replica import Observation, ReplicaSpec
from fleet_svc.agent.runner import ReplicaRunner
from fleet_svc.agent.runner_context import NoSpans, RunnerContext, Spans
from llmgw.clock import Clock, SystemClock
from llmgw.rejection import Rejection

log = structlog.get_logger("fleet_svc.agent.replicas")


class ReplicaSet:
    """The replicas this agent runs.

    `apply` takes the node's whole desired set and returns at once with what it refused; the
    runners then start and stop processes and report each change to `listener` (set by the
    stream client; changes while it is None are still visible through `observed`).
    """

    def __init__(
        self,
        config: AgentConfig,
        cards: CardBackend,
        state_dir: Path,
        clock: Clock | None = None,
        rand: Callable[[], float] = random.random,
        spans: Spans | None = None,
    ) -> None:
        self.config = config
        self.cards = cards
        self.card_indices = [c.index for c in cards.read()]
        self._ctx = RunnerContext(
            config=config,
            cards=cards,
            state_dir=state_dir,
            clock=clock or SystemClock(),
            rand=rand,
            # No proxies from the environment: health checks go to loopback engines.
            http=httpx.AsyncClient(trust_env=False),
            spans=spans or NoSpans(),
            models=ModelCache(state_dir / "models", config.fetch_max_bytes),
        )
        self._runners: dict[str, ReplicaRunner] = {}
        self._stopping: dict[ReplicaRunner, asyncio.Task[None]] = {}
        self.listener: Callable[[Observation], None] | None = None

    def _changed(self, obs: Observation) -> None:
        if self.listener is not None:
            self.listener(obs)

    def running(self) -> dict[str, ReplicaSpec]:
        """Replica id -> the spec its runner runs (whatever its phase)."""
        return {rid: r.spec for rid, r in self._runners.items()}

    def observed(self) -> list[Observation]:
        """Every replica the agent has: desired ones and ones still stopping."""
        runners = [*self._runners.values(), *self._stopping]
        return [r.observation for r in sorted(runners, key=lambda r: r.spec.key)]

    def adopt(self) -> list[ReplicaSpec]:
        """Take over the engines an earlier agent on this node left running (their run
        records name live processes), so a restarted agent does not start them twice; the
        records of processes that are gone are dropped. Returns the adopted specs."""
        adopted = []
        records_dir = self._ctx.records_dir
        for record in read_records(records_dir):
            engine = self.config.engines.get(record.spec.engine)
            alive = AdoptedProcess(record.pid, record.start_ticks, 1.0).alive()
            if engine is None or not alive or record.spec.replica_id in self._runners:
                # A gone process's record (and its claims) are stale; an engine no longer
                # configured must not be kept running by this agent either.
                if alive:
                    log.warning(
                        "replica_not_adopted",
                        replica_id=record.spec.replica_id,
                        pid=record.pid,
                        engine=record.spec.engine,
                    )
                if not alive:
                    self.cards.release(record.pid)
                with contextlib.suppress(FileNotFoundError):
                    (records_dir / f"{record.spec.replica_id}.json").unlink()
                continue
            runner = ReplicaRunner(record.spec, engine, self._ctx, self._changed, adopt=record)
            self._runners[record.spec.replica_id] = runner
            runner.start()
            adopted.append(record.spec)
        return adopted

    def apply(
        self, desired: Sequence[ReplicaSpec], stop_traces: Mapping[str, str] | None = None
    ) -> list[Rejection]:
        """Make the replicas match `desired` (the node's whole set); returns the refused specs.
        A replica stopped whose id `stop_traces` holds is stopped in a child span of that
        trace context.

        Idempotent per (replica_id, revision): a spec already running is left alone. A
        replica's new revision starts once its old process is gone, as does a replica whose
        cards a stopping one still holds.
        """
        changes = plan_changes(
            desired,
            self.running(),
            self.config.arg_rules(),
            self.card_indices,
            SourceRules(self.config.source_roots, os.path.realpath),
        )
        for replica_id in changes.stop:
            runner = self._runners.pop(replica_id)
            cause = (stop_traces or {}).get(replica_id, "")
            self._stopping[runner] = asyncio.create_task(self._stop(runner, cause))
        for spec in changes.start:
            after = [
                task
                for old, task in self._stopping.items()
                if old.spec.replica_id == spec.replica_id or set(old.spec.gpus) & set(spec.gpus)
            ]
            engine = self.config.engines[spec.engine]
            runner = ReplicaRunner(spec, engine, self._ctx, self._changed, after=after)
            self._runners[spec.replica_id] = runner
            runner.start()
        for rejection in changes.rejected:
            log.warning(
                "replica_rejected",
                replica_id=rejection.replica_id,
                revision=rejection.revision,
                reason=rejection.reason,
                message=rejection.message,
            )
        return list(changes.rejected)

    async def _stop(self, runner: ReplicaRunner, traceparent: str = "") -> None:
        try:
            await runner.stop(traceparent)
        finally:
            self._stopping.pop(runner, None)

    async def stop_all(self) -> None:
        """Stop every replica and wait until all are gone."""
        self.apply([])
        await self.wait_stopped()

    async def wait_stopped(self) -> None:
        """Wait for the stops under way."""
        while self._stopping:
            await asyncio.gather(*self._stopping.values(), return_exceptions=True)

    async def aclose(self, stop_replicas: bool = True) -> None:
        """Release the set: stop its replicas (or, asked not to, leave them running for the
        next agent to adopt) and close the health checks' HTTP client."""
        if stop_replicas:
            await self.stop_all()
        else:
            for runner in self._runners.values():
                await runner.detach()
            await self.wait_stopped()
        await self._ctx.http.aclose()
        if self._ctx.models is not None:
            await self._ctx.models.aclose()
