"""Bench: WatchReplicas fan-out: from an engine turning healthy to every watcher seeing it.

The fleet runs as a child process; the watchers run in PROCESSES more child processes (so
neither the fleet's event loop nor one client's decoding of 1,000 streams is what is timed),
spread over channels of at most 50 streams each, each its own connection. One scripted agent
(llmgw.testing.scripted_agent, a real AgentService client) runs K one-card replicas of a
model, all reported STARTING. Then, one replica at a time, the agent reports it HEALTHY, and
the bench times how long until every watcher has seen its ADDED event (the slowest watcher
decides), and each watcher's own delay: first with 1 watcher (the baseline), then with W
(1,000 by default). Times are CLOCK_MONOTONIC readings (`time.perf_counter`), the same
clock in every process on Linux.

Figures: p50/p99 over replicas of the time to the last watcher, p50 over every watcher's
delay, and the ratios of W watchers' p50 and p99 to the single watcher's (same fleet, same
run).

Run: `.venv/bin/python -m bench.watch_replicas [--full] [--watchers W]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from bench.agent_fanin import WAIT_S, agent_channels, percentile, start_fleet_child, wait_for
from llmgw.agent.v1 import agent_pb2
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.scripted_agent import ScriptedAgent

KINDS = fleet_pb2.WatchReplicasResponse
MODEL = "watched"
WATCHERS = 1000
"""The fan-out the issue asks about."""


PROCESSES = 4
"""Child processes the watchers are spread over."""


@dataclass
class Watcher:
    """One WatchReplicas stream, noting when each replica's ADDED event arrived."""

    stub: fleet_pb2_grpc.FleetServiceAsyncStub
    seen: dict[str, float] = field(default_factory=dict)
    synced: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        """Watch until cancelled."""
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            async for ev in self.stub.WatchReplicas(fleet_pb2.WatchReplicasRequest(model=MODEL)):
                if ev.kind == KINDS.KIND_SYNCED:
                    self.synced.set()
                elif ev.kind == KINDS.KIND_ADDED:
                    self.seen[ev.endpoint.replica_id] = time.perf_counter()


async def child(address: str, count: int) -> None:
    """A watcher process: `count` watchers; prints `synced` once all are, then one JSON line
    per replica every watcher has seen: its id and each watcher's arrival time."""
    channels = agent_channels(address, count)
    pool = [
        Watcher(fleet_pb2_grpc.FleetServiceStub(channels[i % len(channels)])) for i in range(count)
    ]
    tasks = [asyncio.create_task(w.run()) for w in pool]
    await asyncio.wait_for(asyncio.gather(*(w.synced.wait() for w in pool)), WAIT_S)
    print("synced", flush=True)
    told: set[str] = set()
    while True:
        complete = set.intersection(*(set(w.seen) for w in pool)) - told
        for rid in sorted(complete):
            print(json.dumps({"rid": rid, "t": [w.seen[rid] for w in pool]}), flush=True)
        told |= complete
        if any(t.done() for t in tasks):
            return
        await asyncio.sleep(0.002)


@dataclass
class WatcherGroup:
    """Watcher processes: each one's `synced`, and per replica every watcher's arrival."""

    count: int
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)
    synced: int = 0
    arrivals: dict[str, list[float]] = field(default_factory=dict)
    readers: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self, address: str) -> None:
        """Start the processes and wait until every watcher is synced."""
        per = [self.count // PROCESSES + (i < self.count % PROCESSES) for i in range(PROCESSES)]
        for n in (x for x in per if x):
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bench.watch_replicas",
                "--child",
                address,
                str(n),
                stdout=asyncio.subprocess.PIPE,
            )
            self.procs.append(proc)
            self.readers.append(asyncio.create_task(self._read(proc)))
        deadline = time.perf_counter() + WAIT_S
        while self.synced < len(self.procs):
            if time.perf_counter() > deadline or any(p.returncode is not None for p in self.procs):
                raise RuntimeError("the watcher processes did not all sync")
            await asyncio.sleep(0.01)

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            text = line.decode().strip()
            if text == "synced":
                self.synced += 1
            elif text.startswith("{"):
                doc = json.loads(text)
                self.arrivals.setdefault(doc["rid"], []).extend(doc["t"])

    def seen_by_all(self, rid: str) -> bool:
        """Whether every watcher saw `rid`."""
        return len(self.arrivals.get(rid, ())) >= self.count

    async def stop(self) -> None:
        """End the processes."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for proc in self.procs:
            await proc.wait()
        for task in self.readers:
            task.cancel()
        await asyncio.gather(*self.readers, return_exceptions=True)


def watched_model(replicas: int) -> common_pb2.Model:
    """A model of `replicas` one-card vLLM replicas."""
    return common_pb2.Model(
        name=MODEL,
        source="hf://org/watched",
        context_length=8192,
        profiles=[
            common_pb2.Profile(
                name="gpu",
                engine="vllm",
                args=["--max-model-len", "8192"],
                gpu_class="H100-80GB",
                gpus_per_node=1,
                replicas=replicas,
            )
        ],
    )


async def turn_healthy(
    agent: ScriptedAgent, spec: agent_pb2.ReplicaSpec, group: WatcherGroup
) -> list[float]:
    """Report one replica HEALTHY; each watcher's delay until it saw the ADDED event."""
    rid = spec.replica_id
    start = time.perf_counter()
    agent.report(spec, agent_pb2.PROCESS_PHASE_HEALTHY)
    # Each watcher notes its own arrival time; polling here only decides when to move on.
    deadline = start + WAIT_S
    while not group.seen_by_all(rid):
        if time.perf_counter() > deadline:
            raise RuntimeError(f"not every watcher saw {rid} within {WAIT_S:.0f} s")
        await asyncio.sleep(0.005)
    return [t - start for t in group.arrivals[rid]]


