"""Two fleets on one PostgreSQL database: one leads, the other answers reads and watches from
the store, serves agents' streams through it, and refuses changes with NOT_LEADER naming the
leader; clients given both addresses find the leader; a clean stop hands leadership over within
a renewal, and no agent's stream moves for it."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import grpc
import psycopg
import pytest

from fleet_svc.duties import FOLLOW_S
from fleet_svc.server import FleetOptions, FleetServer, start_fleet
from llmgw.clients.fleet import FleetClient
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.scripted_agent import ScriptedAgent
from tests.integration.test_cli_ctl import _env, write_model
from tests.integration.test_rollouts import reason_and_meta, vllm_model
from tests.support.agents import running_agent
from tests.support.fleet import FAST
from tests.support.planner import running_planner
from tests.support.postgres import fresh_database

LEASE_S, RENEW_S = 1.5, 0.3
"""A short lease for tests: a clean stop is taken over within a renewal."""


def small_model(replicas: int = 0) -> common_pb2.Model:
    """A catalog model of one vLLM card a replica."""
    return common_pb2.Model(
        name="m",
        source="hf://org/m",
        profiles=[
            common_pb2.Profile(
                name="p",
                engine="vllm",
                gpu_class="H100-80GB",
                gpus_per_node=1,
                replicas=replicas,
            )
        ],
    )


async def start(dsn: str, planner: str = "127.0.0.1:1", follow_s: float = FOLLOW_S) -> FleetServer:
    """A fleet in this process on the database, with the short lease (and, following, its
    digest checked every `follow_s` besides the notifications)."""
    return await start_fleet(
        FleetOptions(
            listen="127.0.0.1:0",
            store_url=dsn,
            tick_s=0.05,
            planner=planner,
            liveness=FAST,
            drain_s=0.1,
            lease_s=LEASE_S,
            renew_s=RENEW_S,
            follow_s=follow_s,
        )
    )


@asynccontextmanager
async def two_fleets(
    planner: str = "127.0.0.1:1", follow_s: float = FOLLOW_S
) -> AsyncIterator[tuple[FleetServer, FleetServer, AsyncExitStack]]:
    """Two fleets on a fresh database: (the leader, the follower), and the stack that stops
    them (a test may stop one itself: a second stop does nothing harmful)."""
    with fresh_database() as (_name, dsn):
        async with AsyncExitStack() as stack:
            first = await start(dsn, planner, follow_s)
            stack.push_async_callback(first.stop, 0.2)
            second = await start(dsn, planner, follow_s)
            stack.push_async_callback(second.stop, 0.2)
            assert (first.is_leader, second.is_leader) == (True, False)
            yield first, second, stack


def stub_of(fleet: FleetServer, stack: AsyncExitStack) -> fleet_pb2_grpc.FleetServiceAsyncStub:
    """An asyncio stub on a plaintext channel to the fleet (closed with the stack)."""
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{fleet.port}")
    stack.push_async_callback(channel.close)
    return fleet_pb2_grpc.FleetServiceStub(channel)


async def test_the_follower_refuses_changes_naming_the_leader_and_serves_reads() -> None:
    """A change sent to the follower is refused UNAVAILABLE with NOT_LEADER and the leader's
    address, and writes nothing; ListNodes is refused the same way; the model the leader
    created is listed and read on the follower."""
    async with two_fleets() as (leader, follower, stack):
        on_leader, on_follower = stub_of(leader, stack), stub_of(follower, stack)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await on_follower.CreateModel(fleet_pb2.CreateModelRequest(model=small_model()))
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        reason, meta = reason_and_meta(refused.value)
        assert reason == "NOT_LEADER"
        assert meta["leader_address"] == f"127.0.0.1:{leader.port}"
        assert (await on_leader.ListModels(fleet_pb2.ListModelsRequest())).models == []
        with pytest.raises(grpc.aio.AioRpcError) as nodes:
            await on_follower.ListNodes(fleet_pb2.ListNodesRequest())
        assert reason_and_meta(nodes.value)[0] == "NOT_LEADER"
        await on_leader.CreateModel(fleet_pb2.CreateModelRequest(model=small_model()))
        got = await on_follower.GetModel(fleet_pb2.GetModelRequest(name="m"))
        assert got.model.revision == 1
        listed = await on_follower.ListModels(fleet_pb2.ListModelsRequest())
        assert [m.model.name for m in listed.models] == ["m"]


async def test_a_client_given_both_addresses_finds_the_leader() -> None:
    """FleetClient given a dead address, the follower and the leader creates a model (passing
    over the dead one, sent on to the leader NOT_LEADER names) and keeps calling the leader."""
    async with two_fleets() as (leader, follower, _stack):
        both = f"127.0.0.1:1,127.0.0.1:{follower.port},127.0.0.1:{leader.port}"

        def create() -> tuple[int, str]:
            with FleetClient(both) as client:
                answer = client.create_model(small_model())
                client.get_model("m")
                return answer.model.revision, client.address

        revision, address = await asyncio.to_thread(create)
        assert (revision, address) == (1, f"127.0.0.1:{leader.port}")


async def test_an_agent_on_the_follower_runs_what_the_leader_places_and_watches_see_it() -> None:
    """An agent whose stream the follower holds is served: the leader reads its node from the
    store and places the model's replica there, the follower forwards the desired set, the
    agent runs it, and the follower's WatchReplicas and ListReplicas show it READY; a delete on
    the leader stops it on the agent, through the store again."""
    async with two_fleets() as (leader, follower, stack):
        on_leader, on_follower = stub_of(leader, stack), stub_of(follower, stack)
        # The model first (a watch of a model the catalog lacks is NOT_FOUND), with no agent
        # yet: nothing is ready when the follower's watch opens.
        await on_leader.CreateModel(fleet_pb2.CreateModelRequest(model=small_model(replicas=1)))
        watch = on_follower.WatchReplicas(fleet_pb2.WatchReplicasRequest(model="m"))
        stack.callback(watch.cancel)
        first = await watch.read()
        assert isinstance(first, fleet_pb2.WatchReplicasResponse)
        assert first.kind == fleet_pb2.WatchReplicasResponse.KIND_SYNCED  # nothing ready yet
        agent = ScriptedAgent(f"127.0.0.1:{follower.port}", "node-0")
        agent.start()
        stack.push_async_callback(agent.stop)
        added = await asyncio.wait_for(watch.read(), 10)
        assert isinstance(added, fleet_pb2.WatchReplicasResponse)
        while added.kind == fleet_pb2.WatchReplicasResponse.KIND_HEARTBEAT:
            added = await asyncio.wait_for(watch.read(), 10)
            assert isinstance(added, fleet_pb2.WatchReplicasResponse)
        assert added.kind == fleet_pb2.WatchReplicasResponse.KIND_ADDED
        assert added.endpoint.model == "m"
        assert agent.running and not agent.close_code, "the stream stays on the follower"
        listed = await on_follower.ListReplicas(fleet_pb2.ListReplicasRequest(model="m"))
        assert [r.phase for r in listed.replicas] == [fleet_pb2.REPLICA_PHASE_READY]
        assert "node-0" not in follower.controller.state.links
        view = leader.controller.state.nodes["node-0"]
        assert view.connected and view.phase.value == "READY"
        await on_leader.DeleteModel(fleet_pb2.DeleteModelRequest(name="m"))
        await assert_eventually(lambda: not agent.running, what="the replica stopped")


async def test_a_clean_stop_hands_over_and_the_new_leader_takes_the_state_and_the_agent() -> None:
    """The leader stops (releasing its lease): the follower leads within a couple of renewals
    at the next epoch, lists the replica its predecessor stored, accepts changes, and an
    agent moved over to it is told the same replica."""
    async with two_fleets() as (leader, follower, stack):
        on_follower = stub_of(follower, stack)
        agent = ScriptedAgent(f"127.0.0.1:{leader.port}", "node-0")
        agent.start()
        stack.push_async_callback(agent.stop)
        await stub_of(leader, stack).CreateModel(
            fleet_pb2.CreateModelRequest(model=small_model(replicas=1))
        )
        await assert_eventually(lambda: agent.running, what="the replica on the agent")
        before = set(agent.running)
        epoch = leader.epoch
        await leader.stop(0.2)
        await assert_eventually(lambda: follower.is_leader, timeout_s=5, what="the new leader")
        assert follower.epoch == epoch + 1
        await agent.stop()
        agent.address = f"127.0.0.1:{follower.port}"
        agent.start()

        async def settled() -> bool:
            rs = (await on_follower.ListReplicas(fleet_pb2.ListReplicasRequest())).replicas
            return [(r.id, r.phase) for r in rs] == [
                (rid, fleet_pb2.REPLICA_PHASE_READY) for rid in before
            ]

        await assert_eventually(settled, what="the one replica READY on the new leader")
        assert set(agent.running) == before, "no replica replaced or doubled by the handover"
        await on_follower.DeleteModel(fleet_pb2.DeleteModelRequest(name="m"))
        await assert_eventually(lambda: not agent.running, what="the replica stopped")


async def test_a_real_agent_given_both_fleets_stays_on_the_first_through_a_handover(
    tmp_path: Path,
) -> None:
    """The agent's stream client given `follower,leader` holds its stream on the follower
    (every fleet serves agents), the leader hears its node through the store; when the leader
    stops, the follower leads and hears the same stream directly: it never reconnected."""
    async with two_fleets() as (leader, follower, _stack):
        both = f"127.0.0.1:{follower.port},127.0.0.1:{leader.port}"
        async with running_agent(0, tmp_path, fleet=both) as agent:
            await assert_eventually(lambda: "node-1" in leader.controller.state.links)
            assert agent.client.fleet == f"127.0.0.1:{follower.port}"
            assert "node-1" not in follower.controller.state.links
            await leader.stop(0.2)
            await assert_eventually(lambda: follower.is_leader, timeout_s=5)
            await assert_eventually(lambda: "node-1" in follower.controller.state.links)
            assert agent.client.fleet == f"127.0.0.1:{follower.port}"


async def test_a_rollout_watched_on_the_follower_streams_every_event_to_its_end() -> None:
    """A SetContext rollout made on the leader, watched on the follower from the start: the
    follower's stream carries the same events as the leader's, in order, and ends with the
    rollout's success."""
    async with (
        running_planner() as (planner, _p, _c),
        two_fleets(f"127.0.0.1:{planner.port}") as (leader, follower, stack),
    ):
        on_leader, on_follower = stub_of(leader, stack), stub_of(follower, stack)
        agent = ScriptedAgent(f"127.0.0.1:{leader.port}", "node-0", gpus=4)
        agent.start()
        stack.push_async_callback(agent.stop)
        await on_leader.CreateModel(fleet_pb2.CreateModelRequest(model=vllm_model(2)))

        async def two_ready() -> bool:
            rs = (await on_leader.ListReplicas(fleet_pb2.ListReplicasRequest())).replicas
            return sum(r.phase == fleet_pb2.REPLICA_PHASE_READY for r in rs) == 2

        await assert_eventually(two_ready, what="two READY replicas")
        answer = await on_leader.SetContext(
            fleet_pb2.SetContextRequest(name="vmodel", tokens=16384)
        )
        watched = [
            (e.seq, e.kind, e.state)
            async for e in on_follower.WatchRollout(
                fleet_pb2.WatchRolloutRequest(id=answer.rollout_id)
            )
        ]
        assert watched[-1][2] == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, watched
        on_the_leader = [
            (e.seq, e.kind, e.state)
            async for e in on_leader.WatchRollout(
                fleet_pb2.WatchRolloutRequest(id=answer.rollout_id)
            )
        ]
        assert watched == on_the_leader
        got = await on_follower.GetRollout(fleet_pb2.GetRolloutRequest(id=answer.rollout_id))
        assert got.rollout.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED


async def test_llmgw_ctl_given_every_fleet_in_llmgw_fleet_changes_the_catalog(
    tmp_path: Path,
) -> None:
    """`llmgw ctl model create` with LLMGW_FLEET naming the follower first creates the model
    (at the leader), and `model list` through the same list shows it."""
    async with two_fleets() as (leader, follower, _stack):
        env = _env(LLMGW_FLEET=f"127.0.0.1:{follower.port},127.0.0.1:{leader.port}")

        async def llmgw_ctl(*args: str) -> tuple[int, str, str]:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "llmgw.cli.main",
                "ctl",
                *args,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
            )
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            return int(proc.returncode or 0), out.decode(), err.decode()

        code, out, err = await llmgw_ctl("model", "create", str(write_model(tmp_path / "m.yaml")))
        assert code == 0, err
        assert "created model qwen (revision 1)" in out
        code, out, err = await llmgw_ctl("model", "list")
        assert code == 0, err
        assert out.splitlines()[1].split()[0] == "qwen"


async def test_a_leader_that_loses_its_lease_keeps_its_agents_streams_through_the_store(
    tmp_path: Path,
) -> None:
    """The lease is taken from a running leader (as after a pause past it): the follower
    leads at the next epoch, the old leader is deposed and keeps its agents' streams, now
    writing their nodes to the store: the new leader hears both nodes READY, and a model
    created on it runs on the agents the old leader still holds."""
    async with two_fleets() as (leader, follower, stack):
        both = f"127.0.0.1:{leader.port},127.0.0.1:{follower.port}"
        scripted = ScriptedAgent(f"127.0.0.1:{leader.port}", "node-9")
        scripted.start()
        stack.push_async_callback(scripted.stop)
        async with running_agent(0, tmp_path, fleet=both) as agent:
            await assert_eventually(lambda: "node-1" in leader.controller.state.links)
            await assert_eventually(lambda: "node-9" in leader.controller.state.links)
            epoch = leader.epoch
            taker = follower.duties.leadership
            assert taker is not None
            with psycopg.connect(leader.store.where, autocommit=True) as conn:
                # What the follower's own attempt does once the lease ran out: take it, at
                # the next epoch (done here so the old leader cannot renew first).
                conn.execute(
                    "UPDATE leases SET holder = %s, address = %s, epoch = epoch + 1,"
                    " expires_at = clock_timestamp() + interval '5 seconds'",
                    (taker.holder, taker.address),
                )
            await assert_eventually(lambda: follower.is_leader, timeout_s=5, what="a takeover")
            assert follower.epoch == epoch + 1
            await assert_eventually(lambda: not leader.is_leader, timeout_s=5)

            def both_ready() -> bool:
                nodes = follower.controller.state.nodes
                return all(
                    n in nodes and nodes[n].connected and nodes[n].phase.value == "READY"
                    for n in ("node-1", "node-9")
                )

            await assert_eventually(both_ready, timeout_s=30, what="both nodes on the new leader")
            assert scripted.close_code is None, "no stream ended"
            assert agent.client.fleet == f"127.0.0.1:{leader.port}"
            on_new = stub_of(follower, stack)
            await on_new.CreateModel(fleet_pb2.CreateModelRequest(model=small_model(replicas=2)))

            async def two_ready() -> bool:
                rs = (await on_new.ListReplicas(fleet_pb2.ListReplicasRequest())).replicas
                return len(rs) == 2 and all(r.phase == fleet_pb2.REPLICA_PHASE_READY for r in rs)

            # Both nodes' streams are on the old leader: READY replicas ran there. (A desired
            # set the new leader wrote before the old one began forwarding is sent again after
            # RESEND_S unacknowledged: up to 5 s more.)
            await assert_eventually(two_ready, timeout_s=30, what="two READY replicas")


