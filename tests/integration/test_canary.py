"""Canary rollouts judged by a scripted gateway's traffic reports: weights per step in
WatchReplicas, promotion to SUCCEEDED, failure undone on its own, holding for too few requests,
reports of several gateways summed and a repeated interval counted once (real gRPC fleet and
planner, scripted agents)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest

from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.gateway import ScriptedGateway, Seen
from llmgw.testing.router import Router
from llmgw.testing.scripted_agent import ScriptedAgent
from tests.integration.test_cli_ctl import ctl
from tests.integration.test_fleet_auth import ROLES, error_info, refused, settings
from tests.integration.test_fleet_tls import fleet_stub, make_pki, tls_fleet
from tests.integration.test_rollouts import cluster, reason_and_meta, replicas, vllm_model
from tests.support.fleet_procs import fleet_process
from tests.support.planner import running_planner

READY = fleet_pb2.REPLICA_PHASE_READY
E = fleet_pb2.RolloutEventKind


def policy(**fields: object) -> fleet_pb2.CanaryPolicy:
    """A quick canary: steps 25, 50, 100 % of a second each, judged after 20 requests."""
    base: dict[str, object] = {"steps": [25, 50, 100], "step_min_s": 1, "step_min_requests": 20}
    base.update(fields)
    return fleet_pb2.CanaryPolicy(**base)  # type: ignore[arg-type]


async def ready_model(stub: fleet_pb2_grpc.FleetServiceAsyncStub, n: int = 2) -> None:
    """Create vmodel with `n` replicas and wait until they are READY."""
    await stub.CreateModel(fleet_pb2.CreateModelRequest(model=vllm_model(replicas=n)))

    async def ready() -> bool:
        return sum(1 for r in await replicas(stub) if r.phase == READY) == n

    await assert_eventually(ready, what=f"{n} READY")


def weights_by_revision(router: Router) -> dict[int, int]:
    """The routing table's weights summed per revision."""
    out: dict[int, int] = {}
    for ep in router.table.values():
        out[ep.revision] = out.get(ep.revision, 0) + ep.weight
    return out


@contextlib.asynccontextmanager
async def reporting(
    gateway: ScriptedGateway,
    router: Router,
    seen: Callable[[fleet_pb2.Endpoint], Seen | None],
    every_s: float = 0.2,
) -> AsyncIterator[None]:
    """Report the routing table's endpoints as `seen` says, every `every_s`, meanwhile."""

    async def loop() -> None:
        while True:
            if router.table:
                await gateway.send(list(router.table.values()), seen)
            await asyncio.sleep(every_s)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def canary(stub: fleet_pb2_grpc.FleetServiceAsyncStub, rid: str) -> fleet_pb2.CanaryStatus:
    """A rollout's canary status now."""
    return (await stub.GetRollout(fleet_pb2.GetRolloutRequest(id=rid))).rollout.canary


async def test_healthy_reports_promote_every_step_with_weights_as_the_step_says(
    tmp_path: Path,
) -> None:
    """A context change as a canary: each step's weights reach WatchReplicas (new revision's
    endpoints sum to the step's share of the model's total), every step promotes on healthy
    reports, and the rollout SUCCEEDS with the new revision everywhere."""
    async with cluster(tmp_path) as (_fleet, stub, _agents):
        await ready_model(stub)
        router = Router(stub, "vmodel")
        gateway = ScriptedGateway(stub, "gw-a")
        async with reporting(gateway, router, lambda ep: Seen(requests=30)):
            answer = await stub.SetContext(
                fleet_pb2.SetContextRequest(name="vmodel", tokens=4096, canary=policy())
            )
            rid, new = answer.rollout_id, answer.model.revision
            seen_steps: list[int] = []
            async for ev in stub.WatchRollout(fleet_pb2.WatchRolloutRequest(id=rid)):
                if ev.kind == E.ROLLOUT_EVENT_KIND_CANARY_STEP and not ev.canary.promoted:
                    pct = ev.canary.weight_percent
                    seen_steps.append(pct)

                    def at_step(pct: int = pct) -> bool:
                        w = weights_by_revision(router)
                        total = sum(w.values())
                        return len(w) == 2 and w.get(new, 0) == round(total * pct / 100)

                    await assert_eventually(at_step, what=f"weights at {pct} %", timeout_s=5)
        ro = (await stub.GetRollout(fleet_pb2.GetRolloutRequest(id=rid))).rollout
        left = await replicas(stub)
        await router.stop()
    assert ro.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, ro.reason
    assert seen_steps == [25, 50, 100]
    assert ro.strategy == fleet_pb2.STRATEGY_CANARY and ro.canary.promoted
    assert ro.canary.canary.requests >= 20
    assert left and all(r.revision == new for r in left)


