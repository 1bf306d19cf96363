"""Bench: rollout overhead: a rollout's time beyond its replicas' own start time, per replica.

A SetContext change on a model of R one-card llama.cpp replicas (shape inline) rolls out beside
with surge 1: R new replicas, one after another, each started and turned healthy before the
old one it replaces is drained and stopped. Its time from the SetContext call to the end of
its WatchRollout stream, less R x the floor (one replica's own start time), over R, is the
control plane's overhead per replica (goal: under 0.5 s). The fleet's drain delay is set to 0:
it is a policy wait (a production drain of D s adds D per replica), not overhead.

Two variants:
- scripted: the fleet and the planner as child processes; scripted agents in this process
  (llmgw.testing.scripted_agent, real AgentService clients) report each new replica STARTING,
  then HEALTHY after exactly the floor (0.2 s);
- real: the same fleet and planner, real node agents (`python -m fleet_svc.agent`, one
  process per node, health checks every 50 ms) running the stand-in engine
  (`python -m fleet_svc.standin --load-s S`); the floor is the stand-in's own start time,
  measured here by starting it directly and polling its /health until it answers 200.

And two models' rollouts started together (scripted): each alone first, then both at once;
the ratio of the pair's wall time to the longer one alone (about 1 when they proceed in
parallel, about 2 when one waits for the other).

Run: `.venv/bin/python -m bench.rollout_overhead [--full] [--no-real]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx

from bench.agent_fanin import WAIT_S, start_fleet_child, wait_for
from bench.planner_throughput import LLAMA_8B, ROOT, ChildServer, start_child
from llmgw.agent.v1 import agent_pb2
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.scripted_agent import ScriptedAgent

NODES, CARDS = 3, 8
"""Nodes of 8 cards: room for 16 replicas and their surge, or two models of 4."""
SUCCEEDED = fleet_pb2.ROLLOUT_STATE_SUCCEEDED
READY = fleet_pb2.REPLICA_PHASE_READY

AGENT_CONFIG = """\
health_interval_s: 0.05
health_timeout_s: 1
engines:
  llamacpp:
    module: fleet_svc.standin
    family: llamacpp
    args: ["--host", "{{host}}", "--port", "{{port}}", "--model", "{{model}}",
           "--engine", "llamacpp", "--load-s", "{load_s}", "{{args}}"]
    start_timeout_s: 60
    stop_grace_s: 5