async def test_a_follower_learns_of_the_leaders_writes_from_the_store_s_notifications() -> None:
    """With its digest checked only once a minute, a follower still sees at once what the
    leader writes: its WatchReplicas adds the replica the leader made READY and its
    ListReplicas lists it, woken by PostgreSQL's notifications."""
    async with two_fleets(follow_s=60.0) as (leader, follower, stack):
        on_leader, on_follower = stub_of(leader, stack), stub_of(follower, stack)
        await on_leader.CreateModel(fleet_pb2.CreateModelRequest(model=small_model(replicas=1)))
        watch = on_follower.WatchReplicas(fleet_pb2.WatchReplicasRequest(model="m"))
        stack.callback(watch.cancel)
        first = await watch.read()
        assert isinstance(first, fleet_pb2.WatchReplicasResponse)
        assert first.kind == fleet_pb2.WatchReplicasResponse.KIND_SYNCED
        agent = ScriptedAgent(f"127.0.0.1:{leader.port}", "node-0")
        agent.start()
        stack.push_async_callback(agent.stop)

        async def next_change() -> fleet_pb2.WatchReplicasResponse:
            while True:
                ev = await watch.read()
                assert isinstance(ev, fleet_pb2.WatchReplicasResponse)
                if ev.kind != fleet_pb2.WatchReplicasResponse.KIND_HEARTBEAT:
                    return ev

        # Well inside the minute the digest would take: only a notification can wake it.
        added = await asyncio.wait_for(next_change(), 20)
        assert added.kind == fleet_pb2.WatchReplicasResponse.KIND_ADDED
        listed = await on_follower.ListReplicas(fleet_pb2.ListReplicasRequest(model="m"))
        assert [r.phase for r in listed.replicas] == [fleet_pb2.REPLICA_PHASE_READY]
