"""Replicas spanning nodes, end to end: a real fleet, real agents on nodes of their own names
running real stand-in processes, each member started with its engine's multi-node flags. A
2-node vLLM gang and a 2-node SGLang gang serve as one endpoint, a llama.cpp head offloads to
its RPC worker, a beside rollout moves a whole gang, a member's crash fails and replaces the
gang, and a gang with no room beside is refused with what would fit."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager as AsyncContextManager
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import grpc
import httpx
import pytest

from fleet_svc.agent.config import standin_engine
from fleet_svc.agent.host import free_port
from fleet_svc.domain.nodes import Liveness
from fleet_svc.server import FleetServer
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.scripted_agent import ScriptedAgent
from tests.integration.test_rollouts import LLAMA_8B, reason_and_meta, wait_rollout
from tests.support.agents import Agent, fast_config, running_agent
from tests.support.fleet import running_fleet
from tests.support.planner import running_planner

pytestmark = pytest.mark.slow

READY = fleet_pb2.REPLICA_PHASE_READY
H100 = "H100-80GB"


@asynccontextmanager
async def gang_cluster(
    tmp_path: Path, nodes: int, gpus: str = "2xH100-80GB", lost_after_s: float = 10.0
) -> AsyncIterator[tuple[fleet_pb2_grpc.FleetServiceAsyncStub, dict[str, Agent]]]:
    """A planner, a fleet and `nodes` real agents named node-a, node-b, ... (vLLM, SGLang
    and llama.cpp stood in for), all connected."""
    config = fast_config(
        engines={name: standin_engine(name) for name in ("vllm", "sglang", "llamacpp")}
    )
    async with AsyncExitStack() as stack:
        planner, _p, _c = await stack.enter_async_context(running_planner())
        fleet, stub = await stack.enter_async_context(
            running_fleet(
                tmp_path,
                planner=f"127.0.0.1:{planner.port}",
                start_timeout_s=30.0,
                # Agents heartbeat once a second (the Welcome's whole seconds): no flapping.
                liveness=Liveness(interval_s=1.0, grace_heartbeats=3, lost_after_s=lost_after_s),
            )
        )
        agents = {}
        for i in range(nodes):
            name = f"node-{chr(ord('a') + i)}"
            state = tmp_path / name
            state.mkdir()
            agents[name] = await stack.enter_async_context(
                running_agent(fleet.port, state, gpus=gpus, config=config, node=name)
            )

        async def connected() -> bool:
            listed = (await stub.ListNodes(fleet_pb2.ListNodesRequest())).nodes
            return sum(1 for n in listed if n.phase == fleet_pb2.NODE_PHASE_READY) == nodes

        await assert_eventually(connected, timeout_s=30, what="every agent connected")
        yield stub, agents


def gang_model(engine: str, args: Sequence[str], gpus_per_node: int = 2) -> common_pb2.Model:
    """Model `big` with one profile spanning two nodes of `gpus_per_node` H100s."""
    return common_pb2.Model(
        name="big",
        source="hf://org/big",
        context_length=8192,
        shape=LLAMA_8B,
        profiles=[
            common_pb2.Profile(
                name="gang",
                engine=engine,
                args=[*args, "--load-s", "0.3"],
                gpu_class=H100,
                gpus_per_node=gpus_per_node,
                nodes=2,
                replicas=1,
            )
        ],
    )


VLLM_ARGS = ("--max-model-len", "8192", "-tp", "2", "-pp", "2")
SGLANG_ARGS = ("--context-length", "8192", "--tp-size", "4")


async def replicas(stub: fleet_pb2_grpc.FleetServiceAsyncStub) -> list[fleet_pb2.Replica]:
    """The fleet's replicas now."""
    return list((await stub.ListReplicas(fleet_pb2.ListReplicasRequest())).replicas)


async def one_ready_gang(
    stub: fleet_pb2_grpc.FleetServiceAsyncStub, exclude: str = ""
) -> fleet_pb2.Replica:
    """Wait until exactly one replica exists, a READY gang with every member READY (and not
    `exclude`); it."""
    found: list[fleet_pb2.Replica] = []

    async def check() -> bool:
        rs = await replicas(stub)
        found[:] = rs
        return (
            len(rs) == 1
            and rs[0].id != exclude
            and rs[0].phase == READY
            and len(rs[0].members) == 2
            and all(m.phase == READY for m in rs[0].members)
        )

    await assert_eventually(check, timeout_s=60, what="one READY gang of two nodes")
    return found[0]


async def endpoints(stub: fleet_pb2_grpc.FleetServiceAsyncStub) -> list[str]:
    """The addresses WatchReplicas gives the gateway for `big`, up to its snapshot's end."""
    out = []
    async for msg in stub.WatchReplicas(fleet_pb2.WatchReplicasRequest(model="big")):
        if msg.kind == fleet_pb2.WatchReplicasResponse.KIND_SYNCED:
            break
        if msg.kind == fleet_pb2.WatchReplicasResponse.KIND_ADDED:
            out.append(msg.endpoint.address)
    return sorted(out)


