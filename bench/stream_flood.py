"""Bench: a few identities flooding the fleet with WatchReplicas streams, against an admin's
ListModels latency and the fleet's memory.

The fleet runs as a child process over mutual TLS (certificates from llmgw.certs), with a
settings file (so every stream is tracked for live revocation, as in a deployment) giving
every verified user the viewer role. The flood runs in another child process: IDENTITIES
viewer identities, each over its own channels (50 streams a connection, a connection's streams
opened once the previous connection's have their answer), together try to open STREAMS
WatchReplicas streams and hold the ones the fleet admits (each reads its snapshot);
the ones past the per-identity cap (`max_streams_per_identity`, 256) are refused
RESOURCE_EXHAUSTED. Meanwhile the bench process, as admin, calls ListModels back to back.

Two scenarios, each timed against the idle round of the same fleet just before it:

- spread: STREAMS over enough identities that all are admitted (20 x 250 = 5,000 held);
- one: STREAMS from one identity (256 held, the rest refused at once).

Figures: admin ListModels p50/p99 idle and under each flood, the p99 ratio (goal <= 2), the
streams held and refused, and the fleet's RSS idle and holding the streams (goal <= 300 MB).

Run: `.venv/bin/python -m bench.stream_flood [--full]` (quick: 2,000 streams; full: 5,000).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import grpc

from bench.agent_fanin import percentile, start_fleet_child
from bench.planner_throughput import ChildServer
from bench.watch_replicas import watched_model
from llmgw import certs
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.tls import ClientTLS, aio_channel

STREAMS_PER_CHANNEL = 50
PER_IDENTITY = 250
"""Streams each identity of the spread flood opens: under the per-identity cap (256)."""
CALLS = 500
"""ListModels calls per measured round."""
HOLD_WAIT_S = 300.0


def _pair(folder: Path, user: str) -> ClientTLS:
    """`user`'s pair in `folder`, trusting its CA."""
    return ClientTLS(
        ca=folder / certs.CA_CERT, cert=folder / f"{user}.crt", key=folder / f"{user}.key"
    )