"""


def llamacpp_model(name: str, replicas: int) -> common_pb2.Model:
    """Llama-3.1-8B (inline shape) served by llama.cpp, one card a replica."""
    return common_pb2.Model(
        name=name,
        source="/models/llama.gguf",
        context_length=8192,
        shape=LLAMA_8B,
        profiles=[
            common_pb2.Profile(
                name="gguf",
                engine="llamacpp",
                args=["-c", "8192", "-np", "1", "-ngl", "99"],
                gpu_class="H100-80GB",
                gpus_per_node=1,
                replicas=replicas,
            )
        ],
    )


def floor_agent(address: str, node: str, floor_s: float) -> ScriptedAgent:
    """A scripted agent whose replicas report STARTING, then HEALTHY `floor_s` later."""
    agent: ScriptedAgent

    def healthy(spec: agent_pb2.ReplicaSpec) -> None:
        now = agent.running.get(spec.replica_id)
        if now is not None and now.revision == spec.revision:
            agent.report(spec, agent_pb2.PROCESS_PHASE_HEALTHY)

    def phase_for(spec: agent_pb2.ReplicaSpec) -> agent_pb2.ProcessPhase.ValueType:
        asyncio.get_running_loop().call_later(floor_s, healthy, spec)
        return agent_pb2.PROCESS_PHASE_STARTING

    agent = ScriptedAgent(address, node, gpus=CARDS, phase_for=phase_for)
    return agent


@asynccontextmanager
async def scripted_nodes(address: str, floor_s: float) -> AsyncIterator[None]:
    """NODES scripted agents of CARDS cards each, connected while the context lasts."""
    agents = [floor_agent(address, f"node-{i}", floor_s) for i in range(NODES)]
    for a in agents:
        a.start()
    try:
        yield
    finally:
        for a in agents:
            await a.stop()


@asynccontextmanager
async def real_nodes(address: str, folder: Path, load_s: float) -> AsyncIterator[None]:
    """NODES real agent processes running the stand-in engine, stopped (SIGTERM) after."""
    config = folder / "agent.yaml"
    config.write_text(AGENT_CONFIG.format(load_s=load_s))
    procs = []
    for i in range(NODES):
        log = (folder / f"agent-{i}.log").open("wb")
        procs.append(
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "fleet_svc.agent",
                *("--fleet", address, "--node", f"real-{i}", "--gpus", f"{CARDS}xH100-80GB"),
                *("--config", str(config), "--state-dir", str(folder / f"agent-{i}")),
                *("--log-format", "json"),
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=log,
                stderr=log,
            )
        )
        log.close()
    try:
        yield
    finally:
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                await asyncio.wait_for(p.wait(), 30)
            except TimeoutError:
                p.kill()
                await p.wait()


async def standin_floor_s(load_s: float, tries: int) -> float:
    """The stand-in's own start time: from spawning it to its first 200 on /health (median)."""
    times = []
    async with httpx.AsyncClient(timeout=1.0) as client:
        for _ in range(tries):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            start = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                *("-m", "fleet_svc.standin", "--port", str(port), "--load-s", str(load_s)),
                *("--engine", "llamacpp", "-c", "8192"),
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=asyncio.subprocess.DEVNULL,
            )
            try:
                while time.perf_counter() - start < WAIT_S:
                    with contextlib.suppress(httpx.HTTPError):
                        if (await client.get(f"http://127.0.0.1:{port}/health")).status_code == 200:
                            break
                    await asyncio.sleep(0.01)
                else:
                    raise RuntimeError(f"the stand-in did not turn healthy within {WAIT_S:.0f} s")
                times.append(time.perf_counter() - start)
            finally:
                proc.send_signal(signal.SIGTERM)
                await proc.wait()
    return statistics.median(times)


class Fleet:
    """The bench's handle on the fleet's API."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = fleet_pb2_grpc.FleetServiceStub(self.channel)

    async def ready(self, model: str) -> int:
        """How many replicas of `model` are READY."""
        listed = await self.stub.ListReplicas(fleet_pb2.ListReplicasRequest(model=model))
        return sum(1 for r in listed.replicas if r.phase == READY)

    async def create(self, model: str, replicas: int) -> None:
        """Create the model and wait until all its replicas are READY."""
        await self.stub.CreateModel(
            fleet_pb2.CreateModelRequest(model=llamacpp_model(model, replicas))
        )

        async def all_ready() -> bool:
            return await self.ready(model) == replicas

        await wait_for(all_ready, f"{replicas} replicas of {model} READY")

    async def delete(self, model: str) -> None:
        """Delete the model and wait until its replicas are gone."""
        await self.stub.DeleteModel(fleet_pb2.DeleteModelRequest(name=model))

        async def gone() -> bool:
            # Unfiltered: asking for a deleted model's replicas is NOT_FOUND.
            listed = await self.stub.ListReplicas(fleet_pb2.ListReplicasRequest())
            return not any(r.model == model for r in listed.replicas)

        await wait_for(gone, f"the replicas of {model} gone")

    async def rollout(self, model: str, tokens: int) -> Timed:
        """A SetContext rollout (surge 1), from the call to the end of its event stream.

        Raises:
            RuntimeError: the rollout did not succeed.
        """
        start = time.perf_counter()
        answer = await self.stub.SetContext(
            fleet_pb2.SetContextRequest(name=model, tokens=tokens, surge=1)
        )
        if not answer.rollout_id:
            raise RuntimeError(f"SetContext of {model} to {tokens} tokens started no rollout")
        events = []
        async for ev in self.stub.WatchRollout(
            fleet_pb2.WatchRolloutRequest(id=answer.rollout_id)
        ):  # the stream ends with the rollout
            kind = fleet_pb2.RolloutEventKind.Name(ev.kind).removeprefix("ROLLOUT_EVENT_KIND_")
            events.append((kind.lower(), ev.at.ToNanoseconds() / 1e9))
        elapsed = time.perf_counter() - start
        got = await self.stub.GetRollout(fleet_pb2.GetRolloutRequest(id=answer.rollout_id))
        if got.rollout.state != SUCCEEDED:
            raise RuntimeError(
                f"rollout of {model} ended {got.rollout.state}: {got.rollout.reason}"
            )
        return Timed(elapsed, events)

    async def rollout_s(self, model: str, tokens: int) -> float:
        """A rollout's time (see `rollout`)."""
        return (await self.rollout(model, tokens)).elapsed_s


