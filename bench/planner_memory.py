"""Bench: the planner's RSS after many distinct large requests, against its start; and how
long other calls wait while one large request is planned.

The planner runs as a child process (`python -m planner_svc`), as deployed, with its answer
cache bounded to `--cache-mib` (LLMGW_ANSWER_CACHE_BYTES). Each request is a SizeContext of
Llama-3.1-8B (inline shape) with 64 vLLM profiles of 252 arguments, ~0.9 MiB serialized (near
the default 1 MiB limit), made distinct by one argument, so no answer is asked twice and every
answer (~2.8 MiB) enters the cache and pushes older ones out.

- start: the child's RSS after `warmup` such requests (imports, gRPC's buffers and the
  allocator's high-water mark for one request are part of any running planner);
- then `requests` more, RSS sampled every quarter; growth = last - start;
- the baseline, in the same run: a planner whose cache keeps nothing (a bound of 1 byte), sent
  the same requests; its growth is what a planner grows by without remembering answers
  (allocator, gRPC). Goal: the subject's growth beyond the baseline's is within the cache's
  byte bound (growth_over_bound <= 1), and flat after the cache is full;
- stall: health Checks sent back to back while one large SizeContext is in flight, their
  p50/max latency against the same Checks on an idle planner (same run).

Run: `.venv/bin/python -m bench.planner_memory [--requests 1000] [--cache-mib 32]`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.planner_throughput import INVENTORY, LLAMA_8B, start_child
from llmgw.clients.planner import ANSWER_BYTES
from llmgw.common.v1 import common_pb2
from llmgw.planner.v1 import planner_pb2, planner_pb2_grpc

MIB = 1 << 20


def large_request(tag: int, profiles: int = 64, pairs: int = 125) -> planner_pb2.SizeContextRequest:
    """A SizeContext of ~0.9 MiB: `profiles` vLLM profiles of `pairs` flag/value pairs beside
    the context flag; `tag` makes it distinct."""
    model = common_pb2.Model(name="big", context_length=8192, shape=LLAMA_8B)
    for p in range(profiles):
        args = ["--max-model-len", "8192"]
        for a in range(pairs):
            args += [f"--x{a}", f"{tag}-{p}-" + "v" * 100]
        model.profiles.append(
            common_pb2.Profile(
                name=f"p{p}", engine="vllm", args=args, gpu_class="H100-80GB", gpus_per_node=1
            )
        )
    return planner_pb2.SizeContextRequest(model=model, tokens=16_384, inventory=INVENTORY)


async def health_latencies(
    health: health_pb2_grpc.HealthStub, until: asyncio.Future[Any] | int
) -> list[float]:
    """Seconds per Check, back to back: until `until` is done, or `until` of them."""
    out: list[float] = []
    while (isinstance(until, int) and len(out) < until) or (
        not isinstance(until, int) and not until.done()
    ):
        start = time.perf_counter()
        await health.Check(health_pb2.HealthCheckRequest())
        out.append(time.perf_counter() - start)
    return out


async def rss_run(
    requests: int, warmup: int, cache_bytes: int, folder: Path, *, stall: bool
) -> dict[str, float]:
    """One planner with its answer cache bounded to `cache_bytes`: RSS after the warm-up and
    every quarter of `requests`; with `stall`, the health latencies beside large requests."""
    env = {"LLMGW_ANSWER_CACHE_BYTES": str(cache_bytes)}
    child = await start_child(
        "planner_svc", ["--listen", "127.0.0.1:0"], folder / f"planner-{cache_bytes}.log", env=env
    )
    options = [("grpc.max_receive_message_length", ANSWER_BYTES)]
    channel = grpc.aio.insecure_channel(child.address, options=options)
    stub = planner_pb2_grpc.PlannerServiceStub(channel)
    health = health_pb2_grpc.HealthStub(channel)
    figures: dict[str, float] = {}
    try:
        sizes = []
        for i in range(warmup):
            request = large_request(-1 - i)
            sizes.append(request.ByteSize())
            await stub.SizeContext(request)
        start_rss = child.rss_bytes()
        figures["request_mib"] = statistics.mean(sizes) / MIB
        figures["start_rss_mib"] = start_rss / MIB
        marks = {requests * q // 4 for q in (1, 2, 3, 4)}
        for i in range(1, requests + 1):
            answer = await stub.SizeContext(large_request(i))
            if i == 1:
                figures["answer_mib"] = answer.ByteSize() / MIB
            if i in marks:
                figures[f"rss_mib@{i}"] = child.rss_bytes() / MIB
        figures["growth_mib"] = (child.rss_bytes() - start_rss) / MIB
        if stall:
            idle = await health_latencies(health, 50)
            busy: list[float] = []
            for i in range(5):
                call = asyncio.ensure_future(stub.SizeContext(large_request(requests + 1 + i)))
                busy += await health_latencies(health, call)
                await call
            figures["health_idle_p50_ms"] = statistics.median(idle) * 1e3
            figures["health_busy_p50_ms"] = statistics.median(busy) * 1e3
            figures["health_busy_max_ms"] = max(busy) * 1e3
            figures["health_busy_checks"] = float(len(busy))
            figures["busy_over_idle_p50"] = statistics.median(busy) / statistics.median(idle)
    finally:
        await channel.close()
        await child.stop()
    return figures


async def measure(requests: int, warmup: int, cache_mib: int, folder: Path) -> dict[str, float]:
    """The baseline (a planner whose cache keeps nothing: 1 byte) and the subject (a cache of
    `cache_mib`), the same requests to each; the figures of both, the baseline's prefixed
    `nocache_`, and the subject's growth beyond the baseline's against the cache's bound."""
    baseline = await rss_run(requests, warmup, 1, folder, stall=False)
    figures = await rss_run(requests, warmup, cache_mib * MIB, folder, stall=True)
    figures.update({f"nocache_{k}": v for k, v in baseline.items() if "rss" in k or "growth" in k})
    figures["cache_bound_mib"] = float(cache_mib)
    figures["growth_over_bound"] = (figures["growth_mib"] - baseline["growth_mib"]) / cache_mib
    quarter = requests // 4
    if quarter:
        figures["late_growth_mib"] = figures[f"rss_mib@{requests}"] - figures[f"rss_mib@{quarter}"]
    return figures


