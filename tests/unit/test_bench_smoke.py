"""Each benchmark's core at a tiny size: it runs to the end and its figures are sane.

No timing thresholds: the machine is shared; these only pin that the benchmarks still work
against the services as they are (figures present, finite, latencies and ratios positive).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench import __main__ as bench_main
from bench import (
    agent_fanin,
    canary_undo,
    go_swarm,
    planner_memory,
    planner_throughput,
    rollout_overhead,
    sizing_loop,
    stream_flood,
    watch_replicas,
)


def assert_sane(figures: dict[str, float], positive: tuple[str, ...]) -> None:
    """Every figure is a finite number; those whose names start with `positive` are > 0,
    except CPU times, which a tiny run may measure as 0 (/proc counts in 10 ms ticks), and CPU
    per agent, a difference against the idle fleet's window: in a 0.2 s window one tick is
    50 ms/s, so a run of 2 or 3 agents may land a tick either way of it."""
    assert figures, "the benchmark returned no figures"
    for key, value in figures.items():
        assert isinstance(value, float | int) and math.isfinite(value), (key, value)
        if "cpu_ms_per_agent" in key:
            continue
        if "_cpu_" in key:
            assert value >= 0, (key, value)
        elif key.startswith(positive):
            assert value > 0, (key, value)


def test_sizing_loop_reports_each_bucket(tmp_path: Path) -> None:
    """The in-process loop gives size_context's and the handler's CPU for each context
    bucket."""
    figures = sizing_loop.measure(calls=5, repeats=1, folder=tmp_path)
    assert_sane(figures, ("sizing_", "handler_"))
    assert set(figures) == {
        f"{part}_{bucket}_us" for part in ("sizing", "handler") for bucket in sizing_loop.BUCKETS
    }


async def test_planner_throughput_reports_rates_and_ratios(tmp_path: Path) -> None:
    """SizeContext (inline and cached GGUF) and health rates come back with their ratios."""
    figures = await planner_throughput.measure(rounds=2, calls=20, concurrency=4, folder=tmp_path)
    assert {"health_per_s", "inline_ratio", "gguf_ratio", "gguf_cpu_us"} <= set(figures)
    assert_sane(figures, ("health_", "inline_", "gguf_"))


async def test_planner_memory_reports_rss_growth_against_the_cache_bound(tmp_path: Path) -> None:
    """Distinct large requests run against a child planner; its RSS, the growth over the
    cache bound and the health latencies beside a large request come back."""
    figures = await planner_memory.measure(requests=4, warmup=1, cache_mib=4, folder=tmp_path)
    assert {"start_rss_mib", "rss_mib@4", "growth_over_bound", "busy_over_idle_p50"} <= set(figures)
    assert figures["cache_bound_mib"] == 4
    assert figures["request_mib"] > 0.5
    assert_sane(figures, ("start_rss", "rss_mib", "health_", "request_", "answer_"))


async def test_agent_fanin_reports_cpu_memory_and_ack_latency(tmp_path: Path) -> None:
    """Agents join a child fleet, every node is READY, and every agent's ack is timed."""
    figures = await agent_fanin.measure([1, 3], tmp_path, window_s=0.2, rounds=1, heartbeat_s=1.0)
    assert figures["ready_nodes@3"] == 3
    for n in (1, 3):
        assert {f"rss_kb_per_agent@{n}", f"cpu_ms_per_agent_s@{n}"} <= set(figures)
    assert_sane(figures, ("ack_", "all_ready_", "rss_mb", "join_s"))
    # CPU is read in clock ticks (10 ms): a change of 3 replicas may take none.
    assert figures["change_fleet_cpu_pct@3"] >= 0
    assert figures["change_agents_cpu_pct@3"] >= 0


@pytest.mark.timeout(400)
async def test_agent_fanin_go_swarm_acks_on_the_benchs_clock(tmp_path: Path) -> None:
    """With `--swarm go` the Go program's agents join, every one acks the change, and each
    Ack, stamped in the swarm's process, falls between the call and the last replica routable
    on the bench's clock (a swarm on another clock would land outside)."""
    if go_swarm.go_tool() is None:
        pytest.skip("go is not installed: `--swarm go` builds bench/swarm with it")
    figures = await agent_fanin.measure(
        [3], tmp_path, window_s=0.2, rounds=1, heartbeat_s=1.0, swarm="go"
    )
    assert figures["ready_nodes@3"] == 3
    assert figures["acks@3"] == 3
    assert_sane(figures, ("ack_", "all_ready_", "rss_mb", "join_s"))
    # An agent acks before it reports HEALTHY, which comes before the watcher sees it routable.
    assert figures["ack_max_ms@3"] < figures["all_ready_ms@3"]
    assert figures["change_agents_cpu_pct@3"] >= 0


