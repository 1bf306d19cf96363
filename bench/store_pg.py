"""Bench: the fleet on PostgreSQL against the fleet on SQLite: SetContext and ListReplicas.

Two fleets run as child processes beside one planner (also a child): one on a SQLite file, one
on a fresh PostgreSQL database (created here on LLMGW_BENCH_PG's server, else the test run's
LLMGW_TEST_PG_DSN, else postgresql://postgres@127.0.0.1:5432/postgres; dropped after). Each
holds the same catalog:

- `ctx`, Llama-3.1-8B with an inline shape and no replicas: a SetContext on it is one planner
  call plus the store's part of a change (the model read, its etag checked, the new revision's
  compare-and-swap insert, the request id's answer), with no rollout to wait for;
- `many`, R replicas (PENDING: no agent is connected) that ListReplicas lists; the fleet answers
  ListReplicas from memory after reading the model from the store (the `model` filter).

Calls are sequential on one channel per fleet, in rounds alternating SQLite and PostgreSQL so
the two share whatever else the machine does; the figures are the median latency per call of
each store and their ratio, PostgreSQL ÷ SQLite.

Then, per fleet and BURST_ROUNDS times, alternating, a burst: BURST_CHANGES SetContexts over
BURST_MODELS models at once (each model's in sequence), while a health Check is sent again and
again on another channel; the figure is the Check's p99 over the bursts, which shows whether
store round trips held the fleet's event loop (every RPC, agent stream and watch waits on it).

With `--against DIR` (another checkout of this repository, a baseline) a third fleet runs that
checkout's code on PostgreSQL, on a database of its own on the same server, in the same rounds
(their order reversed every other round), so a change of the PostgreSQL store is compared
with its baseline in one run, under the same machine state: the figures add the baseline's
medians and this checkout's PostgreSQL ÷ the baseline's.

Run: `.venv/bin/python -m bench.store_pg [--calls N] [--rounds N] [--replicas R] [--against DIR]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import psycopg
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.planner_throughput import LLAMA_8B, ROOT, ChildServer, start_child
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc


def admin_dsn() -> str:
    """The server the PostgreSQL benches make their databases on: LLMGW_BENCH_PG, else the
    test run's (LLMGW_TEST_PG_DSN), else a server at 127.0.0.1:5432."""
    return os.environ.get("LLMGW_BENCH_PG") or os.environ.get(
        "LLMGW_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
    )


"""Where the bench's database is created and dropped (a maintenance database)."""


BURST_CHANGES = 200
"""Changes in a burst."""
BURST_MODELS = 8
"""Models the burst's changes are spread over (in flight at once: one per model)."""
BURST_ROUNDS = 3
"""Bursts per fleet, alternating the fleets; the p99 is over every Check of them."""


def ctx_model(name: str = "ctx") -> common_pb2.Model:
    """Llama-3.1-8B on llama.cpp, shape inline, no replicas: SetContext changes only the
    catalog."""
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
                replicas=0,
            )
        ],
    )


def many_model(replicas: int) -> common_pb2.Model:
    """A model of `replicas` CPU replicas (PENDING with no agent) for ListReplicas to list."""
    return common_pb2.Model(
        name="many",
        source="hf://org/many",
        profiles=[
            common_pb2.Profile(
                name="cpu",
                engine="llamacpp",
                cpu_only=True,
                min_memory_gb=1,
                replicas=replicas,
            )
        ],
    )