def report(figures: dict[str, float], requests: int) -> None:
    """Print the figures as a table."""
    print(
        f"{requests} distinct SizeContext requests of {figures['request_mib']:.2f} MiB "
        f"(answers {figures.get('answer_mib', 0):.2f} MiB), answer cache bound "
        f"{figures['cache_bound_mib']:.0f} MiB"
    )
    print(f"  start RSS (after warm-up)   {figures['start_rss_mib']:10.1f} MiB")
    for key, value in figures.items():
        if key.startswith("rss_mib@"):
            print(f"  RSS after {key.split('@')[1]:>5} requests    {value:10.1f} MiB")
    print(
        f"  growth                      {figures['growth_mib']:10.1f} MiB; with a cache that "
        f"keeps nothing {figures['nocache_growth_mib']:.1f} MiB (start "
        f"{figures['nocache_start_rss_mib']:.1f} MiB)"
    )
    print(
        f"  growth beyond the no-cache planner's = {figures['growth_over_bound']:.2f} x the "
        "cache bound (goal <= 1)"
    )
    if "late_growth_mib" in figures:
        print(
            f"  growth from the first quarter to the end {figures['late_growth_mib']:.1f} MiB "
            "(flat: ~0)"
        )
    print(
        f"  health Check p50 idle {figures['health_idle_p50_ms']:.2f} ms, while a large "
        f"request is planned {figures['health_busy_p50_ms']:.2f} ms (max "
        f"{figures['health_busy_max_ms']:.1f} ms over {figures['health_busy_checks']:.0f} "
        f"checks): busy / idle = {figures['busy_over_idle_p50']:.2f}"
    )


def run(full: bool) -> dict[str, float]:
    """The benchmark at the issue's size (1,000 requests) or a quick one (200)."""
    requests = 1000 if full else 200
    with tempfile.TemporaryDirectory() as folder:
        figures = asyncio.run(measure(requests, 5, 32, Path(folder)))
    report(figures, requests)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--cache-mib", type=int, default=32)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        figures = asyncio.run(measure(opts.requests, opts.warmup, opts.cache_mib, Path(folder)))
    report(figures, opts.requests)


if __name__ == "__main__":
    main()
