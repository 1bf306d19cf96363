"""The fleet runs replicas through agents: placement, readiness, reconnects, lost nodes,
restarts of the fleet, and the endpoint stream."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from pathlib import Path

import grpc

from llmgw.agent.v1 import agent_pb2
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.scripted_agent import ScriptedAgent
from tests.support.fleet import running_fleet

READY = fleet_pb2.REPLICA_PHASE_READY


def model(name: str = "qwen", replicas: int = 2, gpus: int = 1) -> common_pb2.Model:
    """A model with one vLLM profile of `gpus` H100s per replica."""
    return common_pb2.Model(
        name=name,
        source="hf://Qwen/Qwen3-8B",
        profiles=[
            common_pb2.Profile(
                name="gpu",
                engine="vllm",
                args=["-tp", str(gpus)],
                gpu_class="H100-80GB",
                gpus_per_node=gpus,
                replicas=replicas,
            )
        ],
    )


async def replicas(
    stub: fleet_pb2_grpc.FleetServiceAsyncStub, name: str = ""
) -> list[fleet_pb2.Replica]:
    """The fleet's replicas now."""
    return list((await stub.ListReplicas(fleet_pb2.ListReplicasRequest(model=name))).replicas)


async def all_ready(stub: fleet_pb2_grpc.FleetServiceAsyncStub, count: int) -> bool:
    """Whether exactly `count` replicas exist and all are READY."""
    rs = await replicas(stub)
    return len(rs) == count and all(r.phase == READY for r in rs)


async def test_replicas_are_placed_and_become_ready(tmp_path: Path) -> None:
    """Two wanted replicas go on free cards of the node and turn READY with addresses."""
    async with running_fleet(tmp_path) as (fleet, stub):
        agent = ScriptedAgent(f"127.0.0.1:{fleet.port}", "node-a", gpus=4)
        agent.start()
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model(replicas=2, gpus=2)))
        await assert_eventually(lambda: all_ready(stub, 2), what="two READY replicas")
        rs = await replicas(stub)
        assert {r.node for r in rs} == {"node-a"}
        assert sorted(g for r in rs for g in r.gpus) == [0, 1, 2, 3]
        assert all(r.address.startswith("127.0.0.1:") for r in rs)
        nodes = (await stub.ListNodes(fleet_pb2.ListNodesRequest())).nodes
        assert [(n.name, n.phase, n.free_gpus) for n in nodes] == [
            ("node-a", fleet_pb2.NODE_PHASE_READY, 0)
        ]
        await agent.stop()


async def test_pending_replica_says_why(tmp_path: Path) -> None:
    """A replica no node has room for stays PENDING with a reason naming the free cards."""
    async with running_fleet(tmp_path) as (fleet, stub):
        agent = ScriptedAgent(f"127.0.0.1:{fleet.port}", "node-a", gpus=2)
        agent.start()
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model(replicas=2, gpus=2)))

        async def one_pending() -> bool:
            rs = await replicas(stub)
            pending = [r for r in rs if r.phase == fleet_pb2.REPLICA_PHASE_PENDING]
            return len(rs) == 2 and len(pending) == 1 and "node-a: 0 free" in pending[0].reason

        await assert_eventually(one_pending, what="one replica pending with a reason")
        await agent.stop()


async def test_agent_restart_reconciles_without_starting_twice(tmp_path: Path) -> None:
    """An agent that reconnects with its replicas running gets the same set: nothing new starts."""
    async with running_fleet(tmp_path) as (fleet, stub):
        agent = ScriptedAgent(f"127.0.0.1:{fleet.port}", "node-a", gpus=4)
        agent.start()
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model(replicas=2)))
        await assert_eventually(lambda: all_ready(stub, 2), what="two READY replicas")
        before = {r.id for r in await replicas(stub)}
        await agent.stop()
        agent.desired.clear()
        agent.start()
        await assert_eventually(lambda: bool(agent.desired), what="a desired set after reconnect")
        await assert_eventually(lambda: all_ready(stub, 2), what="still two READY replicas")
        assert {r.id for r in await replicas(stub)} == before
        assert {s.replica_id for s in agent.desired[-1].replicas} == before
        await agent.stop()


async def test_unknown_replicas_on_a_node_are_stopped(tmp_path: Path) -> None:
    """A replica an agent runs that the fleet never placed is left out of its desired set."""
    async with running_fleet(tmp_path) as (fleet, _stub):
        agent = ScriptedAgent(f"127.0.0.1:{fleet.port}", "node-a", gpus=4)
        agent.running["stray"] = agent_pb2.ReplicaSpec(replica_id="stray", revision=7, gpus=[3])
        agent.start()
        await assert_eventually(lambda: bool(agent.desired), what="a desired set")
        assert "stray" not in agent.running
        await agent.stop()


async def test_silent_node_goes_not_ready_then_lost_and_replicas_move(tmp_path: Path) -> None:
    """A node whose heartbeats stop is NOT_READY, then LOST; its replica is placed elsewhere."""
    async with running_fleet(tmp_path) as (fleet, stub):
        address = f"127.0.0.1:{fleet.port}"
        quiet = ScriptedAgent(address, "node-a", gpus=1, heartbeat_s=0)
        quiet.start()
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model(replicas=1)))
        await assert_eventually(lambda: all_ready(stub, 1), what="a READY replica")
        first = (await replicas(stub))[0]
        assert first.node == "node-a"

        async def phase_of(name: str) -> int:
            nodes = (await stub.ListNodes(fleet_pb2.ListNodesRequest())).nodes
            return next((n.phase for n in nodes if n.name == name), 0)

        await assert_eventually(
            lambda: _eq(phase_of("node-a"), fleet_pb2.NODE_PHASE_NOT_READY), what="NOT_READY"
        )
        spare = ScriptedAgent(address, "node-b", gpus=1)
        spare.start()
        await assert_eventually(
            lambda: _eq(phase_of("node-a"), fleet_pb2.NODE_PHASE_LOST), what="LOST"
        )

        async def moved() -> bool:
            rs = await replicas(stub)
            return len(rs) == 1 and rs[0].node == "node-b" and rs[0].phase == READY

        await assert_eventually(moved, what="the replica placed again on node-b")
        assert (await replicas(stub))[0].id != first.id
        await quiet.stop()
        await spare.stop()