async def test_errors_on_the_canary_fail_it_and_the_old_revision_gets_its_weight_back(
    tmp_path: Path,
) -> None:
    """5xx reported against the canary only: FAILED with CANARY_ANALYSIS_FAILED (figures and
    thresholds in Rollout.failure and the events), the old revision back at its full weight
    within one report interval, and the new replicas retired."""
    async with cluster(tmp_path) as (_fleet, stub, _agents):
        await ready_model(stub)
        router = Router(stub, "vmodel")
        gateway = ScriptedGateway(stub, "gw-a")
        answer = await stub.SetContext(
            fleet_pb2.SetContextRequest(name="vmodel", tokens=4096, canary=policy(step_min_s=600))
        )
        rid, old, new = answer.rollout_id, answer.model.revision - 1, answer.model.revision

        async def canary_routed() -> bool:
            return (await canary(stub, rid)).weight_percent == 25 and new in weights_by_revision(
                router
            )

        await assert_eventually(canary_routed, what="the canary at 25 %", timeout_s=20)
        own = {ep.replica_id: ep for ep in router.table.values() if ep.revision == old}
        full = sum(100 * ep.cards for ep in own.values())

        def bad(ep: fleet_pb2.Endpoint) -> Seen:
            return Seen(requests=50, errors_5xx=20 if ep.revision == new else 0)

        sent = time.monotonic()
        await gateway.send(list(router.table.values()), bad)

        def back() -> bool:
            w = weights_by_revision(router)
            return new not in w and w.get(old) == full

        await assert_eventually(back, what="old revision at full weight", timeout_s=5)
        took = time.monotonic() - sent
        ro = (await stub.GetRollout(fleet_pb2.GetRolloutRequest(id=rid))).rollout
        assert ro.state == fleet_pb2.ROLLOUT_STATE_FAILED
        assert ro.failure.reason == "CANARY_ANALYSIS_FAILED"
        assert ro.failure.metadata["failed_checks"] == "error_ratio"
        assert ro.failure.metadata["error_ratio"] == "0.4"
        assert ro.failure.metadata["error_ratio_threshold"] == "0.01"
        assert "error_ratio 0.4 > 0.01" in ro.reason
        events = [ev async for ev in stub.WatchRollout(fleet_pb2.WatchRolloutRequest(id=rid))]
        judged = [ev for ev in events if ev.kind == E.ROLLOUT_EVENT_KIND_CANARY_ANALYSIS]
        assert judged[-1].canary.verdict == fleet_pb2.CANARY_VERDICT_FAIL
        assert judged[-1].canary.canary.errors == 20 and judged[-1].canary.canary.revision == new
        assert events[-1].kind == E.ROLLOUT_EVENT_KIND_ROLLOUT_FAILED

        async def retired() -> bool:
            return not [r for r in await replicas(stub) if r.revision == new]

        await assert_eventually(retired, what="the canary replica retired", timeout_s=10)
        assert {r.id for r in await replicas(stub)} == set(own)
        await router.stop()
    assert took <= gateway.interval_s + 1.0, f"{took:.2f} s to the old revision's full weight"


async def test_too_few_requests_hold_the_step(tmp_path: Path) -> None:
    """Reports with fewer requests than a step needs hold it past its least time: no
    promotion, verdict HOLD saying how many it has."""
    async with cluster(tmp_path) as (_fleet, stub, _agents):
        await ready_model(stub)
        router = Router(stub, "vmodel")
        gateway = ScriptedGateway(stub, "gw-a")
        answer = await stub.SetContext(
            fleet_pb2.SetContextRequest(
                name="vmodel", tokens=4096, canary=policy(step_min_requests=1000)
            )
        )
        rid = answer.rollout_id
        async with reporting(gateway, router, lambda ep: Seen(requests=5)):
            await asyncio.sleep(3.0)  # three times the step's least time
        status = await canary(stub, rid)
        await router.stop()
    assert status.step == 0 and status.weight_percent == 25
    assert status.verdict == fleet_pb2.CANARY_VERDICT_HOLD
    assert "of the 1000 requests" in status.findings[0]