@dataclass(frozen=True)
class Timed:
    """A rollout's time and its events (kind, the fleet's timestamp in seconds)."""

    elapsed_s: float
    events: list[tuple[str, float]]


STAGES = {
    "placement": ("replica_created", "replica_placed"),
    "start": ("replica_placed", "replica_ready"),
    "retire": ("replica_draining", "replica_stopped"),
    "next step": ("step_done", "step_started"),
}
"""Where a step's time goes: from one event kind to the next (surge 1: steps do not overlap)."""


def stage_gaps(events: list[tuple[str, float]]) -> dict[str, float]:
    """Per stage of STAGES, the median gap between its two events over the steps (stages
    with no pair, as "next step" of a one-step rollout, are left out)."""
    at: dict[str, list[float]] = {}
    for kind, t in events:
        at.setdefault(kind, []).append(t)
    gaps = {}
    for stage, (first, then) in STAGES.items():
        later = at.get(then, [])[1:] if stage == "next step" else at.get(then, [])
        pairs = [b - a for a, b in zip(at.get(first, []), later, strict=False)]
        if pairs:
            gaps[stage] = statistics.median(pairs)
    return gaps


def context_tokens(i: int) -> int:
    """Alternate between two contexts so every rollout is a change."""
    return 16384 if i % 2 == 0 else 8192


async def overhead_rows(
    fleet: Fleet, sizes: Sequence[int], repeats: int, floor_s: float, variant: str
) -> dict[str, float]:
    """Per R: the median rollout time, its overhead per replica and its ratio to R x floor."""
    figures: dict[str, float] = {}
    for r in sizes:
        model = f"{variant}-{r}"
        await fleet.create(model, r)
        timed = [await fleet.rollout(model, context_tokens(i)) for i in range(repeats)]
        await fleet.delete(model)
        rollout = statistics.median(t.elapsed_s for t in timed)
        figures[f"{variant}_rollout_s@{r}"] = rollout
        figures[f"{variant}_overhead_s@{r}"] = (rollout - r * floor_s) / r
        figures[f"{variant}_floor_ratio@{r}"] = rollout / (r * floor_s)
        for stage, gap in stage_gaps([e for t in timed for e in t.events]).items():
            figures[f"{variant}_stage_{stage.replace(' ', '_')}_s@{r}"] = gap
    figures[f"{variant}_floor_s"] = floor_s
    return figures


async def parallel_rows(fleet: Fleet, replicas: int, repeats: int) -> dict[str, float]:
    """Two models' rollouts alone, then together; the pair's time over the longer alone."""
    await fleet.create("pa", replicas)
    await fleet.create("pb", replicas)
    ratios, alone_s, both_s = [], [], []
    for _ in range(repeats):
        # Alone to one context, together back to the other: each rollout is a change.
        a = await fleet.rollout_s("pa", context_tokens(0))
        b = await fleet.rollout_s("pb", context_tokens(0))
        start = time.perf_counter()
        await asyncio.gather(
            fleet.rollout_s("pa", context_tokens(1)), fleet.rollout_s("pb", context_tokens(1))
        )
        both = time.perf_counter() - start
        ratios.append(both / max(a, b))
        alone_s.append(max(a, b))
        both_s.append(both)
    await fleet.delete("pa")
    await fleet.delete("pb")
    return {
        "parallel_replicas": replicas,
        "parallel_alone_s": statistics.median(alone_s),
        "parallel_both_s": statistics.median(both_s),
        "parallel_ratio": statistics.median(ratios),
    }


@dataclass(frozen=True)
class Size:
    """How big a run is."""

    sizes: tuple[int, ...]
    real_sizes: tuple[int, ...]
    repeats: int
    floor_s: float = 0.2
    load_s: float = 0.2
    parallel_replicas: int = 4


QUICK = Size(sizes=(1, 4, 16), real_sizes=(1, 4), repeats=1)
FULL = Size(sizes=(1, 4, 16), real_sizes=(1, 4, 16), repeats=3)