class FleetUnderTest:
    """One fleet child and a stub on it."""

    def __init__(self, label: str, child: ChildServer) -> None:
        self.label = label
        self.child = child
        self.channel = grpc.aio.insecure_channel(child.address)
        self.stub: fleet_pb2_grpc.FleetServiceAsyncStub = fleet_pb2_grpc.FleetServiceStub(
            self.channel
        )
        self.tokens = 8192
        self.calls = 0

    async def set_context(self) -> None:
        """One SetContext on `ctx`, alternating between two context lengths."""
        self.tokens = 16384 if self.tokens == 8192 else 8192
        self.calls += 1
        await self.stub.SetContext(
            fleet_pb2.SetContextRequest(
                name="ctx", tokens=self.tokens, request_id=f"{self.label}-{self.calls}"
            ),
            timeout=30,
        )

    async def burst(self, changes: int, models: int) -> list[float]:
        """`changes` SetContexts over `models` models at once; seconds each health Check
        sent meanwhile took."""
        health = health_pb2_grpc.HealthStub(grpc.aio.insecure_channel(self.child.address))
        done = asyncio.Event()
        checks: list[float] = []

        async def check() -> None:
            while not done.is_set():
                started = time.perf_counter()
                await health.Check(health_pb2.HealthCheckRequest(), timeout=30)
                checks.append(time.perf_counter() - started)
                await asyncio.sleep(0.002)

        async def chain(model: str, n: int) -> None:
            tokens = 8192
            for _ in range(n):
                tokens = 16384 if tokens == 8192 else 8192
                await self.stub.SetContext(
                    fleet_pb2.SetContextRequest(name=model, tokens=tokens), timeout=30
                )

        checker = asyncio.create_task(check())
        await asyncio.sleep(0.05)
        await asyncio.gather(*(chain(f"burst-{i}", changes // models) for i in range(models)))
        done.set()
        await checker
        return checks

    async def list_replicas(self) -> None:
        """One ListReplicas of `many`."""
        await self.stub.ListReplicas(fleet_pb2.ListReplicasRequest(model="many"), timeout=30)


async def timed(call: Callable[[], Awaitable[None]], n: int) -> list[float]:
    """Seconds each of `n` sequential calls took."""
    out = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        out.append(time.perf_counter() - started)
    return out


async def start_fleet(
    folder: Path, store: str, planner: str, label: str, root: Path | None = None
) -> ChildServer:
    """`python -m fleet_svc` on 127.0.0.1:0 on `store` (the code of checkout `root`, else
    this one's)."""
    folder.mkdir(parents=True, exist_ok=True)
    return await start_child(
        "fleet_svc",
        ["--listen", "127.0.0.1:0", "--store", store, "--planner", planner, "--log-format", "json"],
        folder / f"fleet-{label}.log",
        root=ROOT if root is None else root,
    )


async def wait_replicas(fleet: FleetUnderTest, want: int) -> None:
    """Until the fleet holds `want` replicas of `many` (its controller creates them)."""
    deadline = time.monotonic() + 30
    while True:
        listed = await fleet.stub.ListReplicas(
            fleet_pb2.ListReplicasRequest(model="many"), timeout=10
        )
        if len(listed.replicas) == want:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{fleet.label}: {len(listed.replicas)} replicas, not {want}")
        await asyncio.sleep(0.1)


async def measure(
    calls: int,
    rounds: int,
    replicas: int,
    folder: Path,
    burst: int = BURST_CHANGES,
    against: Path | None = None,
) -> dict[str, float]:
    """Both fleets (and the baseline's, `against`), interleaved rounds; median seconds per
    call and the ratios."""
    dbnames = ["llmgw_bench_" + uuid.uuid4().hex[:10] for _ in range(1 if against is None else 2)]
    dsns = [admin_dsn().rsplit("/", 1)[0] + "/" + name for name in dbnames]
    with psycopg.connect(admin_dsn(), autocommit=True) as admin:
        for name in dbnames:
            admin.execute(f"CREATE DATABASE {name}".encode())
    planner = await start_child(
        "planner_svc", ["--listen", "127.0.0.1:0", "--log-format", "json"], folder / "planner.log"
    )
    fleets: list[FleetUnderTest] = []
    try:
        runs: list[tuple[str, str, Path | None]] = [
            ("sqlite", str(folder / "fleet.db"), None),
            ("postgresql", dsns[0], None),
        ]
        if against is not None:
            runs.append(("against", dsns[1], against))
        for label, store, root in runs:
            child = await start_fleet(folder, store, planner.address, label, root)
            fleets.append(FleetUnderTest(label, child))
        for f in fleets:
            await f.stub.CreateModel(fleet_pb2.CreateModelRequest(model=ctx_model()), timeout=30)
            await f.stub.CreateModel(
                fleet_pb2.CreateModelRequest(model=many_model(replicas)), timeout=30
            )
            await wait_replicas(f, replicas)
            for i in range(BURST_MODELS):
                await f.stub.CreateModel(
                    fleet_pb2.CreateModelRequest(model=ctx_model(f"burst-{i}")), timeout=30
                )
            await timed(f.set_context, 5)  # warm: channels, the planner's shape cache
            await timed(f.list_replicas, 5)
        samples: dict[tuple[str, str], list[float]] = {}
        for n in range(rounds):
            # With a baseline, every other round the other way round: neither PostgreSQL fleet
            # always follows the SQLite one.
            for f in fleets if against is None or n % 2 == 0 else fleets[::-1]:
                samples.setdefault((f.label, "set_context"), []).extend(
                    await timed(f.set_context, calls)
                )
                samples.setdefault((f.label, "list_replicas"), []).extend(
                    await timed(f.list_replicas, calls)
                )
        figures: dict[str, float] = {}
        for (label, what), seconds in samples.items():
            figures[f"{what}_{label}_ms"] = statistics.median(seconds) * 1000
        checks: dict[str, list[float]] = {f.label: [] for f in fleets}
        for _ in range(BURST_ROUNDS):
            for f in fleets:
                checks[f.label].extend(await f.burst(burst, BURST_MODELS))
        for label, seconds in checks.items():
            figures[f"check_p99_{label}_ms"] = p99(seconds) * 1000
        for what in ("set_context", "list_replicas"):
            figures[f"{what}_pg_over_sqlite"] = (
                figures[f"{what}_postgresql_ms"] / figures[f"{what}_sqlite_ms"]
            )
            if against is not None:
                figures[f"{what}_against_over_sqlite"] = (
                    figures[f"{what}_against_ms"] / figures[f"{what}_sqlite_ms"]
                )
                figures[f"{what}_pg_over_against"] = (
                    figures[f"{what}_postgresql_ms"] / figures[f"{what}_against_ms"]
                )
        return figures
    finally:
        for f in fleets:
            await f.channel.close()
            await f.child.stop()
        await planner.stop()
        with psycopg.connect(admin_dsn(), autocommit=True) as admin:
            for name in dbnames:
                admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)".encode())


def p99(seconds: list[float]) -> float:
    """The 99th percentile of `seconds` (the largest of fewer than 100)."""
    ordered = sorted(seconds)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def report(figures: dict[str, float], calls: int, rounds: int, replicas: int) -> None:
    """The table."""
    print(
        f"store_pg: {rounds} rounds x {calls} sequential calls per store (interleaved),"
        f" ListReplicas over {replicas} replicas"
    )
    print(f"{'call':<14} {'SQLite ms':>10} {'PostgreSQL ms':>14} {'PG / SQLite':>12}")
    for what, name in (("set_context", "SetContext"), ("list_replicas", "ListReplicas")):
        print(
            f"{name:<14} {figures[f'{what}_sqlite_ms']:>10.2f}"
            f" {figures[f'{what}_postgresql_ms']:>14.2f}"
            f" {figures[f'{what}_pg_over_sqlite']:>12.2f}"
        )
    if "set_context_against_ms" in figures:
        print(
            f"{'against:':<14} {'':>10} {'baseline ms':>14} {'base / SQLite':>13} {'PG / base':>10}"
        )
        for what, name in (("set_context", "SetContext"), ("list_replicas", "ListReplicas")):
            print(
                f"{name:<14} {'':>10} {figures[f'{what}_against_ms']:>14.2f}"
                f" {figures[f'{what}_against_over_sqlite']:>13.2f}"
                f" {figures[f'{what}_pg_over_against']:>10.3f}"
            )
    print(
        f"health Check p99 during {BURST_CHANGES} SetContexts over {BURST_MODELS} models:"
        f" SQLite {figures['check_p99_sqlite_ms']:.2f} ms,"
        f" PostgreSQL {figures['check_p99_postgresql_ms']:.2f} ms"
        + (
            f", baseline PostgreSQL {figures['check_p99_against_ms']:.2f} ms"
            if "check_p99_against_ms" in figures
            else ""
        )
    )


def run(full: bool = False) -> dict[str, float]:
    """Run at the quick (or full) size and print the table; the figures."""
    calls, rounds, replicas = (100, 6, 64) if full else (40, 4, 16)
    with tempfile.TemporaryDirectory(prefix="bench-store-pg-") as tmp:
        figures = asyncio.run(measure(calls, rounds, replicas, Path(tmp)))
    report(figures, calls, rounds, replicas)
    return figures


def main() -> None:
    """Parse flags and run."""
    parser = argparse.ArgumentParser(prog="python -m bench.store_pg", description=__doc__)
    parser.add_argument("--calls", type=int, default=40, help="sequential calls per round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per store, interleaved")
    parser.add_argument("--replicas", type=int, default=16, help="replicas ListReplicas lists")
    parser.add_argument(
        "--against",
        type=Path,
        default=None,
        help="another checkout (a baseline) whose fleet runs on PostgreSQL in the same rounds",
    )
    opts = parser.parse_args()
    against = None if opts.against is None else opts.against.resolve()
    if against is not None and not (against / "fleet_svc").is_dir():
        parser.error(f"--against {opts.against}: no fleet_svc there (not a checkout of this repo)")
    with tempfile.TemporaryDirectory(prefix="bench-store-pg-") as tmp:
        figures = asyncio.run(
            measure(opts.calls, opts.rounds, opts.replicas, Path(tmp), against=against)
        )
    report(figures, opts.calls, opts.rounds, opts.replicas)


if __name__ == "__main__":
    main()
