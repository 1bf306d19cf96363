"""Bench: instructions a call costs the planner itself, per kind of call (callgrind).

`planner_throughput`'s rates and CPU figures move with the machine's other load; instruction
counts do not. This bench starts the planner as `planner_throughput` does, but under
`valgrind --tool=callgrind`, warms it with 400 calls of each kind, then for each kind zeroes
the counters (`callgrind_control -z`), makes `--calls` calls (16 in flight) and dumps them
(`callgrind_control -d`): the dump's total over the calls is one call's instructions, every
thread of the planner counted.

Under valgrind every plan takes longer than the on-loop budget (`placing.INLINE_PLAN_S`), so
each would hop to the planning thread, which the planner at full speed does not do; the child
is started with no budget, so the path counted is the server's.

Kinds: `health` (a health Check), `gguf` (SizeContext of the cached GGUF, asked again: a
remembered answer), `distinct` (the same with a context never asked before, as
`planner_throughput` asks it). Needs valgrind. Run: `.venv/bin/python -m bench.planner_counts
[--calls N]` (cwd: the checkout to count).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import grpc

from bench.planner_throughput import ROOT, burst, call_kinds

_BOOT = (
    "import runpy, planner_svc.rpc.placing as p; "
    "p.PlanCosts.__init__.__defaults__ = (float('inf'), p.KEPT_COSTS); "
    "runpy.run_module('planner_svc', run_name='__main__', alter_sys=True)"
)
"""The planner with no on-loop budget: every plan runs on the loop, as at full speed."""

KINDS = ("health", "gguf", "distinct")


def _dumped_total(path: Path) -> int:
    """The instructions a callgrind dump counts (its `summary:` or `totals:` line)."""
    for line in path.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"{path} has no total")


async def measure(calls: int, folder: Path) -> dict[str, float]:
    """Instructions per call of each kind (`KINDS`) in a planner under callgrind."""
    out = folder / "callgrind.out"
    log = (folder / "planner.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        sys.executable,
        "-c",
        _BOOT,
        "--listen",
        "127.0.0.1:0",
        "--log-format",
        "json",
        "--allow-root",
        str(folder),
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
    )
    log.close()
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 300)
    found = re.search(rb"listening on (\S+:\d+)", line)
    if found is None:
        process.kill()
        await process.wait()
        raise RuntimeError(f"the planner did not say where it listens; see {folder}")
    channel = grpc.aio.insecure_channel(found.group(1).decode())
    figures: dict[str, float] = {}
    try:
        kinds = call_kinds(channel, folder)
        await kinds["gguf"]()
        for name in KINDS:
            await burst(kinds[name], 400, 16)
        for name in KINDS:
            subprocess.run(
                ["callgrind_control", "-z", str(process.pid)], check=True, capture_output=True
            )
            await burst(kinds[name], calls, 16)
            before = set(folder.glob("callgrind.out*"))
            subprocess.run(
                ["callgrind_control", "-d", str(process.pid)], check=True, capture_output=True
            )
            dumps = sorted(set(folder.glob("callgrind.out*")) - before)
            figures[name] = max(_dumped_total(d) for d in dumps) / calls
    finally:
        await channel.close()
        process.terminate()
        await process.wait()
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    """Parse `--calls`, count, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--calls", type=int, default=300, help="calls counted a kind")
    opts = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-counts-") as tmp:
        figures = asyncio.run(measure(opts.calls, Path(tmp)))
    print(f"planner under callgrind, {opts.calls} calls a kind, 16 in flight")
    for name in KINDS:
        print(f"{name:<10} {figures[name]:>12,.0f} instructions a call")
    print(f"distinct / health {figures['distinct'] / figures['health']:.2f}")


if __name__ == "__main__":
    main()
