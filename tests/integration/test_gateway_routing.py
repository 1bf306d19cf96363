"""Acceptance: a gateway routing from WatchReplicas alone (llmgw.testing.router) through a
beside rollout, a dropped stream it resumes, a context rollout and an agent crash, against a
real planner, a real fleet and scripted agents. It never holds fewer ready endpoints than
before a rollout started, never one whose replica its agent stopped, and never one the fleet
would not route (a replica not READY, a node not READY) past the events in flight."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from fleet_svc.domain.nodes import Liveness, NodePhase
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.server import FleetServer
from llmgw.agent.v1 import agent_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.router import Router
from llmgw.testing.scripted_agent import ScriptedAgent
from tests.integration.test_rollouts import ready_count, vllm_model, wait_rollout
from tests.support.fleet import running_fleet
from tests.support.planner import running_planner

W = fleet_pb2.WatchReplicasResponse
LIVENESS = Liveness(interval_s=0.2, grace_heartbeats=3, lost_after_s=60.0)
"""NOT_READY after 0.6 s of silence; never LOST within the test (the crashed agent returns)."""


@dataclass
class Checks:
    """What the gateway's table is held to, checked after every event it applies and
    whenever an agent stops a replica."""

    fleet: FleetServer
    agents: dict[str, CheckedAgent] = field(default_factory=dict)
    router: Router | None = None
    floor: int = 0
    """While > 0, the fewest endpoints the table may hold (during a rollout)."""
    low: int = 1 << 30
    violations: list[str] = field(default_factory=list)
    seen: list[set[tuple[int, int]]] = field(default_factory=list)
    """Per event, the (revision, context tokens) pairs the table held."""

    def after_event(self, router: Router, ev: fleet_pb2.WatchReplicasResponse) -> None:
        """The router applied `ev`: check the table against the fleet at that sequence."""
        hub = self.fleet.controller.hub
        state = self.fleet.controller.state
        for rid, r in hub.ready.items():  # the fleet advertises only what it would route
            replica = state.replicas.get(rid)
            node = state.nodes.get(r.node)
            if replica is None or replica.phase is not ReplicaPhase.READY:
                self.violations.append(f"fleet advertises {rid} not READY")
            if node is None or node.phase is not NodePhase.READY:
                self.violations.append(f"fleet advertises {rid} on a node not READY")
        in_flight = {e.endpoint.replica_id for e in hub.since(router.seq) if e.endpoint}
        for rid in router.table:
            if rid not in hub.ready and rid not in in_flight:
                self.violations.append(f"table holds {rid}, removed before seq {router.seq}")
        if router.synced.is_set():
            self.seen.append({(e.revision, e.context_tokens) for e in router.table.values()})
            if self.floor:
                self.low = min(self.low, len(router.table))

    def stopped(self, node: str, replica_ids: set[str]) -> None:
        """An agent stopped these replicas: the gateway must not be routing to them."""
        if self.router is not None:
            for rid in replica_ids & set(self.router.table):
                self.violations.append(f"{rid} stopped on {node} while routed to")


class CheckedAgent(ScriptedAgent):
    """A scripted agent that tells the checks which replicas it stops, as it stops them."""

    checks: Checks | None = None

    def _apply(self, desired: agent_pb2.Desired) -> None:
        before = set(self.running)
        super()._apply(desired)
        if self.checks is not None:
            self.checks.stopped(self.node, before - set(self.running))


@asynccontextmanager
async def gateway(
    tmp_path: Path,
) -> AsyncIterator[tuple[fleet_pb2_grpc.FleetServiceAsyncStub, Checks]]:
    """A planner, a fleet, two agents of four H100s each."""
    async with (
        running_planner() as (planner, _p, _c),
        running_fleet(
            tmp_path,
            planner=f"127.0.0.1:{planner.port}",
            start_timeout_s=20.0,
            liveness=LIVENESS,
        ) as (fleet, stub),
    ):
        checks = Checks(fleet)
        for i in range(2):
            agent = CheckedAgent(f"127.0.0.1:{fleet.port}", f"node-{i}", gpus=4, heartbeat_s=0.1)
            agent.checks = checks
            checks.agents[agent.node] = agent
            agent.start()
        try:
            yield stub, checks
        finally:
            if checks.router is not None:
                await checks.router.stop()
            for agent in checks.agents.values():
                await agent.stop()


async def rollout(
    checks: Checks, stub: fleet_pb2_grpc.FleetServiceAsyncStub, rollout_id: str
) -> fleet_pb2.Rollout:
    """Follow a rollout with the count floor held; it must succeed beside."""
    assert rollout_id
    ro = await wait_rollout(stub, rollout_id)
    assert ro.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, ro.reason
    assert {s.mode for s in ro.steps} == {fleet_pb2.ROLLOUT_MODE_BESIDE}
    return ro


async def test_gateway_routes_through_rollouts_a_dropped_stream_and_an_agent_crash(
    tmp_path: Path,
) -> None:
    """Routing from WatchReplicas alone: the table never shrinks below its size before each
    rollout, never holds a replica its agent stopped or one the fleet stopped routing, tells
    revisions apart by their context during the context rollout, resumes after a dropped
    stream, loses a crashed agent's endpoints and gets them back when it returns."""
    async with gateway(tmp_path) as (stub, checks):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=vllm_model(2)))
        await assert_eventually(lambda: _eq(ready_count(stub), 2), what="2 READY")
        router = Router(stub, "vmodel", on_change=checks.after_event)
        checks.router = router
        await asyncio.wait_for(router.synced.wait(), 10)
        baseline = len(router.table)
        assert baseline == 2

        # A beside rollout: two cards a replica.
        checks.floor = baseline
        answer = await stub.SetGPUs(fleet_pb2.SetGPUsRequest(name="vmodel", gpus=2))
        await rollout(checks, stub, answer.rollout_id)
        await assert_eventually(
            lambda: all(e.cards == 2 for e in router.table.values()) and len(router.table) == 2,
            what="the table on two-card replicas",
        )
        checks.floor = 0

        # The stream drops (a proxy restarts): the router resumes from its last sequence.
        router.drop()
        await assert_eventually(lambda: router.resumed >= 1, what="resumed")
        assert router.streams == 2 and len(router.table) == baseline

        # A context rollout: old and new revisions side by side, told apart by context.
        checks.floor = baseline
        checks.seen.clear()
        old_revision = next(iter(router.table.values())).revision
        changed = await stub.SetContext(fleet_pb2.SetContextRequest(name="vmodel", tokens=16384))
        ro = await rollout(checks, stub, changed.rollout_id)
        await assert_eventually(
            lambda: (
                {(e.revision, e.context_tokens) for e in router.table.values()}
                == {(ro.to_revision, 16384)}
            ),
            what="every endpoint on the new context",
        )
        checks.floor = 0
        both = {(old_revision, 8192), (ro.to_revision, 16384)}
        assert any(both <= pairs for pairs in checks.seen), "both contexts routable at once"
        assert all(
            pairs <= {(old_revision, 8192), (ro.to_revision, 16384)} for pairs in checks.seen
        ), "each endpoint's context is its revision's"
        assert checks.low >= baseline, f"the table fell to {checks.low} during a rollout"

        # An agent crashes (its stream drops; its engines keep running): its node is
        # NOT_READY and its endpoints leave; it comes back and so do they.
        node = next(iter(router.table.values())).node
        crashed = checks.agents[node]
        ids_there = {rid for rid, e in router.table.items() if e.node == node}
        await crashed.stop()
        await assert_eventually(
            lambda: not any(e.node == node for e in router.table.values()),
            what="the crashed agent's endpoints out",
        )
        crashed.start()
        await assert_eventually(
            lambda: (
                {rid for rid, e in router.table.items() if e.node == node} == ids_there
                and len(router.table) == baseline
            ),
            what="its endpoints back",
        )
        assert checks.violations == []


async def _eq(value: Awaitable[int], want: int) -> bool:
    return await value == want
