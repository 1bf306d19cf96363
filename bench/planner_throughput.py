"""Bench: the planner's SizeContext rate with a cached shape vs its own health Check rate.

The planner runs as a child process (`python -m planner_svc --listen 127.0.0.1:0`), as it is
deployed: its CPU time is its own (read from /proc), so beside the client-side rates the bench
reports the server's CPU per call, which the client's own cost cannot blur. One client (one
grpc.aio channel) keeps `concurrency` calls in flight. Rounds interleave three kinds of call:

- health: `grpc.health.v1.Health/Check` (the baseline: the cheapest call the server answers);
- inline: `SizeContext` of Llama-3.1-8B with its shape given inline;
- gguf: `SizeContext` of a local GGUF file's model, resolved once before (the resolver's
  cache answers every later call).

Ratios are taken per round (each SizeContext round over the health round next to it), then the
median: the machine's other load moves both sides of a ratio together. Goal: >= 0.8.

Run: `.venv/bin/python -m bench.planner_throughput [--full]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llmgw.common.v1 import common_pb2
from llmgw.planner.v1 import planner_pb2, planner_pb2_grpc
from tests.support.gguf_files import llama_tensors, write_gguf
from tests.support.shapes import LLAMA_31_8B, inline

ROOT = Path(__file__).resolve().parents[1]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
START_TIMEOUT_S = 60.0
"""How long a child server may take to print where it listens (imports on a busy machine)."""

# Llama-3.1-8B given inline (tests/support/shapes.py), so the planner reads no source.
LLAMA_8B = inline(LLAMA_31_8B)
INVENTORY = common_pb2.Inventory(
    nodes=[
        common_pb2.InventoryNode(
            name="n1", gpu_class="H100-80GB", gpus=8, free_gpus=8, gpu_memory_bytes=81559 << 20
        )
    ]
)


@dataclass
class ChildServer:
    """A server run as `python -m MODULE` that printed `... listening on HOST:PORT`."""

    process: asyncio.subprocess.Process
    address: str

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.process.pid

    def cpu_s(self) -> float:
        """User + system CPU time the child has used so far (from /proc/PID/stat)."""
        return process_cpu_s(self.pid)

    def rss_bytes(self) -> int:
        """The child's resident memory now (VmRSS of /proc/PID/status)."""
        return process_rss_bytes(self.pid)

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL if it has not exited within 10 s."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc/PID/stat (fields 14 and 15)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may hold spaces; the fields after its closing ')' do not.
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def process_rss_bytes(pid: int) -> int:
    """Resident memory of a process in bytes, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS line")


async def start_child(
    module: str,
    args: Sequence[str],
    log_path: Path,
    *,
    env: dict[str, str] | None = None,
    root: Path = ROOT,
) -> ChildServer:
    """Start `python -m module args...` and wait for its `listening on HOST:PORT` line.

    Its stderr (the JSON log) goes to `log_path`; `env` adds to this process's environment;
    `root` is the checkout whose code it runs (this one by default).

    Raises:
        RuntimeError: it exited or stayed silent for START_TIMEOUT_S.
    """
    log = log_path.open("wb")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *args,
        cwd=root,
        env={**os.environ, **(env or {}), "PYTHONPATH": str(root)},
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
    )
    log.close()
    assert process.stdout is not None
    try:
        line = await asyncio.wait_for(process.stdout.readline(), START_TIMEOUT_S)
    except TimeoutError:
        line = b""
    found = re.search(rb"listening on (\S+:\d+)", line)
    if found is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise RuntimeError(f"{module} did not say where it listens; see {log_path}")
    return ChildServer(process, found.group(1).decode())


async def burst(call: Callable[[], Awaitable[object]], calls: int, concurrency: int) -> float:
    """Make `calls` calls, `concurrency` in flight at a time; the wall time it took."""
    left = calls

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await call()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start


def size_request(model: common_pb2.Model) -> planner_pb2.SizeContextRequest:
    """SizeContext of `model` to 16k tokens on one H100 node."""
    return planner_pb2.SizeContextRequest(model=model, tokens=16384, inventory=INVENTORY)


def vllm_model(**fields: object) -> common_pb2.Model:
    """A model served by vLLM on one H100 a replica, its shape or source given by `fields`."""
    profile = common_pb2.Profile(
        name="gpu",
        engine="vllm",
        args=["--max-model-len", "8192"],
        gpu_class="H100-80GB",
        gpus_per_node=1,
    )
    return common_pb2.Model(name="m", context_length=8192, profiles=[profile], **fields)  # type: ignore[arg-type]


def write_model_gguf(folder: Path) -> Path:
    """A Llama-3.2-1B-like GGUF header (16 blocks, 32 heads, 8 KV heads), data left sparse."""
    path = folder / "llama-1b.gguf"
    write_gguf(
        path,
        arch="llama",
        block_count=16,
        n_embd=2048,
        n_head=32,
        n_head_kv=8,
        context_length=131072,
        tensors=llama_tensors(
            block_count=16, n_embd=2048, n_head=32, n_head_kv=8, n_ff=8192, n_vocab=128256
        ),
    )
    return path


def call_kinds(channel: grpc.aio.Channel, folder: Path) -> dict[str, Callable[[], Awaitable[Any]]]:
    """Each kind of call the planner benches make on `channel` (the GGUF written to `folder`):
    `health`, `inline`, `gguf` and `distinct`."""
    health = health_pb2_grpc.HealthStub(channel)
    stub = planner_pb2_grpc.PlannerServiceStub(channel)
    inline = size_request(vllm_model(shape=LLAMA_8B))
    gguf = size_request(vllm_model(source=str(write_model_gguf(folder))))
    asked = itertools.count()

    def distinct() -> Awaitable[Any]:
        # A context never asked before: the planner's remembered answers cannot serve it,
        # so this is the sizing itself (cached shape, fresh computation).
        request = planner_pb2.SizeContextRequest()
        request.CopyFrom(gguf)
        request.tokens = 1024 + next(asked) % 120_000
        return stub.SizeContext(request)

    return {
        "health": lambda: health.Check(health_pb2.HealthCheckRequest()),
        "inline": lambda: stub.SizeContext(inline),
        "gguf": lambda: stub.SizeContext(gguf),
        "distinct": distinct,
    }


async def measure(rounds: int, calls: int, concurrency: int, folder: Path) -> dict[str, float]:
    """Interleaved rounds of each kind of call against a child planner; the figures.

    Returns:
        Per kind: `{kind}_per_s` (median rate), `{kind}_cpu_us` (median server CPU per call);
        per SizeContext kind: `{kind}_ratio` (median of per-round rate ratios to health) and
        `{kind}_cpu_ratio` (server CPU per call over health's).
    """
    planner = await start_child(
        "planner_svc",
        # The GGUF is a local file: the planner reads local sources only under --allow-root.
        ["--listen", "127.0.0.1:0", "--log-format", "json", "--allow-root", str(folder)],
        folder / "planner.log",
    )
    channel = grpc.aio.insecure_channel(planner.address)
    try:
        kinds = call_kinds(channel, folder)
        for name in ("inline", "gguf"):  # resolves the GGUF once; both must be answers
            answer = await kinds[name]()
            assert answer.change.after == 16384, answer
        for call in kinds.values():
            await burst(call, concurrency * 4, concurrency)
        rates: dict[str, list[float]] = {k: [] for k in kinds}
        cpus: dict[str, list[float]] = {k: [] for k in kinds}
        names = list(kinds)
        for r in range(rounds):
            # Rotate the order so no kind always runs first (or right after another).
            for name in names[r % len(names) :] + names[: r % len(names)]:
                cpu_before = planner.cpu_s()
                wall_s = await burst(kinds[name], calls, concurrency)
                cpus[name].append((planner.cpu_s() - cpu_before) / calls)
                rates[name].append(calls / wall_s)
    finally:
        await channel.close()
        await planner.stop()
    figures: dict[str, float] = {}
    for name in names:
        figures[f"{name}_per_s"] = statistics.median(rates[name])
        figures[f"{name}_cpu_us"] = statistics.median(cpus[name]) * 1e6
    for name in ("inline", "gguf", "distinct"):
        pairs = zip(rates[name], rates["health"], strict=True)
        figures[f"{name}_ratio"] = statistics.median(a / b for a, b in pairs)
        figures[f"{name}_cpu_ratio"] = figures[f"{name}_cpu_us"] / max(
            figures["health_cpu_us"], 1e-9
        )
    return figures


def report(figures: dict[str, float], rounds: int, calls: int, concurrency: int) -> None:
    """Print the figures as a table."""
    print(
        f"planner as a child process; one grpc.aio channel, {concurrency} in flight; "
        f"{rounds} interleaved rounds of {calls} calls per kind"
    )
    print(f"{'call':<30} {'calls/s':>9} {'server CPU/call':>16} {'rate / health':>14}")
    labels = {
        "health": "health Check (baseline)",
        "inline": "SizeContext, inline shape",
        "gguf": "SizeContext, cached GGUF",
        "distinct": "SizeContext, new each call",
    }
    for name, label in labels.items():
        ratio = figures.get(f"{name}_ratio", 1.0)
        print(
            f"{label:<30} {figures[f'{name}_per_s']:>9,.0f} "
            f"{figures[f'{name}_cpu_us']:>13,.0f} us {ratio:>14.2f}"
        )
    print(
        "goal: SizeContext >= 0.8 of the health-check rate "
        f"(inline {figures['inline_ratio']:.2f}, cached GGUF {figures['gguf_ratio']:.2f}; "
        f"a context never asked before {figures['distinct_ratio']:.2f}: the planner remembers "
        "answers to requests asked again); "
        f"server CPU per call over health's: inline {figures['inline_cpu_ratio']:.2f}x, "
        f"GGUF {figures['gguf_cpu_ratio']:.2f}x"
    )


def run(full: bool) -> dict[str, float]:
    """The benchmark at its quick or full size; prints its table, returns its figures."""
    rounds, calls, concurrency = (9, 2000, 16) if full else (6, 600, 16)
    with tempfile.TemporaryDirectory(prefix="bench-planner-") as tmp:
        figures = asyncio.run(measure(rounds, calls, concurrency, Path(tmp)))
    report(figures, rounds, calls, concurrency)
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    """Parse `--full`, run, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--full", action="store_true", help="the issue's sizes (longer)")
    run(parser.parse_args(argv).full)


if __name__ == "__main__":
    main()
