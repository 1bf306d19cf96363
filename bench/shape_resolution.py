"""Shape resolution of an hf:// source: cold cache vs warm cache, as ratios in one run.

The source is served by the local Hugging Face-shaped server (llmgw/testing/hub.py), so
the numbers measure the planner's own path (huggingface_hub's HEAD/GET, the safetensors header
by range, the config reader, the resolver's cache), not the internet. Three states:

- cold: an empty disk cache and a new resolver (config.json downloaded, weights sized from the
  safetensors header);
- disk: a new resolver over a disk cache that holds config.json (the Hub is still asked for
  freshness and the header);
- warm: the resolver's in-memory cache.

And one burst: N concurrent cold resolves of one source, which must make one fetch.

Run from the repository root: `.venv/bin/python -m bench.shape_resolution [--rounds N]`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import pytest

from llmgw.testing.hub import HFServer
from planner_svc.sources.resolver import ShapeResolver
from tests.support.hf_fixtures import point_hub_at
from tests.support.hf_repos import LLAMA_1B, default_repos

SOURCE = f"hf://{LLAMA_1B}"


async def _timed(resolver: ShapeResolver) -> float:
    start = time.perf_counter()
    await resolver.resolve(SOURCE)
    return time.perf_counter() - start


async def _measure(server: HFServer, home: Path, mp: pytest.MonkeyPatch, rounds: int) -> None:
    cold: list[float] = []
    disk: list[float] = []
    requests_cold: list[int] = []
    for i in range(rounds):
        point_hub_at(mp, server.url, home / f"cold-{i}")
        server.reset_counts()
        cold.append(await _timed(ShapeResolver()))
        requests_cold.append(server.count(path=LLAMA_1B) + server.count(listener="cdn"))
        disk.append(await _timed(ShapeResolver()))

    resolver = ShapeResolver()
    await resolver.resolve(SOURCE)
    warm_rounds = max(1000, rounds * 100)
    start = time.perf_counter()
    for _ in range(warm_rounds):
        await resolver.resolve(SOURCE)
    warm = (time.perf_counter() - start) / warm_rounds

    burst = 50
    point_hub_at(mp, server.url, home / "burst")
    burst_resolver = ShapeResolver()
    start = time.perf_counter()
    await asyncio.gather(*(burst_resolver.resolve(SOURCE) for _ in range(burst)))
    burst_s = time.perf_counter() - start

    cold_s, disk_s = statistics.median(cold), statistics.median(disk)
    print(f"source: {SOURCE} via {server.url} ({rounds} cold rounds)")
    print(f"cold  (empty disk cache, new resolver): median {cold_s * 1e3:8.2f} ms")
    print(f"disk  (disk cache, new resolver):       median {disk_s * 1e3:8.2f} ms")
    print(f"warm  (resolver cache hit):             mean   {warm * 1e6:8.2f} us")
    print(f"cold / warm = {cold_s / warm:,.0f}x   disk / warm = {disk_s / warm:,.0f}x")
    print(f"requests to the hub per cold resolution: {statistics.median(requests_cold):.0f}")
    print(
        f"{burst} concurrent cold resolves: {burst_s * 1e3:.2f} ms, "
        f"fetches={burst_resolver.stats.fetches} misses={burst_resolver.stats.misses}"
    )


def main() -> None:
    """Run the benchmark and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="cold resolutions to time")
    args = parser.parse_args()
    with (
        HFServer(default_repos()) as server,
        tempfile.TemporaryDirectory() as tmp,
        pytest.MonkeyPatch.context() as mp,
    ):
        asyncio.run(_measure(server, Path(tmp), mp, args.rounds))


if __name__ == "__main__":
    main()