async def test_a_step_held_past_max_hold_s_fails_the_canary_and_undoes_it(
    tmp_path: Path,
) -> None:
    """Too few requests for longer than max_hold_s: FAILED with CANARY_ANALYSIS_FAILED naming
    `hold_s` and its threshold, and the canary replica retired."""
    async with cluster(tmp_path) as (_fleet, stub, _agents):
        await ready_model(stub)
        router = Router(stub, "vmodel")
        gateway = ScriptedGateway(stub, "gw-a")
        answer = await stub.SetContext(
            fleet_pb2.SetContextRequest(
                name="vmodel", tokens=4096, canary=policy(step_min_requests=1000, max_hold_s=2)
            )
        )
        rid, new = answer.rollout_id, answer.model.revision

        async def failed() -> bool:
            got = await stub.GetRollout(fleet_pb2.GetRolloutRequest(id=rid))
            return got.rollout.state == fleet_pb2.ROLLOUT_STATE_FAILED

        async with reporting(gateway, router, lambda ep: Seen(requests=5)):
            await assert_eventually(failed, what="the held canary failed", timeout_s=30)
        ro = (await stub.GetRollout(fleet_pb2.GetRolloutRequest(id=rid))).rollout

        async def retired() -> bool:
            return not [r for r in await replicas(stub) if r.revision == new]

        await assert_eventually(retired, what="the canary replica retired", timeout_s=10)
        await router.stop()
    assert ro.failure.reason == "CANARY_ANALYSIS_FAILED"
    assert ro.failure.metadata["failed_checks"] == "hold_s"
    assert ro.failure.metadata["hold_s_threshold"] == "2"
    assert float(ro.failure.metadata["hold_s"]) >= 2
    assert "of the 1000 requests a step needs in" in ro.reason


async def test_two_gateways_are_summed_and_a_repeated_interval_counts_once(
    tmp_path: Path,
) -> None:
    """One gateway's 60 canary requests hold a step that needs 100, the same report sent
    again is a duplicate and changes nothing, and a second gateway's 60 make 120: promoted."""
    async with cluster(tmp_path) as (_fleet, stub, _agents):
        await ready_model(stub)
        router = Router(stub, "vmodel")
        a, b = ScriptedGateway(stub, "gw-a"), ScriptedGateway(stub, "gw-b")
        answer = await stub.SetContext(
            fleet_pb2.SetContextRequest(
                name="vmodel", tokens=4096, canary=policy(step_min_requests=100)
            )
        )
        rid, new = answer.rollout_id, answer.model.revision

        async def started() -> bool:
            return (await canary(stub, rid)).weight_percent == 25 and new in weights_by_revision(
                router
            )

        await assert_eventually(started, what="the canary's first step", timeout_s=20)
        endpoints = list(router.table.values())
        first = await a.send(endpoints, lambda ep: Seen(requests=60))
        assert not first.duplicate

        async def counted(n: int) -> bool:
            return (await canary(stub, rid)).canary.requests == n

        await assert_eventually(lambda: counted(60), what="60 canary requests")
        again = await a.resend(a.sent[-1])
        assert again.duplicate
        await asyncio.sleep(0.5)
        status = await canary(stub, rid)
        assert (status.step, status.canary.requests) == (0, 60)
        assert status.verdict == fleet_pb2.CANARY_VERDICT_HOLD
        # The other instance's report of the same interval start is its own.
        same_start = a.sent[-1].interval_start.ToNanoseconds() / 1e9
        await b.send(endpoints, lambda ep: Seen(requests=60), start_s=same_start)

        async def promoted() -> bool:
            return (await canary(stub, rid)).step == 1

        await assert_eventually(promoted, what="promoted on 120 requests")
        await router.stop()


