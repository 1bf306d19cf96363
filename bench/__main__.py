"""Run the benchmarks: `python -m bench [--quick | --full] [name ...]`, then a summary table.

With no names every benchmark runs in turn. `--quick` (the default) scales the sizes down so
the whole run fits in about five minutes on two shared cores; `--full` runs the issues' sizes.
Every figure is measured against a baseline of the same run (see bench/README.md); goals are
reported, never asserted: the exit code says only whether every benchmark ran.
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from bench import (
    agent_fanin,
    canary_undo,
    fleet_failover,
    fleet_spread,
    planner_memory,
    planner_throughput,
    rollout_overhead,
    store_pg,
    stream_flood,
    watch_replicas,
)

ROOT = Path(__file__).resolve().parents[1]
Figures = dict[str, float]


def script_figures(output: str, patterns: Sequence[tuple[str, str]]) -> Figures:
    """Figures read from a benchmark's printed lines: (figure name, regex with one group)."""
    figures: Figures = {}
    for name, pattern in patterns:
        for i, found in enumerate(re.finditer(pattern, output, re.MULTILINE)):
            key = name if i == 0 else f"{name}#{i + 1}"
            figures[key] = float(found.group(1).replace(",", ""))
    return figures


def _external(argv: Sequence[str], patterns: Sequence[tuple[str, str]]) -> Figures:
    """Run another engineer's benchmark as they run it, echo its output, read its figures.

    Raises:
        RuntimeError: it exited non-zero.
    """
    done = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    print(done.stdout, end="")
    if done.returncode != 0:
        print(done.stderr, end="", file=sys.stderr)
        raise RuntimeError(f"{' '.join(argv)} exited with {done.returncode}")
    return script_figures(done.stdout, patterns)


def gguf_header(full: bool) -> Figures:
    """bench/gguf_header.py (a script): fetched/header ratio per file, time ratio to 1 GB."""
    return _external(
        ["bench/gguf_header.py", *([] if full else ["--reads", "10"])],
        [
            ("fetched_ratio_1GB", r"^\s*1 GB\s+[\d,]+\s+[\d,]+\s+[\d,]+\s+([\d.]+)"),
            ("fetched_ratio_400GB_padded", r"^\s*400 GB\*\s+[\d,]+\s+[\d,]+\s+[\d,]+\s+([\d.]+)"),
            ("fetched_ratio_400GB", r"^\s*400 GB\s+[\d,]+\s+[\d,]+\s+[\d,]+\s+([\d.]+)"),
            ("time_ratio_400GB_padded", r"time ratio 400 GB\* / 1 GB .*: ([\d.]+)"),
            ("time_ratio_400GB", r"time ratio 400 GB / 1 GB .*: ([\d.]+)"),
        ],
    )


def shape_resolution(full: bool) -> Figures:
    """bench/shape_resolution.py (a module): cold, disk and warm resolution."""
    return _external(
        ["-m", "bench.shape_resolution", *([] if full else ["--rounds", "10"])],
        [
            ("cold_ms", r"^cold .*median\s+([\d.]+) ms"),
            ("disk_ms", r"^disk .*median\s+([\d.]+) ms"),
            ("warm_us", r"^warm .*mean\s+([\d.]+) us"),
            ("cold_over_warm", r"cold / warm = ([\d,]+)x"),
            ("burst_fetches", r"fetches=(\d+)"),
        ],
    )


@dataclass(frozen=True)
class Goal:
    """A figure's goal: the figure names it applies to (regex), the text, and its test."""

    figures: str
    text: str
    met: Callable[[float], bool]


@dataclass(frozen=True)
class Bench:
    """One benchmark: how it runs and which of its figures the summary shows."""

    run: Callable[[bool], Figures]
    headline: str
    """Regex of the figure names shown in the summary."""
    goals: tuple[Goal, ...] = ()