async def _eq(value: Awaitable[int], want: int) -> bool:
    """Whether an awaited value equals `want`."""
    return await value == want


async def test_rejected_replica_is_failed_with_the_agents_reason(tmp_path: Path) -> None:
    """A replica the agent refuses turns FAILED with the agent's reason, and is retried a
    bounded number of times."""
    async with running_fleet(tmp_path) as (fleet, stub):
        agent = ScriptedAgent(
            f"127.0.0.1:{fleet.port}", "node-a", gpus=4, reject=lambda spec: "ENGINE_NOT_ALLOWED"
        )
        agent.start()
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model(replicas=1)))

        async def gave_up() -> bool:
            rs = await replicas(stub)
            return (
                len(rs) == 1
                and rs[0].phase == fleet_pb2.REPLICA_PHASE_FAILED
                and rs[0].reason.startswith("gave up after 3 attempts")
            )

        await assert_eventually(gave_up, what="a FAILED replica after bounded retries")
        assert "ENGINE_NOT_ALLOWED" in (await replicas(stub))[0].reason
        started = {s.replica_id for d in agent.desired for s in d.replicas}
        assert len(started) == 3
        await agent.stop()


async def test_second_connection_replaces_the_first(tmp_path: Path) -> None:
    """A second agent stream for the same node replaces the first, which is closed ABORTED."""
    async with running_fleet(tmp_path) as (fleet, _stub):
        address = f"127.0.0.1:{fleet.port}"
        one = ScriptedAgent(address, "node-a")
        one.start()
        await assert_eventually(lambda: "node-a" in fleet.controller.state.links, what="connected")
        two = ScriptedAgent(address, "node-a")
        two.start()
        await asyncio.wait_for(one.closed.wait(), 5)
        assert one.close_code is grpc.StatusCode.ABORTED
        await assert_eventually(lambda: two.acked.is_set(), what="the second agent served")
        await two.stop()


async def test_fleet_restart_keeps_catalog_and_replicas(tmp_path: Path) -> None:
    """A fleet stopped and started on the same store keeps its models and replica ids, and
    routes to them again only once their agent reports them healthy."""
    async with running_fleet(tmp_path) as (fleet, stub):
        agent = ScriptedAgent(f"127.0.0.1:{fleet.port}", "node-a", gpus=4)
        agent.start()
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model(replicas=2)))
        await assert_eventually(lambda: all_ready(stub, 2), what="two READY replicas")
        ids = {r.id for r in await replicas(stub)}
        await agent.stop()
    async with running_fleet(tmp_path) as (fleet, stub):
        assert [
            m.model.name for m in (await stub.ListModels(fleet_pb2.ListModelsRequest())).models
        ] == ["qwen"]
        assert {r.id for r in await replicas(stub)} == ids
        assert fleet.controller.hub.ready == {}, "not routable until its agent reports it"
        agent.address = f"127.0.0.1:{fleet.port}"
        agent.desired.clear()
        agent.start()
        await assert_eventually(lambda: all_ready(stub, 2), what="READY again from the agent")
        assert {r.id for r in await replicas(stub)} == ids
        await assert_eventually(
            lambda: set(fleet.controller.hub.ready) == ids, what="routable again"
        )
        await agent.stop()


async def test_watch_sends_ready_endpoints_and_removes_before_stopping(tmp_path: Path) -> None:
    """WatchReplicas: snapshot, SYNCED, ADDED when ready; on delete REMOVED (reason DELETED)
    comes before the agent is told to stop the replica."""
    async with running_fleet(tmp_path, drain_s=0.5) as (fleet, stub):
        agent = ScriptedAgent(f"127.0.0.1:{fleet.port}", "node-a", gpus=4)
        agent.start()
        events: list[tuple[int, str, int]] = []
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model(replicas=0)))
        stream = stub.WatchReplicas(fleet_pb2.WatchReplicasRequest(model="qwen"))

        async def read() -> None:
            async for ev in stream:
                events.append((ev.kind, ev.endpoint.replica_id, ev.reason))

        reader = asyncio.create_task(read())
        await assert_eventually(lambda: bool(events), what="SYNCED")
        current = await stub.GetModel(fleet_pb2.GetModelRequest(name="qwen"))
        await stub.UpdateModel(
            fleet_pb2.UpdateModelRequest(model=model(replicas=1), etag=current.model.etag)
        )
        added = fleet_pb2.WatchReplicasResponse.KIND_ADDED
        removed = fleet_pb2.WatchReplicasResponse.KIND_REMOVED
        await assert_eventually(lambda: any(k == added for k, _, _ in events), what="ADDED")
        assert events[0][0] == fleet_pb2.WatchReplicasResponse.KIND_SYNCED
        rid = next(r for k, r, _ in events if k == added)
        await stub.DeleteModel(fleet_pb2.DeleteModelRequest(name="qwen"))
        deleted = fleet_pb2.ENDPOINT_REASON_DELETED
        await assert_eventually(lambda: (removed, rid, deleted) in events, what="REMOVED")
        assert rid in agent.running, "removed from routing while still running (draining)"
        await assert_eventually(lambda: rid not in agent.running, what="stopped after the drain")
        reader.cancel()
        await agent.stop()