async def test_agent_fanin_go_swarm_over_mutual_tls(tmp_path: Path) -> None:
    """The Go swarm's agents present their nodes' certificates: both modes join and ack."""
    if go_swarm.go_tool() is None:
        pytest.skip("go is not installed: `--swarm go` builds bench/swarm with it")
    figures = await agent_fanin.measure_tls(
        [2], tmp_path, window_s=0.2, rounds=1, heartbeat_s=1.0, swarm="go"
    )
    for mode in ("plain", "mtls"):
        assert figures[f"{mode}_ready_nodes@2"] == 2
        assert figures[f"{mode}_acks@2"] == 2
        assert figures[f"{mode}_ack_max_ms@2"] < figures[f"{mode}_all_ready_ms@2"]
    # The CPU ratio is left out: a 0.2 s window may count no 10 ms tick of the fleet's CPU.
    assert_sane(
        {k: v for k, v in figures.items() if not k.startswith("cpu_per_agent_ratio")},
        ("plain_ack_", "mtls_ack_", "ack_p99_ratio"),
    )


async def test_agent_fanin_go_swarm_without_go_says_what_is_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where go is missing, `--swarm go` stops at once naming the tool and the other swarm."""
    monkeypatch.setattr(go_swarm, "go_tool", lambda: None)
    with pytest.raises(go_swarm.SwarmError, match=r"needs the go tool.*--swarm python"):
        await agent_fanin.measure([1], tmp_path, window_s=0.2, rounds=1, swarm="go")


async def test_watch_replicas_reports_the_time_to_every_watcher(tmp_path: Path) -> None:
    """Replicas turned healthy reach one watcher, then three; both lines and their ratio."""
    figures = await watch_replicas.measure(replicas=2, watchers=3, folder=tmp_path)
    assert {"last_p50_ms@1", "last_p99_ms@3", "each_p50_ms@3"} <= set(figures)
    assert_sane(figures, ("last_", "each_"))


async def test_rollout_overhead_reports_both_variants_and_the_parallel_pair(
    tmp_path: Path,
) -> None:
    """Rollouts with scripted and real agents succeed and report their time beyond the floor."""
    size = rollout_overhead.Size(
        sizes=(1, 2), real_sizes=(1,), repeats=1, floor_s=0.05, load_s=0.05, parallel_replicas=1
    )
    figures = await rollout_overhead.measure(size, tmp_path, real=True)
    for key in ("scripted_overhead_s@2", "real_rollout_s@1", "real_floor_s", "parallel_ratio"):
        assert key in figures
    # Overheads are differences (a fast rollout may beat R x floor); only their sign is free.
    assert_sane(figures, ("scripted_rollout", "real_rollout", "real_floor", "parallel_"))


async def test_stream_flood_reports_latency_held_streams_and_memory(tmp_path: Path) -> None:
    """A small flood (300 streams: spread over two identities, then from one) is held, the
    one identity's past its cap refused, and every round's p99 and RSS reported."""
    figures = await stream_flood.measure(300, tmp_path)
    assert figures["held@one"] + figures["refused@one"] == 300
    assert figures["held@one"] <= 256
    assert figures["held@spread"] > 0
    assert {"p99_ratio@spread", "p99_ratio@one", "rss_mb@spread"} <= set(figures)
    assert_sane(figures, ("p50_", "p99_", "rss_"))


async def test_canary_undo_reports_bursts_against_aborts(tmp_path: Path) -> None:
    """A canary failed by a burst and one aborted are both timed back to full old weight."""
    figures = await canary_undo.measure(1, tmp_path)
    assert {"burst_p99_s", "abort_p99_s", "burst_over_abort_p99"} <= set(figures)
    assert_sane(figures, ("burst_", "abort_"))


def test_the_runner_knows_every_benchmark_and_refuses_unknown_names() -> None:
    """`python -m bench` lists all twelve benchmarks and refuses a name it does not know."""
    assert set(bench_main.BENCHES) == {
        "planner_throughput",
        "planner_memory",
        "gguf_header",
        "shape_resolution",
        "agent_fanin",
        "watch_replicas",
        "rollout_overhead",
        "store_pg",
        "fleet_failover",
        "fleet_spread",
        "stream_flood",
        "canary_undo",
    }
    with pytest.raises(SystemExit) as refused:
        bench_main.main(["no_such_bench"])
    assert refused.value.code == 2


def test_figures_are_read_from_other_benchmarks_output() -> None:
    """The summary reads the script benchmarks' printed figures (thousands separators too)."""
    out = "cold / warm = 8,241x   disk / warm = 926x\n50 concurrent: fetches=1 misses=50\n"
    figures = bench_main.script_figures(
        out, [("cold_over_warm", r"cold / warm = ([\d,]+)x"), ("fetches", r"fetches=(\d+)")]
    )
    assert figures == {"cold_over_warm": 8241.0, "fetches": 1.0}


def test_a_failure_is_summarised_in_one_line() -> None:
    """A benchmark that raised shows in the summary as one line naming the error."""
    assert bench_main.failure(RuntimeError("the fleet did not start\nsee its log")) == (
        "RuntimeError: the fleet did not start"
    )