BENCHES: dict[str, Bench] = {
    "planner_throughput": Bench(
        planner_throughput.run,
        r"^(health_per_s|inline_per_s|gguf_per_s|distinct_per_s|inline_ratio|gguf_ratio|"
        r"distinct_ratio|\w+_cpu_ratio)$",
        (Goal(r"^(inline|gguf|distinct)_ratio$", ">= 0.8 of health", lambda v: v >= 0.8),),
    ),
    "planner_memory": Bench(
        planner_memory.run,
        r"^(request_mib|answer_mib|start_rss_mib|growth_mib|nocache_growth_mib|late_growth_mib|"
        r"cache_bound_mib|growth_over_bound|"
        r"health_idle_p50_ms|health_busy_p50_ms|health_busy_max_ms)$",
        (Goal(r"^growth_over_bound$", "<= 1 (within the cache bound)", lambda v: v <= 1.0),),
    ),
    "gguf_header": Bench(
        gguf_header,
        r".",
        (
            Goal(r"^fetched_ratio", "<= 1.25", lambda v: v <= 1.25),
            Goal(r"^time_ratio", "flat (<= 1.5)", lambda v: v <= 1.5),
        ),
    ),
    "shape_resolution": Bench(
        shape_resolution,
        r".",
        (Goal(r"^burst_fetches$", "one fetch", lambda v: v == 1),),
    ),
    "agent_fanin": Bench(
        agent_fanin.run,
        r"^(cpu_ms_per_agent_s|rss_kb_per_agent|ack_p50_ms|ack_p99_ms|"
        r"all_ready_ms|ack_p50_ratio|change_fleet_cpu_pct|change_agents_cpu_pct)@",
    ),
    "watch_replicas": Bench(
        watch_replicas.run,
        r"^(last_p50_ms|last_p99_ms|each_p50_ms)@|^last_p(50|99)_ratio$",
    ),
    "stream_flood": Bench(
        stream_flood.run,
        r"^(p50_ms|p99_ms|p99_ratio|held|refused|rss_mb)@",
        (
            Goal(r"^p99_ratio@", "<= 2x idle", lambda v: v <= 2.0),
            Goal(r"^rss_mb@", "<= 300 MB", lambda v: v <= 300.0),
        ),
    ),
    "rollout_overhead": Bench(
        rollout_overhead.run,
        r"^(\w+_floor_s|\w+_overhead_s@\d+|\w+_floor_ratio@\d+|parallel_ratio)$",
        (
            Goal(r"_overhead_s@", "< 0.5 s/replica", lambda v: v < 0.5),
            Goal(r"^parallel_ratio$", "~1 (parallel)", lambda v: v <= 1.25),
        ),
    ),
    "store_pg": Bench(
        store_pg.run,
        r"^((set_context|list_replicas)_(sqlite_ms|postgresql_ms|pg_over_sqlite)"
        r"|check_p99_(sqlite|postgresql)_ms)$",
        (
            Goal(r"^set_context_pg_over_sqlite$", "<= 1.2", lambda v: v <= 1.2),
            Goal(r"^check_p99_postgresql_ms$", "< 20 ms", lambda v: v < 20),
        ),
    ),
    "fleet_failover": Bench(
        fleet_failover.run,
        r"^(lead_(min|median|max)_s|agents_(median|max)_s|lost|doubled|stuck|restarted|"
        r"agents_not_back|trials)$",
        (
            Goal(r"^lead_max_s$", "<= 10 s", lambda v: v <= 10.0),
            Goal(r"^(lost|doubled|stuck|restarted|agents_not_back)$", "none", lambda v: v == 0),
        ),
    ),
    "canary_undo": Bench(
        canary_undo.run,
        r"^(burst_p50_s|burst_p99_s|abort_p99_s|burst_over_abort_p99)$",
        (Goal(r"^burst_p99_s$", "<= 1 report interval + 1 s (2 s)", lambda v: v <= 2.0),),
    ),
    "fleet_spread": Bench(
        fleet_spread.run,
        r"^(cpu_ms_per_agent_s|busiest_ms_per_agent_s|ack_p99_ms)@"
        r"|^(cpu_per_agent_ratio|busiest_per_agent_ratio|ack_p99_ratio|agents)$",
        (
            Goal(r"^busiest_per_agent_ratio$", "<= 0.4", lambda v: v <= 0.4),
            Goal(r"^ack_p99_ms@3$", "<= 1000 ms", lambda v: v <= 1000.0),
        ),
    ),
}


def failure(exc: Exception) -> str:
    """One line saying why a benchmark failed (a gRPC error by its code and details)."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def summary(results: dict[str, tuple[Figures | str, float]], full: bool) -> None:
    """Print the headline figures of every benchmark run, with goals where the issues set one."""
    print()
    print(
        f"== summary ({'full' if full else 'quick'} run; ratios against baselines of the same "
        "run; goals reported, not asserted) =="
    )
    print(f"{'bench':<19} {'figure':<34} {'value':>12}  goal")
    for name, (figures, took_s) in results.items():
        if isinstance(figures, str):
            print(f"{name:<19} {'FAILED':<34} {'':>12}  {figures}")
            continue
        bench = BENCHES[name]
        shown = [k for k in figures if re.search(bench.headline, k)]
        for key in shown:
            value = figures[key]
            goal = next((g for g in bench.goals if re.search(g.figures, key)), None)
            verdict = ""
            if goal is not None and not math.isnan(value):
                verdict = f"{goal.text}: {'met' if goal.met(value) else 'MISSED'}"
            print(f"{name:<19} {key:<34} {value:>12,.3f}  {verdict}")
        print(f"{name:<19} {'(took s)':<34} {took_s:>12,.1f}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmarks named (all by default); 1 if any failed to run, else 0."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="scaled-down sizes (the default)")
    size.add_argument("--full", action="store_true", help="the issues' sizes (longer)")
    parser.add_argument("names", nargs="*", metavar="name", help=f"of {', '.join(BENCHES)}")
    opts = parser.parse_args(argv)
    unknown = [n for n in opts.names if n not in BENCHES]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; known: {', '.join(BENCHES)}")
    results: dict[str, tuple[Figures | str, float]] = {}
    for name in opts.names or list(BENCHES):
        print(f"\n== {name} ({'full' if opts.full else 'quick'}) ==", flush=True)
        start = time.perf_counter()
        try:
            figures: Figures | str = BENCHES[name].run(opts.full)
        except Exception as exc:  # one benchmark failing must not hide the others' figures
            traceback.print_exc()
            figures = failure(exc)
        results[name] = (figures, time.perf_counter() - start)
        sys.stdout.flush()
    summary(results, opts.full)
    return 1 if any(isinstance(f, str) for f, _ in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