async def test_a_canary_policy_with_another_strategy_or_hostile_reports_are_refused(
    tmp_path: Path,
) -> None:
    """A canary with --in-place, steps that fall, and reports that cannot be counted are
    INVALID_REQUEST naming the field; nothing is written."""
    async with cluster(tmp_path) as (_fleet, stub, _agents):
        await ready_model(stub)
        bad_changes = [
            fleet_pb2.SetGPUsRequest(name="vmodel", gpus=2, in_place=True, canary=policy()),
            fleet_pb2.SetGPUsRequest(
                name="vmodel", gpus=2, strategy=fleet_pb2.STRATEGY_AUTO, canary=policy()
            ),
        ]
        for request in bad_changes:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.SetGPUs(request)
            assert reason_and_meta(caught.value)[0] == "INVALID_REQUEST"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SetContext(
                fleet_pb2.SetContextRequest(
                    name="vmodel", tokens=4096, canary=policy(steps=[50, 5])
                )
            )
        assert reason_and_meta(caught.value) == ("INVALID_REQUEST", {"field": "canary.steps"})
        assert not (await stub.ListRollouts(fleet_pb2.ListRolloutsRequest())).rollouts
        gateway = ScriptedGateway(stub, "gw-a")
        ep = fleet_pb2.Endpoint(replica_id="r-1", model="vmodel", revision=1)
        hostile = [
            ("", lambda e: Seen(requests=1)),
            ("gw", lambda e: Seen(requests=1, errors_5xx=2)),
            ("gw", lambda e: Seen(requests=-1)),
        ]
        for name, seen in hostile:
            gateway.name = name
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await gateway.send([ep], seen)
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert reason_and_meta(caught.value)[0] == "INVALID_REQUEST"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.PromoteRollout(fleet_pb2.PromoteRolloutRequest(id="ro-nope"))
        assert reason_and_meta(caught.value)[0] == "ROLLOUT_NOT_FOUND"


async def test_only_the_gateway_role_may_report_traffic(tmp_path: Path) -> None:
    """Over mutual TLS with roles: the identity listed under `gateway:` reports (a repeat is
    a duplicate); an admin, an operator, a node and a gateway acting for a person are
    PERMISSION_DENIED ROLE_REQUIRED naming the gateway role; nothing they sent was kept."""
    pki = make_pki(tmp_path / "tls")
    roles = ROLES.replace("admin: [admin]", "admin: [admin, gateway]")
    ep = fleet_pb2.Endpoint(replica_id="r-1", model="vmodel", revision=1)
    async with tls_fleet(tmp_path, pki.fleet, settings=settings(tmp_path, roles)) as fleet:
        async with (
            fleet_stub(fleet.port, pki.user("gateway")) as gw,
            fleet_stub(fleet.port, pki.user("admin")) as admin,
            fleet_stub(fleet.port, pki.user("operator")) as operator,
            fleet_stub(fleet.port, pki.node("a")) as node,
        ):
            one = ScriptedGateway(gw, "gw-a")
            assert not (await one.send([ep], lambda e: Seen(requests=5))).duplicate
            assert (await one.resend(one.sent[-1])).duplicate
            for stub in (admin, operator, node):
                err = await refused(ScriptedGateway(stub, "gw-x").send([ep], lambda e: Seen(5)))
                assert err.code() is grpc.StatusCode.PERMISSION_DENIED
                info = error_info(err)
                assert (info.reason, info.metadata["required_role"]) == (
                    "ROLE_REQUIRED",
                    "gateway",
                )
            acting = gw.ReportTraffic(
                one.sent[-1], metadata=(("x-llmgw-caller", "alice"),), timeout=10
            )
            assert error_info(await refused(acting)).reason == "ROLE_REQUIRED"
        kept = fleet.store.list_traffic("vmodel", 0)
    assert {r.gateway for r in kept} == {"gw-a"} and len(kept) == 1