async def measure(replicas: int, watchers: int, folder: Path) -> dict[str, float]:
    """K replicas turned healthy with 1 watcher, then K more with `watchers`; the figures."""
    fleet = await start_fleet_child(folder)
    admin = grpc.aio.insecure_channel(fleet.address)
    stub = fleet_pb2_grpc.FleetServiceStub(admin)
    agent = ScriptedAgent(
        fleet.address,
        "watch-node",
        gpus=2 * replicas,
        phase_for=lambda spec: agent_pb2.PROCESS_PHASE_STARTING,
    )
    groups: list[WatcherGroup] = []
    try:
        agent.start()
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=watched_model(2 * replicas)))

        async def all_starting() -> bool:
            listed = await stub.ListReplicas(fleet_pb2.ListReplicasRequest(model=MODEL))
            starting = [r for r in listed.replicas if r.phase == fleet_pb2.REPLICA_PHASE_STARTING]
            return len(starting) == 2 * replicas and len(agent.running) == 2 * replicas

        await wait_for(all_starting, f"{2 * replicas} replicas STARTING")
        specs = [agent.running[rid] for rid in sorted(agent.running)]
        results: dict[int, list[list[float]]] = {}
        for count, batch in ((1, specs[:replicas]), (watchers, specs[replicas:])):
            group = WatcherGroup(count)
            groups.append(group)
            await group.start(fleet.address)
            results[count] = [await turn_healthy(agent, spec, group) for spec in batch]
            await group.stop()
    finally:
        for group in groups:
            await group.stop()
        await agent.stop()
        await admin.close()
        await fleet.stop()
    figures: dict[str, float] = {}
    for count, per_replica in results.items():
        last = [max(delays) for delays in per_replica]
        every = [d for delays in per_replica for d in delays]
        figures[f"last_p50_ms@{count}"] = percentile(last, 50) * 1e3
        figures[f"last_p99_ms@{count}"] = percentile(last, 99) * 1e3
        figures[f"each_p50_ms@{count}"] = statistics.median(every) * 1e3
    figures["watchers"] = watchers
    figures["replicas"] = replicas
    figures["last_p50_ratio"] = figures[f"last_p50_ms@{watchers}"] / figures["last_p50_ms@1"]
    figures["last_p99_ratio"] = figures[f"last_p99_ms@{watchers}"] / figures["last_p99_ms@1"]
    return figures


def report(figures: dict[str, float]) -> None:
    """Print one line per watcher count."""
    w, k = int(figures["watchers"]), int(figures["replicas"])
    print(
        f"fleet as a child process; watchers in {PROCESSES} more; one scripted agent; {k} "
        "replicas turned HEALTHY one at a time per line; times from the agent's report to the "
        "ADDED event"
    )
    print(
        f"{'watchers':>8} {'last p50 ms':>11} {'last p99 ms':>11} {'each p50 ms':>11} "
        f"{'p50/1':>6} {'p99/1':>6}"
    )
    for count in (1, w):
        print(
            f"{count:>8} {figures[f'last_p50_ms@{count}']:>11.2f} "
            f"{figures[f'last_p99_ms@{count}']:>11.2f} {figures[f'each_p50_ms@{count}']:>11.2f} "
            f"{figures[f'last_p50_ms@{count}'] / figures['last_p50_ms@1']:>6.2f} "
            f"{figures[f'last_p99_ms@{count}'] / figures['last_p99_ms@1']:>6.2f}"
        )


def run(full: bool, watchers: int = WATCHERS) -> dict[str, float]:
    """The benchmark at its quick or full size; prints its table, returns its figures."""
    replicas = 40 if full else 15
    with tempfile.TemporaryDirectory(prefix="bench-watch-") as tmp:
        figures = asyncio.run(measure(replicas, watchers, Path(tmp)))
    report(figures)
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    """Parse `--full` and `--watchers`, run, print (or be a watcher process: `--child`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--full", action="store_true", help="more replicas per line")
    parser.add_argument("--watchers", type=int, default=WATCHERS, help="the fan-out measured")
    parser.add_argument("--child", nargs=2, metavar=("ADDRESS", "COUNT"), help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.child:
        asyncio.run(child(opts.child[0], int(opts.child[1])))
        return
    run(opts.full, opts.watchers)


if __name__ == "__main__":
    main()
