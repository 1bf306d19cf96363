"""The replica runner: one engine process supervised from start to stop.

It starts the engine on a free port with the replica's cards, health-checks it, restarts it
with backoff when it crashes (FAILED past the restart limit), and stops it with SIGTERM then
SIGKILL. Every change of phase is reported through `on_change`. Engines run in their own
session (process group), so signals reach the workers they spawn, and the agent's own signals
(a Ctrl-C at its terminal) do not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import structlog

from fleet_svc.agent.backoff import recent_crashes
from fleet_svc.agent.config import EngineConfig
from fleet_svc.agent.fetch import fetch_source, file_name
from fleet_svc.agent.gang import GangRefused, member_command, serves_http
from fleet_svc.agent.host import free_port
from fleet_svc.agent.logs import ReplicaLog
from fleet_svc.agent.model_list import missing_model
from fleet_svc.agent.process import (
    UNKNOWN_EXIT,
    AdoptedProcess,
    ChildProcess,
    EngineProcess,
    RunRecord,
    exit_text,
    process_start_ticks,
    signal_group,
    wait_group_gone,
)
from fleet_svc.agent.progress import Gate, HubWatch
from fleet_svc.agent.replica import Observation, Phase, Progress, ReplicaSpec, Stage
from fleet_svc.agent.runner_context import RunnerContext
from fleet_svc.agent.secrets import SecretError, resolve_all

log = structlog.get_logger("fleet_svc.agent.runner")

# The folder holding the package `fleet_svc`: put on PYTHONPATH for engines run as modules, so
# the stand-in imports whatever the agent's working directory.
_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])


class ReplicaRunner:
    """Supervises one replica's engine until it is stopped.

    Args:
        spec: what to run.
        engine: the configured engine that runs it.
        ctx: what the agent's runners share.
        on_change: called with every new observation (a phase change, a new pid or address).
        after: tasks to wait for before the first start (stops of replicas whose cards or
            replica id this one takes over).
        adopt: a process an earlier agent started for this very spec, to watch instead of
            starting one.
    """

    def __init__(
        self,
        spec: ReplicaSpec,
        engine: EngineConfig,
        ctx: RunnerContext,
        on_change: Callable[[Observation], None],
        after: Sequence[asyncio.Task[None]] = (),
        adopt: RunRecord | None = None,
    ) -> None:
        self.spec = spec
        self._engine = engine
        self._ctx = ctx
        self._on_change = on_change
        self._after = list(after)
        self._adopt = adopt
        self._log = ReplicaLog(ctx.logs_dir, spec.replica_id, ctx.config.log_max_bytes)
        self._record_path = ctx.records_dir / f"{spec.replica_id}.json"
        self._proc: EngineProcess | None = None
        self._spawning: asyncio.Task[EngineProcess | None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._crashes: list[float] = []
        self._restarts = adopt.restarts if adopt else 0
        self._port = adopt.port if adopt else 0
        self._gang_port = adopt.gang_port if adopt else 0
        self._serves_http = serves_http(engine, spec)
        self._obs = Observation(
            spec=spec, phase=Phase.STARTING, restarts=self._restarts, since_s=ctx.clock.wall()
        )
        self._bound = log.bind(replica_id=spec.replica_id, revision=spec.revision)
        self._start_span = ctx.spans.start("agent replica start", spec.traceparent, **self._attrs())
        """The start (and health checks until healthy) as part of the request that asked for
        it; None when untraced, and once it ended."""

    def _attrs(self) -> dict[str, str | int]:
        spec = self.spec
        return {
            "llmgw.replica_id": spec.replica_id,
            "llmgw.revision": spec.revision,
            "llmgw.model": spec.model,
            "llmgw.engine": spec.engine,
        }

    def _end_start_span(self, error: str = "") -> None:
        if self._start_span is not None:
            self._ctx.spans.end(self._start_span, error)
            self._start_span = None

    @property
    def observation(self) -> Observation:
        """The replica as last observed."""
        return self._obs

    @property
    def done(self) -> bool:
        """Whether the runner has nothing more to do: stopped, or failed for good."""
        return self._obs.phase in (Phase.STOPPED, Phase.FAILED)

    def start(self) -> None:
        """Begin supervising (returns at once; phases are reported through on_change)."""
        if self._task is None:
            self._task = asyncio.create_task(self._supervise(), name=f"replica-{self.spec.key}")

    def _report(self, phase: Phase, event: str | None = None, **fields: Any) -> None:
        with self._ctx.spans.current(self._start_span):
            self._observe(phase, event, **fields)
        if self._start_span is not None:
            self._start_span.add_event(phase.value, {"message": self._obs.message})
            if phase is Phase.HEALTHY:
                self._end_start_span()
            elif phase is Phase.FAILED:
                self._end_start_span(self._obs.message)

    def _observe(self, phase: Phase, event: str | None = None, **fields: Any) -> None:
        changed = phase != self._obs.phase
        # Progress is a starting replica's: kept while STARTING until told anew, gone after.
        progress = fields.pop("progress", self._obs.progress)
        self._obs = replace(
            self._obs,
            phase=phase,
            progress=progress if phase is Phase.STARTING else None,
            restarts=self._restarts,
            since_s=self._ctx.clock.wall() if changed else self._obs.since_s,
            **fields,
        )
        if event:
            self._bound.info(
                event,
                phase=phase.value,
                pid=self._obs.pid,
                address=self._obs.address,
                restarts=self._restarts,
                exit_code=self._obs.exit_code,
                message=self._obs.message,
            )
        self._on_change(self._obs)

    def _address(self) -> str:
        return f"{self._advertise()}:{self._port}"

    def _advertise(self) -> str:
        return self._ctx.config.advertise_host or self._ctx.config.engine_host

    def _gang_address(self) -> str:
        """Where this gang member listens for its gang ("" when it does not)."""
        return f"{self._advertise()}:{self._gang_port}" if self._gang_port else ""

    async def _supervise(self) -> None:
        try:
            if self._after:
                await asyncio.wait(self._after)
            adopted = self._adopt
            while not self._stopping:
                if adopted is not None:
                    proc: EngineProcess | None = AdoptedProcess(
                        adopted.pid, adopted.start_ticks, self._ctx.config.health_interval_s
                    )
                    self._proc = proc
                    self._report(
                        Phase.STARTING,
                        "replica_adopted",
                        pid=adopted.pid,
                        address=self._address() if self._serves_http else "",
                        gang_address=self._gang_address(),
                        message="adopted from an earlier agent",
                    )
                    adopted = None
                else:
                    # Fetched outside the shielded start: a stop cancels a long download.
                    spec = await self._fetched()
                    proc = None
                    if spec is not None:
                        self._spawning = asyncio.create_task(self._spawn(spec))
                        proc = await asyncio.shield(self._spawning)
                if proc is None:
                    code, why = UNKNOWN_EXIT, self._obs.message
                else:
                    code, why = await self._watch(proc)
                if self._stopping:
                    return
                if not await self._crashed(proc, code, why):
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a supervisor that dies silently leaves a replica unwatched
            self._bound.exception("replica_supervision_failed")
            self._report(Phase.FAILED, message=f"the agent failed to supervise it: {exc}")

    async def _fetched(self) -> ReplicaSpec | None:
        """The spec to start: as it is, or, for an engine the agent fetches URL sources for,
        with the source replaced by the cached file (progress reported as STARTING messages);
        None (after reporting why) when it cannot be fetched."""
        spec = self.spec
        if not self._engine.fetches(spec.source):
            return spec

        name = file_name(spec.source)
        gate = Gate(self._ctx.clock.monotonic)

        def say(message: str) -> None:
            started = Progress(Stage.DOWNLOADING, files_total=1, file=name)
            self._report(Phase.STARTING, message=message, pid=0, progress=started)

        def fetching(got: int, size: int) -> None:
            # Every chunk calls this; at most one report a second goes up the stream.
            if gate.due(got, final=got >= size):
                now = Progress(
                    Stage.DOWNLOADING,
                    done_bytes=got,
                    total_bytes=size,
                    rate_bytes_per_s=gate.rate_bytes_per_s,
                    files_done=1 if got >= size else 0,
                    files_total=1,
                    file=name,
                )
                self._report(Phase.STARTING, pid=0, progress=now)

        local, note = await fetch_source(self._ctx.models, spec.source, say, fetching)
        self._log.note(note)
        if not local:
            self._report(Phase.STARTING, "replica_fetch_failed", message=note, pid=0)
            return None
        return replace(spec, source=local)

    async def _spawn(self, spec: ReplicaSpec) -> EngineProcess | None:
        """Start the engine on `spec` (the replica's, its source fetched); None (after
        reporting why) when it cannot be executed."""
        ctx, engine = self._ctx, self._engine
        self._port = free_port(ctx.config.engine_host, self._port)
        if spec.gang is not None:
            try:
                member = member_command(
                    engine,
                    spec,
                    ctx.config.engine_host,
                    self._port,
                    self._advertise(),
                    lambda: free_port(ctx.config.engine_host, self._gang_port),
                )
            except GangRefused as exc:
                self._log.note(str(exc))
                self._report(Phase.STARTING, message=str(exc), pid=0)
                return None
            argv, self._gang_port = member.argv, member.gang_port
        else:
            argv = engine.command(spec, ctx.config.engine_host, self._port)
        try:
            secrets = resolve_all(engine.secret_env)
        except SecretError as exc:
            # The message names the variable and its source, never a value.
            self._log.note(str(exc))
            self._report(Phase.STARTING, message=str(exc), pid=0)
            return None
        env = dict(os.environ)
        env.update(engine.env)
        env.update(secrets)
        env.update(ctx.cards.env_for(spec.gpus))
        # Which cards the engine sees; none ("") for a CPU replica, so it cannot take any.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpus)
        env["LLMGW_REPLICA_ID"] = spec.replica_id
        if engine.module:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (_PROJECT_ROOT, env.get("PYTHONPATH", "")) if p
            )
        self._log.cap()
        self._log.note(f"starting revision {spec.revision}: {json.dumps(argv)}")
        fd = self._log.open_for_engine()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=fd,
                stderr=fd,
                env=env,
                cwd=str(ctx.state_dir),
                start_new_session=True,
            )
        except OSError as exc:
            self._log.note(f"could not execute {argv[0]}: {exc}")
            self._report(Phase.STARTING, message=f"could not execute {argv[0]}: {exc}", pid=0)
            return None
        finally:
            os.close(fd)
        child = ChildProcess(proc)
        self._proc = child
        self._write_record(child.pid)
        self._report(
            Phase.STARTING,
            "replica_started",
            pid=child.pid,
            address=self._address() if self._serves_http else "",
            gang_address=self._gang_address(),
            exit_code=0,
            message="",
            log_tail=(),
            progress=Progress(Stage.LOADING, file=Path(spec.source).name),
        )
        return child

    def _write_record(self, pid: int) -> None:
        record = RunRecord(
            self.spec, pid, self._port, process_start_ticks(pid), self._restarts, self._gang_port
        )
        self._record_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._record_path.with_suffix(".tmp")
        tmp.write_text(record.to_json())
        os.replace(tmp, self._record_path)

    async def _probe(self) -> bool:
        if not self._serves_http:
            # A headless gang member or an RPC worker: running is all it shows; the head's
            # health says whether the gang formed.
            return True
        url = f"http://{self._ctx.config.engine_host}:{self._port}{self._engine.health_path}"
        try:
            response = await self._ctx.http.get(url, timeout=self._ctx.config.health_timeout_s)
        except (httpx.HTTPError, OSError):
            return False
        return response.status_code == 200

    async def _missing_model(self) -> str:
        """Why the engine does not serve the replica's model yet ("" once it does, or when it
        has no model list or serves no HTTP): `model_list.missing_model`."""
        path = self._engine.models_path
        if not self._serves_http or not path:
            return ""
        return await missing_model(
            self._ctx.http,
            f"http://{self._ctx.config.engine_host}:{self._port}",
            self._engine.served_name(self.spec),
            health_path=self._engine.health_path,
            models_path=path,
            timeout_s=self._ctx.config.health_timeout_s,
        )

    async def _watch(self, proc: EngineProcess) -> tuple[int, str]:
        """Health-check `proc` until it exits; its exit code and, when the agent ended it,
        why."""
        cfg = self._ctx.config
        exited = asyncio.create_task(proc.wait())
        started_s = self._ctx.clock.monotonic()
        failures = 0
        downloads = HubWatch(
            self.spec.source, {**os.environ, **self._engine.env}, self._ctx.clock.monotonic
        )
        try:
            while True:
                done, _ = await asyncio.wait({exited}, timeout=cfg.health_interval_s)
                if done:
                    code = exited.result()
                    return (UNKNOWN_EXIT if code is None else code), ""
                self._log.cap()
                if self._obs.phase == Phase.STARTING:
                    seen = downloads.seen(self._obs.progress)
                    if seen is not None:
                        self._report(Phase.STARTING, progress=seen)
                healthy = await self._probe()
                missing = ""
                if healthy and self._obs.phase == Phase.STARTING:
                    # Only until it first serves: a model list is what readiness needs, and
                    # an engine back from UNHEALTHY was serving it already.
                    missing = await self._missing_model()
                if healthy and not missing:
                    failures = 0
                    if self._obs.phase != Phase.HEALTHY and not exited.done():
                        self._report(Phase.HEALTHY, "replica_healthy", message="")
                    continue
                phase = self._obs.phase
                if phase == Phase.STARTING:
                    if missing and missing != self._obs.message and not exited.done():
                        self._report(Phase.STARTING, "replica_model_missing", message=missing)
                    waited_s = self._ctx.clock.monotonic() - started_s
                    if waited_s > self._engine.start_timeout_s:
                        # Stuck loading: end it and count it as a crash, so backoff and the
                        # restart limit apply as to any failed start.
                        why = (
                            f"{self._engine.health_path} did not answer 200 within "
                            f"{self._engine.start_timeout_s:g} s"
                            if not missing
                            else f"{missing}, {self._engine.start_timeout_s:g} s after it started"
                        )
                        self._log.note(why + "; killing it")
                        signal_group(proc.pid, signal.SIGKILL)
                        code = await exited
                        return (UNKNOWN_EXIT if code is None else code), why
                    continue
                failures += 1
                if phase == Phase.HEALTHY and failures >= cfg.unhealthy_after:
                    self._report(
                        Phase.UNHEALTHY,
                        "replica_unhealthy",
                        message=f"{self._engine.health_path} failed {failures} checks in a row",
                    )
        finally:
            if not exited.done():
                exited.cancel()

    async def _crashed(self, proc: EngineProcess | None, code: int, why: str) -> bool:
        """Report a crash and wait out the backoff; False when past the restart limit."""
        ctx = self._ctx
        if proc is not None:
            # Workers the engine left behind in its group would hold the cards.
            signal_group(proc.pid, signal.SIGKILL)
            await self._group_gone(proc.pid)
            ctx.cards.release(proc.pid)
        self._proc = None
        with contextlib.suppress(FileNotFoundError):
            self._record_path.unlink()
        now = ctx.clock.monotonic()
        limit = ctx.config.restart_limit
        self._crashes = recent_crashes([*self._crashes, now], now, limit.window_s)
        message = why or exit_text(code)
        tail = tuple(self._log.tail(ctx.config.log_tail_lines))
        self._log.note(message)
        if self.spec.gang is not None:
            # One rank cannot rejoin a running torch.distributed group or RPC backend: the
            # fleet fails the whole gang and places it again.
            self._report(
                Phase.FAILED,
                "replica_failed",
                pid=0,
                exit_code=code,
                log_tail=tail,
                message=f"{message}; a gang member is not restarted alone",
            )
            return False
        if limit.exceeded(self._crashes, now):
            self._report(
                Phase.FAILED,
                "replica_failed",
                pid=0,
                exit_code=code,
                log_tail=tail,
                message=(
                    f"{message}; {len(self._crashes)} crashes within "
                    f"{limit.window_s:g} s, not restarting"
                ),
            )
            return False
        delay_s = ctx.config.restart_backoff.delay_s(len(self._crashes) - 1, ctx.rand())
        self._report(
            Phase.CRASHED,
            "replica_crashed",
            pid=0,
            exit_code=code,
            log_tail=tail,
            message=f"{message}; restarting in {delay_s:.1f} s",
        )
        await ctx.clock.sleep(delay_s)
        self._restarts += 1
        return True

    async def stop(self, traceparent: str = "") -> None:
        """Stop the engine: SIGTERM to its group, SIGKILL after the engine's grace; report
        STOPPED once the process is gone and its cards are released. Safe to call twice.
        With `traceparent` (the request that stopped it) the stop is a child span of it."""
        if self._stop_task is None:
            self._stop_task = asyncio.create_task(self._traced_stop(traceparent))
        await asyncio.shield(self._stop_task)

    async def _traced_stop(self, traceparent: str) -> None:
        self._end_start_span()  # stopped before it turned healthy: the start ends here
        spans = self._ctx.spans
        span = spans.start("agent replica stop", traceparent, **self._attrs())
        with spans.current(span):
            try:
                await self._stop()
            finally:
                if span is not None:
                    spans.end(span)

    async def _stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._spawning is not None and not self._spawning.done():
            # Let a start under way finish, so its process is stopped rather than orphaned.
            with contextlib.suppress(asyncio.CancelledError):
                await self._spawning
        proc = self._proc
        if proc is not None:
            await self._terminate(proc)
            self._ctx.cards.release(proc.pid)
        self._proc = None
        with contextlib.suppress(FileNotFoundError):
            self._record_path.unlink()
        self._report(Phase.STOPPED, "replica_stopped", pid=0, message="stopped as desired")

    async def detach(self) -> None:
        """Stop watching and leave the engine running, its run record in place, for the next
        agent on this node to adopt (the agent's `--leave-replicas` shutdown)."""
        self._end_start_span()
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._spawning is not None and not self._spawning.done():
            with contextlib.suppress(asyncio.CancelledError):
                await self._spawning
        self._bound.info("replica_detached", pid=self._obs.pid)

    async def _terminate(self, proc: EngineProcess) -> None:
        grace_s = self._engine.stop_grace_s
        self._report(Phase.STOPPING, "replica_stopping", message="SIGTERM sent")
        self._log.note(f"stopping: SIGTERM, SIGKILL after {grace_s:g} s")
        exited = asyncio.create_task(proc.wait())
        signal_group(proc.pid, signal.SIGTERM)
        done, _ = await asyncio.wait({exited}, timeout=grace_s)
        # Always: the engine's own workers may outlive it in its group.
        signal_group(proc.pid, signal.SIGKILL)
        if not done:
            self._log.note("still running after the grace: SIGKILL")
        await exited
        await self._group_gone(proc.pid)

    async def _group_gone(self, pgid: int) -> None:
        if not await wait_group_gone(pgid):
            self._bound.warning("replica_group_lingers", pgid=pgid)