async def test_kill_9_mid_step_resumes_the_canary_at_its_step(tmp_path: Path) -> None:
    """A fleet process killed with SIGKILL in a canary's second step starts again at that
    step, its window and the figures so far read back from the store; its weights are the
    step's in the new process' WatchReplicas, and more healthy reports take it to
    SUCCEEDED."""
    async with running_planner() as (planner, _p, _c):
        address = f"127.0.0.1:{planner.port}"
        store = str(tmp_path / "fleet.db")
        with fleet_process(store, tmp_path, "fleet-a", planner=address) as first:
            agent = ScriptedAgent(first.address, "node-0", gpus=4)
            agent.start()
            async with grpc.aio.insecure_channel(first.address) as channel:
                stub = fleet_pb2_grpc.FleetServiceStub(channel)
                await ready_model(stub)
                router = Router(stub, "vmodel")
                answer = await stub.SetContext(
                    fleet_pb2.SetContextRequest(
                        name="vmodel", tokens=4096, canary=policy(step_min_requests=60)
                    )
                )
                rid, new = answer.rollout_id, answer.model.revision
                async with reporting(ScriptedGateway(stub, "gw-a"), router, lambda e: Seen(25)):

                    async def second_step() -> bool:
                        return (await canary(stub, rid)).step == 1

                    await assert_eventually(second_step, what="the second step", timeout_s=20)
                # One report inside the second step: 25 of its 40 requests, so it holds.
                await asyncio.sleep(0.3)
                await ScriptedGateway(stub, "gw-b").send(
                    list(router.table.values()), lambda e: Seen(25)
                )

                async def counted() -> bool:
                    return (await canary(stub, rid)).canary.requests == 25

                await assert_eventually(counted, what="25 requests in the second step")
                before = await canary(stub, rid)
                await router.stop()
            first.kill()
            await agent.stop()
        assert before.step == 1 and before.weight_percent == 50
        with fleet_process(store, tmp_path, "fleet-b", planner=address) as second:
            agent.address = second.address
            agent.start()
            async with grpc.aio.insecure_channel(second.address) as channel:
                stub = fleet_pb2_grpc.FleetServiceStub(channel)
                after = await canary(stub, rid)
                assert (after.step, after.step_started_at) == (1, before.step_started_at)
                assert after.canary.requests == before.canary.requests > 0
                router = Router(stub, "vmodel")

                def at_half() -> bool:
                    w = weights_by_revision(router)
                    return len(w) == 2 and w[new] == sum(w.values()) // 2

                await assert_eventually(at_half, what="50 % after the restart", timeout_s=15)
                async with reporting(ScriptedGateway(stub, "gw-a"), router, lambda e: Seen(25)):
                    async for _ in stub.WatchRollout(fleet_pb2.WatchRolloutRequest(id=rid)):
                        pass
                ro = (await stub.GetRollout(fleet_pb2.GetRolloutRequest(id=rid))).rollout
                await router.stop()
            await agent.stop()
    assert ro.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, ro.reason


async def test_the_cli_starts_a_canary_promotes_it_and_watches_it_as_a_table(
    tmp_path: Path,
) -> None:
    """`model context --canary-*` starts a canary; `rollout promote` moves it a step and
    `rollout promote --full` past the rest; `rollout watch` prints its steps as a table
    (a header, a row per step and verdict) and exits 0 once it SUCCEEDED; `rollout abort`
    of an ended rollout changes nothing."""
    async with cluster(tmp_path) as (fleet, stub, _agents):
        await ready_model(stub)
        started = await ctl(
            fleet.port,
            "model",
            "context",
            "vmodel",
            "4096",
            "--canary-steps",
            "10,50,100",
            "--canary-step-s",
            "600",
            "--no-wait",
            "-o",
            "json",
        )
        assert started.code == 0, started.err
        rid = json.loads(started.out)["rollout_id"]

        async def at(step: int) -> bool:
            status = await canary(stub, rid)
            return status.step == step and status.weight_percent > 0

        await assert_eventually(lambda: at(0), what="the first step", timeout_s=20)
        one = await ctl(fleet.port, "rollout", "promote", rid)
        assert one.code == 0, one.err
        await assert_eventually(lambda: at(1), what="promoted a step")
        full = await ctl(fleet.port, "rollout", "promote", rid, "--full")
        assert full.code == 0, full.err
        watched = await ctl(fleet.port, "rollout", "watch", rid)
        assert watched.code == 0, watched.err
        again = await ctl(fleet.port, "rollout", "promote", rid)
        aborted = await ctl(fleet.port, "rollout", "abort", rid)
    lines = watched.out.splitlines()
    assert any(line.startswith("    time   step  new/old %") for line in lines), watched.out
    assert any("10/90" in line for line in lines) and any("50/50" in line for line in lines)
    assert any("promoted to every step by" in line for line in lines)
    assert again.code == 2 and "NOT_CANARY" in again.err
    assert aborted.code == 0
