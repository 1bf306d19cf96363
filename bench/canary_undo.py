"""Bench: from an error burst in a canary's traffic reports to the old revision at full weight.

A model of two one-card vLLM replicas (scripted agents, two nodes of four cards) gets a
SetContext as a canary (steps 25, 50, 100 %, a step lasting ten minutes, judged after 20
requests); once its first step's weights reach a gateway's routing table (llmgw.testing.router,
from WatchReplicas), a scripted gateway reports one interval (1 s) in which the canary answered
40 % 5xx. The time from that ReportTraffic call to the table holding no endpoint of the new
revision and the old revision's endpoints at their full weight is one trial (goal: p99 within
one report interval plus 1 s, over 20 trials).

Baseline, same run: the same trial ended by an operator's abort (CancelRollout) instead of the
burst: the same path from a request to the weights, without the analysis. The figure
`burst_over_abort_p99` is their ratio.

The fleet and the planner are child processes; the gateway and the agents are in this one.
Run: `.venv/bin/python -m bench.canary_undo [--trials N]`.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import grpc

from bench.agent_fanin import percentile, start_fleet_child, wait_for
from bench.planner_throughput import LLAMA_8B, start_child
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.gateway import ScriptedGateway, Seen
from llmgw.testing.router import Router
from llmgw.testing.scripted_agent import ScriptedAgent

TRIALS = 20
INTERVAL_S = 1
BACK_WITHIN_S = 30.0
"""How long a trial waits for the old revision's full weight before it fails."""
MODEL = "canary-bench"
READY = fleet_pb2.REPLICA_PHASE_READY


def model() -> common_pb2.Model:
    """Llama-3.1-8B (inline shape) on vLLM, two replicas of one card."""
    return common_pb2.Model(
        name=MODEL,
        source="hf://org/model",
        context_length=16384,
        shape=LLAMA_8B,
        profiles=[
            common_pb2.Profile(
                name="gpu",
                engine="vllm",
                args=["--max-model-len", "16384"],
                gpu_class="H100-80GB",
                gpus_per_node=1,
                replicas=2,
            )
        ],
    )


def by_revision(router: Router) -> dict[int, int]:
    """The routing table's weights summed per revision."""
    out: dict[int, int] = {}
    for ep in router.table.values():
        out[ep.revision] = out.get(ep.revision, 0) + ep.weight
    return out


async def trial(
    stub: fleet_pb2_grpc.FleetServiceAsyncStub,
    router: Router,
    gateway: ScriptedGateway,
    tokens: int,
    *,
    abort: bool,
) -> float:
    """One canary ended by a burst (or an abort): seconds from the call to full old weight."""
    # What "back" means is taken before the change, from a table that has settled on one
    # revision (the last trial's canary has left it): once the change is asked for, its canary
    # replica may reach the table before the answer reaches this trial (a loaded machine).
    await wait_for(lambda: _true(len(by_revision(router)) == 1), "the table on one revision", 60)
    old = {ep.revision for ep in router.table.values()}
    full = sum(100 * ep.cards for ep in router.table.values())
    answer = await stub.SetContext(
        fleet_pb2.SetContextRequest(
            name=MODEL,
            tokens=tokens,
            canary=fleet_pb2.CanaryPolicy(
                steps=[25, 50, 100], step_min_s=600, step_min_requests=20
            ),
        ),
        timeout=30,
    )
    new = answer.model.revision

    async def canary_routed() -> bool:
        w = by_revision(router)
        return new in w and w[new] == round(sum(w.values()) * 25 / 100)

    await wait_for(canary_routed, "the canary's first step in the routing table", 60)

    def back() -> bool:
        w = by_revision(router)
        return new not in w and sum(w.values()) == full and set(w) <= old

    start = time.perf_counter()
    if abort:
        await stub.CancelRollout(fleet_pb2.CancelRolloutRequest(id=answer.rollout_id), timeout=30)
    sent_at = start
    while not back():
        # As a gateway does, one report an interval while the burst lasts: a report whose
        # interval began before the step's window is not the step's (docs/rollouts.md), and the
        # next one counts. Timed from the first; bounded, so a canary never judged fails here.
        if not abort and (sent_at == start or time.perf_counter() - sent_at >= INTERVAL_S):
            sent_at = time.perf_counter()
            await gateway.send(
                list(router.table.values()),
                lambda ep: Seen(requests=50, errors_5xx=20 if ep.revision == new else 0),
            )
        if time.perf_counter() - start > BACK_WITHIN_S:
            raise RuntimeError(
                f"the old revision was not back at full weight in {BACK_WITHIN_S} s: "
                + await _state(stub, router, answer.rollout_id)
            )
        await asyncio.sleep(0.002)
    took = time.perf_counter() - start

    async def retired() -> bool:
        listed = await stub.ListReplicas(fleet_pb2.ListReplicasRequest(model=MODEL), timeout=30)
        return all(r.revision != new for r in listed.replicas)

    await wait_for(retired, "the canary replica retired", 60)
    return took