@pytest.mark.parametrize(("engine", "args"), [("vllm", VLLM_ARGS), ("sglang", SGLANG_ARGS)])
async def test_a_two_node_gang_serves_as_one_endpoint(
    tmp_path: Path, engine: str, args: Sequence[str]
) -> None:
    """vLLM and SGLang gangs start on two nodes with their ranks; the gateway sees the head."""
    async with gang_cluster(tmp_path, nodes=3) as (stub, _agents):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=gang_model(engine, args)))
        r = await one_ready_gang(stub)
        head, member = r.members
        assert (head.rank, member.rank) == (0, 1)
        assert head.node == r.node and head.node != member.node
        assert head.gang_address and not member.gang_address
        assert await endpoints(stub) == [r.address]
        async with httpx.AsyncClient(trust_env=False) as http:
            answer = await http.get(f"http://{r.address}/v1/models")
        assert answer.status_code == 200
        # Each node's agent ran its own rank with the engine's own flags.
        argv_of = {}
        for name in (head.node, member.node):
            log = (tmp_path / name / "logs" / f"{r.id}.log").read_text()
            argv_of[name] = log
        assert '--node-rank", "0"' in argv_of[head.node]
        assert '--node-rank", "1"' in argv_of[member.node]
        rendezvous = head.gang_address
        if engine == "vllm":
            host, port = rendezvous.rsplit(":", 1)
            assert f'"--master-addr", "{host}", "--master-port", "{port}"' in argv_of[member.node]
            assert "--headless" in argv_of[member.node]
        else:
            assert f'"--dist-init-addr", "{rendezvous}"' in argv_of[member.node]


async def test_a_llamacpp_head_offloads_to_its_rpc_worker(tmp_path: Path) -> None:
    """The worker rank runs rpc-server and is started first; the head gets `--rpc` to it."""
    async with gang_cluster(tmp_path, nodes=2) as (stub, _agents):
        model = gang_model("llamacpp", ("--ctx-size", "4096"), gpus_per_node=1)
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model))
        r = await one_ready_gang(stub)
        head, worker = r.members
        assert worker.gang_address and not head.gang_address
        log = (tmp_path / head.node / "logs" / f"{r.id}.log").read_text()
        assert f'"--rpc", "{worker.gang_address}"' in log
        worker_log = (tmp_path / worker.node / "logs" / f"{r.id}.log").read_text()
        assert "--rpc-server" in worker_log and "Starting RPC server" in worker_log


async def test_a_beside_rollout_starts_a_whole_new_gang_before_the_old_stops(
    tmp_path: Path,
) -> None:
    """With four nodes, the new gang comes up on the two free ones, then the old one goes."""
    async with gang_cluster(tmp_path, nodes=4) as (stub, _agents):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=gang_model("vllm", VLLM_ARGS)))
        old = await one_ready_gang(stub)
        answer = await stub.SetContext(
            fleet_pb2.SetContextRequest(name="big", tokens=4096, strategy=fleet_pb2.STRATEGY_BESIDE)
        )
        ro = await wait_rollout(stub, answer.rollout_id)
        assert ro.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, ro.reason
        new = await one_ready_gang(stub, exclude=old.id)
        assert new.revision == old.revision + 1
        assert {m.node for m in new.members}.isdisjoint({m.node for m in old.members})


async def test_no_room_beside_for_a_gang_is_refused_with_what_would_fit(tmp_path: Path) -> None:
    """Three nodes and a gang on two: beside is refused naming the nodes needed and the one
    with room; in place frees the gang's nodes and starts the new gang there."""
    async with gang_cluster(tmp_path, nodes=3) as (stub, _agents):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=gang_model("vllm", VLLM_ARGS)))
        old = await one_ready_gang(stub)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.SetContext(
                fleet_pb2.SetContextRequest(
                    name="big", tokens=4096, strategy=fleet_pb2.STRATEGY_BESIDE
                )
            )
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        reason, meta = reason_and_meta(err.value)
        assert reason == "NO_ROOM_BESIDE"
        assert (meta["need_nodes"], meta["nodes_with_room"]) == ("2", "1")
        assert "--in-place" in (err.value.details() or "")
        details = err.value.details() or ""
        assert "1 has room (node-c)" in details and "no gang of two or more nodes fits" in details
        assert len(await replicas(stub)) == 1  # nothing written, nothing started
        answer = await stub.SetContext(
            fleet_pb2.SetContextRequest(
                name="big", tokens=4096, strategy=fleet_pb2.STRATEGY_IN_PLACE
            )
        )
        ro = await wait_rollout(stub, answer.rollout_id)
        assert ro.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, ro.reason
        new = await one_ready_gang(stub, exclude=old.id)
        assert new.revision == old.revision + 1