async def child(address: str, folder: str, users: str, count: int) -> None:
    """The flood: `count` streams spread evenly over `users` (comma-separated pairs in
    `folder`); prints `held H refused R` once every stream is admitted or refused, then holds
    the admitted ones until stdin closes."""
    names = users.split(",")
    per_user = math.ceil(count / len(names))
    shares = [min(per_user, count - i * per_user) for i in range(len(names))]
    channels: list[grpc.aio.Channel] = []
    held = 0
    refused = 0
    reasons: dict[str, int] = {}
    settled = asyncio.Event()
    total = sum(n for n in shares if n > 0)

    async def stream(stub: fleet_pb2_grpc.FleetServiceAsyncStub, first: asyncio.Event) -> None:
        nonlocal held, refused
        call = stub.WatchReplicas(fleet_pb2.WatchReplicasRequest())
        counted = False
        try:
            async for _ in call:
                if not counted:
                    counted = True
                    held += 1
                    first.set()
                    if held + refused == total:
                        settled.set()
        except grpc.aio.AioRpcError as exc:
            if not counted:
                refused += 1
                first.set()
                why = f"{exc.code().name}: {(exc.details() or '')[:60]}"
                reasons[why] = reasons.get(why, 0) + 1
                if held + refused == total:
                    settled.set()

    tasks: list[asyncio.Task[None]] = []
    options = [("grpc.use_local_subchannel_pool", 1)]
    for name, mine in zip(names, shares, strict=True):
        tls = _pair(Path(folder), name)
        for start in range(0, max(mine, 0), STREAMS_PER_CHANNEL):
            channel = aio_channel(address, tls, options)
            await channel.channel_ready()
            channels.append(channel)
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            # A connection's streams are opened together, and the next connection's once
            # these have their answer (a snapshot or a refusal): a flood that holds, not a
            # burst that tests how fast gRPC accepts new streams.
            firsts = [asyncio.Event() for _ in range(min(STREAMS_PER_CHANNEL, mine - start))]
            for first in firsts:
                tasks.append(asyncio.create_task(stream(stub, first)))
            await asyncio.wait_for(asyncio.gather(*(f.wait() for f in firsts)), HOLD_WAIT_S)
    await asyncio.wait_for(settled.wait(), HOLD_WAIT_S)
    print(f"held {held} refused {refused}", flush=True)
    print(json.dumps(reasons), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for task in tasks:
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.gather(*tasks, return_exceptions=True)
    for channel in channels:
        await channel.close()


async def list_latencies(stub: fleet_pb2_grpc.FleetServiceAsyncStub, calls: int) -> list[float]:
    """`calls` ListModels back to back; each one's seconds."""
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        await stub.ListModels(fleet_pb2.ListModelsRequest(), timeout=30)
        out.append(time.perf_counter() - started)
    return out


async def flood(address: str, folder: Path, users: Sequence[str], count: int) -> Flood:
    """Start the flood process and wait until its streams are held (or refused)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.stream_flood",
        "--child",
        address,
        str(folder),
        ",".join(users),
        str(count),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    line = (await asyncio.wait_for(process.stdout.readline(), HOLD_WAIT_S)).decode().split()
    if len(line) != 4:
        process.kill()
        raise RuntimeError(f"the flood process said {' '.join(line)!r}")
    reasons = json.loads(await process.stdout.readline())
    for why, count in sorted(reasons.items()):
        print(f"  refused x{count}: {why}")
    return Flood(process, int(line[1]), int(line[3]))


class Flood:
    """A running flood process and what it holds."""

    def __init__(self, process: asyncio.subprocess.Process, held: int, refused: int) -> None:
        self.process = process
        self.held = held
        self.refused = refused

    async def stop(self) -> None:
        """Close its stdin (it lets its streams go and exits), or kill it."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 30)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


async def measure(streams: int, folder: Path) -> dict[str, float]:
    """Idle, spread-flood and one-identity-flood rounds on one fleet; the figures."""
    spread = [f"v{i}" for i in range(math.ceil(streams / PER_IDENTITY))]
    tls = certs.make_local_tls(folder / "tls", servers=("fleet",), clients=("admin", *spread))
    settings = folder / "settings.yaml"
    settings.write_text("roles:\n  admin: [admin]\n  viewer: ['*']\n")
    cert, key = tls.servers["fleet"]
    server_flags = ["--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(tls.ca_cert)]
    fleet: ChildServer = await start_fleet_child(
        folder / "fleet", tls_flags=[*server_flags, "--settings", str(settings)]
    )
    admin = aio_channel(fleet.address, _pair(tls.folder, "admin").expecting("fleet"))
    stub = fleet_pb2_grpc.FleetServiceStub(admin)
    figures: dict[str, float] = {"streams": streams}
    try:
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=watched_model(1)))
        await list_latencies(stub, 50)  # warm up
        rounds: list[tuple[str, list[str]]] = [
            ("idle", []),
            ("spread", spread),
            ("idle2", []),
            ("one", spread[:1]),
        ]
        for name, users in rounds:
            running = await flood(fleet.address, tls.folder, users, streams) if users else None
            try:
                times = await list_latencies(stub, CALLS)
                figures[f"rss_mb@{name}"] = fleet.rss_bytes() / 2**20
            finally:
                if running is not None:
                    figures[f"held@{name}"] = running.held
                    figures[f"refused@{name}"] = running.refused
                    await running.stop()
            figures[f"p50_ms@{name}"] = percentile(times, 50) * 1e3
            figures[f"p99_ms@{name}"] = percentile(times, 99) * 1e3
    finally:
        await admin.close()
        await fleet.stop()
    # Each flood against the idle round just before it (the machine's other load drifts).
    for name, idle in (("spread", "idle"), ("one", "idle2")):
        figures[f"p99_ratio@{name}"] = figures[f"p99_ms@{name}"] / figures[f"p99_ms@{idle}"]
    return figures


def report(figures: dict[str, float]) -> None:
    """One line per round."""
    print(
        f"fleet as a child process over mutual TLS; {int(figures['streams'])} WatchReplicas "
        f"streams tried by the flood process; admin ListModels x{CALLS} back to back"
    )
    print(
        f"{'round':>7} {'held':>6} {'refused':>7} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'p99/idle':>8} {'RSS MB':>7}"
    )
    for name in ("idle", "spread", "idle2", "one"):
        held = int(figures.get(f"held@{name}", 0))
        refused = int(figures.get(f"refused@{name}", 0))
        ratio = figures.get(f"p99_ratio@{name}", 1.0)
        print(
            f"{name:>7} {held:>6} {refused:>7} {figures[f'p50_ms@{name}']:>7.2f} "
            f"{figures[f'p99_ms@{name}']:>7.2f} {ratio:>8.2f} {figures[f'rss_mb@{name}']:>7.1f}"
        )


def run(full: bool) -> dict[str, float]:
    """The benchmark at its quick or full size; prints its table, returns its figures."""
    streams = 5000 if full else 2000
    with tempfile.TemporaryDirectory(prefix="bench-flood-") as tmp:
        figures = asyncio.run(measure(streams, Path(tmp)))
    report(figures)
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    """Parse `--full`, run, print (or be the flood process: `--child`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--full", action="store_true", help="5,000 streams (default 2,000)")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.child:
        address, folder, users, count = opts.child
        asyncio.run(child(address, folder, users, int(count)))
        return
    run(opts.full)


if __name__ == "__main__":
    main()