async def _state(
    stub: fleet_pb2_grpc.FleetServiceAsyncStub, router: Router, rollout_id: str
) -> str:
    """What the fleet and the routing table hold, for a trial that failed: whether the fleet
    did not act or the table did not hear of it."""
    try:
        got = await stub.GetRollout(fleet_pb2.GetRolloutRequest(id=rollout_id), timeout=10)
        ro = got.rollout
        rollout = f"rollout {ro.id} {fleet_pb2.RolloutState.Name(ro.state)} ({ro.reason!r})"
    except grpc.aio.AioRpcError as err:
        rollout = f"GetRollout failed: {err.code().name} {err.details()}"
    table = {ep.replica_id: (ep.revision, ep.weight) for ep in router.table.values()}
    return f"{rollout}; routing table seq {router.seq}: {table}"


async def measure(trials: int, folder: Path) -> dict[str, float]:
    """`trials` bursts and `trials` aborts, alternated; the figures."""
    planner = await start_child(
        "planner_svc", ["--listen", "127.0.0.1:0", "--log-format", "json"], folder / "planner.log"
    )
    fleet = await start_fleet_child(
        folder / "fleet", heartbeat_s=1.0, drain_s=0.0, planner=planner.address
    )
    agents = [ScriptedAgent(fleet.address, f"node-{i}", gpus=4) for i in range(2)]
    burst: list[float] = []
    aborted: list[float] = []
    try:
        for a in agents:
            a.start()
        async with grpc.aio.insecure_channel(fleet.address) as channel:
            stub: fleet_pb2_grpc.FleetServiceAsyncStub = fleet_pb2_grpc.FleetServiceStub(channel)
            await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model()), timeout=30)

            async def ready() -> bool:
                listed = await stub.ListReplicas(fleet_pb2.ListReplicasRequest(model=MODEL))
                return sum(1 for r in listed.replicas if r.phase == READY) == 2

            await wait_for(ready, "two READY replicas", 60)
            router = Router(stub, MODEL)
            await wait_for(lambda: _true(len(router.table) == 2), "the routing table", 30)
            gateway = ScriptedGateway(stub, "bench-gw", interval_s=INTERVAL_S)
            for i in range(trials):
                for abort in (False, True):
                    tokens = 4096 + 256 * (2 * i + int(abort))
                    took = await trial(stub, router, gateway, tokens, abort=abort)
                    (aborted if abort else burst).append(took)
            await router.stop()
    finally:
        for a in agents:
            await a.stop()
        await fleet.stop()
        await planner.stop()
    return {
        "burst_p50_s": percentile(burst, 50),
        "burst_p99_s": percentile(burst, 99),
        "burst_max_s": max(burst),
        "abort_p50_s": percentile(aborted, 50),
        "abort_p99_s": percentile(aborted, 99),
        "burst_over_abort_p99": percentile(burst, 99) / percentile(aborted, 99),
        "goal_s": INTERVAL_S + 1.0,
        "trials": float(trials),
    }


async def _true(value: bool) -> bool:
    return value


def report(figures: dict[str, float]) -> None:
    """Print the table."""
    print(
        f"canary undo: {int(figures['trials'])} trials each, report interval {INTERVAL_S} s; "
        "seconds from the call to the old revision at full weight in WatchReplicas"
    )
    print(f"{'ended by':<10} {'p50 s':>8} {'p99 s':>8}")
    print(f"{'burst':<10} {figures['burst_p50_s']:>8.3f} {figures['burst_p99_s']:>8.3f}")
    print(f"{'abort':<10} {figures['abort_p50_s']:>8.3f} {figures['abort_p99_s']:>8.3f}")
    goal = figures["goal_s"]
    met = "met" if figures["burst_p99_s"] <= goal else "MISSED"
    print(f"burst p99 / abort p99 = {figures['burst_over_abort_p99']:.2f}")
    print(f"goal: burst p99 <= {goal:.1f} s (one interval + 1 s): {met}")


def run(full: bool, trials: int = TRIALS) -> dict[str, float]:
    """The benchmark (the same size quick or full: the issue's 20 trials); its figures."""
    with tempfile.TemporaryDirectory(prefix="bench-canary-") as tmp:
        figures = asyncio.run(measure(trials, Path(tmp)))
    report(figures)
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    """Parse `--trials`, run, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--trials", type=int, default=TRIALS, help="trials of each kind")
    opts = parser.parse_args(argv)
    run(False, opts.trials)


if __name__ == "__main__":
    main()