async def test_a_member_crash_fails_the_gang_and_it_is_placed_again(tmp_path: Path) -> None:
    """Killing the non-head member's process fails the gang as a whole (its head is stopped
    too) and a new gang of the same revision serves."""
    async with gang_cluster(tmp_path, nodes=3) as (stub, agents):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=gang_model("vllm", VLLM_ARGS)))
        old = await one_ready_gang(stub)
        member = old.members[1]
        pid = next(
            o.pid for o in agents[member.node].replicas.observed() if o.spec.replica_id == old.id
        )
        os.killpg(pid, signal.SIGKILL)
        new = await one_ready_gang(stub, exclude=old.id)
        assert new.revision == old.revision

        async def old_gone() -> bool:
            return all(
                o.spec.replica_id != old.id or o.phase.value in ("STOPPED", "FAILED")
                for a in agents.values()
                for o in a.replicas.observed()
            )

        await assert_eventually(old_gone, timeout_s=30, what="the old gang's processes gone")


async def test_a_member_node_lost_replaces_the_whole_gang(tmp_path: Path) -> None:
    """The member's agent goes silent: once its node is LOST the gang is replaced whole on
    nodes that are up, and the head's process on the live node is stopped."""
    async with gang_cluster(tmp_path, nodes=3, lost_after_s=4.0) as (stub, agents):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=gang_model("vllm", VLLM_ARGS)))
        old = await one_ready_gang(stub)
        head, member = old.members
        agents[member.node].task.cancel()  # the node's agent stops talking; its engine runs on
        new = await one_ready_gang(stub, exclude=old.id)
        assert member.node not in {m.node for m in new.members}

        async def head_stopped() -> bool:
            return all(
                o.spec.replica_id != old.id or o.phase.value == "STOPPED"
                for o in agents[head.node].replicas.observed()
            )

        await assert_eventually(head_stopped, timeout_s=30, what="the old head stopped")


async def test_a_restarted_fleet_keeps_the_gang_and_its_processes(tmp_path: Path) -> None:
    """The fleet stops and starts again on its store: the same gang is READY with the same
    members, and no member's process was started again."""
    port = free_port("127.0.0.1")
    liveness = Liveness(interval_s=1.0, grace_heartbeats=3, lost_after_s=10.0)
    config = fast_config(engines={"vllm": standin_engine("vllm")})
    async with AsyncExitStack() as stack:
        planner, _p, _c = await stack.enter_async_context(running_planner())

        def fleet() -> AsyncContextManager[
            tuple[FleetServer, fleet_pb2_grpc.FleetServiceAsyncStub]
        ]:
            return running_fleet(
                tmp_path,
                planner=f"127.0.0.1:{planner.port}",
                liveness=liveness,
                listen=f"127.0.0.1:{port}",
            )

        first = await stack.enter_async_context(AsyncExitStack())
        _fleet, stub = await first.enter_async_context(fleet())
        agents = {}
        for name in ("node-a", "node-b"):
            (tmp_path / name).mkdir()
            agents[name] = await stack.enter_async_context(
                running_agent(port, tmp_path / name, config=config, node=name)
            )
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=gang_model("vllm", VLLM_ARGS)))
        before = await one_ready_gang(stub)

        def pids() -> dict[str, int]:
            return {
                name: o.pid
                for name, a in agents.items()
                for o in a.replicas.observed()
                if o.spec.replica_id == before.id
            }

        started = pids()
        await first.aclose()
        _fleet, stub = await stack.enter_async_context(fleet())
        after = await one_ready_gang(stub)
        assert after.id == before.id
        assert [(m.rank, m.node, list(m.gpus)) for m in after.members] == [
            (m.rank, m.node, list(m.gpus)) for m in before.members
        ]
        assert pids() == started and all(started.values())


async def test_each_node_is_told_its_own_member_of_the_gang(tmp_path: Path) -> None:
    """Over the agent stream each member's node gets the replica with its rank, the gang's
    size, its own cards and the peers' addresses; the third node gets nothing."""
    async with (
        running_planner() as (planner, _p, _c),
        running_fleet(tmp_path, planner=f"127.0.0.1:{planner.port}") as (fleet, stub),
    ):
        agents = [ScriptedAgent(f"127.0.0.1:{fleet.port}", f"node-{n}", gpus=2) for n in "abc"]
        for a in agents:
            a.start()
        try:
            await stub.CreateModel(
                fleet_pb2.CreateModelRequest(model=gang_model("sglang", SGLANG_ARGS))
            )
            r = await one_ready_gang(stub)
            told = {
                a.node: s
                for a in agents
                for d in a.desired[-1:]
                for s in d.replicas
                if s.replica_id == r.id
            }
            assert sorted(told) == sorted(m.node for m in r.members)
            for m in r.members:
                spec = told[m.node]
                assert (spec.gang.rank, spec.gang.nnodes) == (m.rank, 2)
                assert list(spec.gpus) == list(m.gpus)
                assert spec.gang.peers[0] == r.members[0].gang_address
        finally:
            for a in agents:
                await a.stop()