async def measure(size: Size, folder: Path, real: bool = True) -> dict[str, float]:
    """Both variants and the parallel pair; the figures."""
    planner = await start_child(
        "planner_svc", ["--listen", "127.0.0.1:0", "--log-format", "json"], folder / "planner.log"
    )
    figures: dict[str, float] = {}
    try:
        fleets: list[ChildServer] = []
        try:
            child = await start_fleet_child(
                folder / "scripted", heartbeat_s=1.0, drain_s=0.0, planner=planner.address
            )
            fleets.append(child)
            fleet = Fleet(child.address)
            async with scripted_nodes(child.address, size.floor_s):
                figures |= await overhead_rows(
                    fleet, size.sizes, size.repeats, size.floor_s, "scripted"
                )
                figures |= await parallel_rows(fleet, size.parallel_replicas, size.repeats)
            await fleet.channel.close()
            if real and size.real_sizes:
                floor_s = await standin_floor_s(size.load_s, tries=3)
                child = await start_fleet_child(
                    folder / "real", heartbeat_s=1.0, drain_s=0.0, planner=planner.address
                )
                fleets.append(child)
                fleet = Fleet(child.address)
                async with real_nodes(child.address, folder, size.load_s):
                    figures |= await overhead_rows(
                        fleet, size.real_sizes, size.repeats, floor_s, "real"
                    )
                await fleet.channel.close()
        finally:
            for f in fleets:
                await f.stop()
    finally:
        await planner.stop()
    return figures


def report(figures: dict[str, float], size: Size) -> None:
    """Print one line per variant and R, then the parallel pair."""
    print(
        "fleet and planner as child processes; SetContext rollouts beside, surge 1, drain 0; "
        f"{NODES} nodes of {CARDS} cards; median of {size.repeats} rollout(s) per line"
    )
    print(
        f"{'variant':<9} {'R':>3} {'floor s':>8} {'rollout s':>9} {'R x floor':>9} "
        f"{'overhead s/replica':>18} {'rollout / (R x floor)':>22}"
    )
    for variant in ("scripted", "real"):
        floor = figures.get(f"{variant}_floor_s")
        if floor is None:
            continue
        for r in size.sizes if variant == "scripted" else size.real_sizes:
            print(
                f"{variant:<9} {r:>3} {floor:>8.3f} {figures[f'{variant}_rollout_s@{r}']:>9.2f} "
                f"{r * floor:>9.2f} {figures[f'{variant}_overhead_s@{r}']:>18.3f} "
                f"{figures[f'{variant}_floor_ratio@{r}']:>22.2f}"
            )
    print("where a step's time goes (medians over steps, from the rollout's events):")
    print(f"{'variant':<9} {'R':>3} " + " ".join(f"{s + ' s':>11}" for s in STAGES))
    for variant in ("scripted", "real"):
        if f"{variant}_floor_s" not in figures:
            continue
        for r in size.sizes if variant == "scripted" else size.real_sizes:
            gaps = [figures.get(f"{variant}_stage_{s.replace(' ', '_')}_s@{r}") for s in STAGES]
            cells = " ".join(f"{g:>11.3f}" if g is not None else f"{'-':>11}" for g in gaps)
            print(f"{variant:<9} {r:>3} {cells}")
    print(
        f"two models of {figures['parallel_replicas']:.0f} replicas (scripted): longer alone "
        f"{figures['parallel_alone_s']:.2f} s, both together {figures['parallel_both_s']:.2f} s, "
        f"ratio {figures['parallel_ratio']:.2f} (1 = in parallel, 2 = one after the other)"
    )
    print("goal: overhead under 0.5 s per replica")


def run(full: bool, real: bool = True) -> dict[str, float]:
    """The benchmark at its quick or full size; prints its table, returns its figures."""
    size = FULL if full else QUICK
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        figures = asyncio.run(measure(size, Path(tmp), real))
    report(figures, size)
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    """Parse `--full` / `--no-real`, run, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--full", action="store_true", help="R up to 16 with real agents too")
    parser.add_argument("--no-real", action="store_true", help="scripted agents only")
    opts = parser.parse_args(argv)
    run(opts.full, not opts.no_real)


if __name__ == "__main__":
    main()
