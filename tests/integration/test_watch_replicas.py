"""WatchReplicas as a gateway reads it, against a real fleet and scripted agents: what an
endpoint carries, why one leaves, a NOT_READY node's endpoints leaving and coming back, a
crash restart's upsert, resuming after a reconnect, and an unknown model refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from fleet_svc.domain.nodes import Liveness
from llmgw.agent.v1 import agent_pb2
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.scripted_agent import ScriptedAgent
from tests.support.fleet import running_fleet

W = fleet_pb2.WatchReplicasResponse
SLOW_LOSS = Liveness(interval_s=0.2, grace_heartbeats=3, lost_after_s=60.0)
"""NOT_READY after 0.6 s of silence, and not LOST within a test."""


def llama(replicas: int = 1) -> common_pb2.Model:
    """A llama.cpp model: 16384 tokens shared by 4 slots on one card a replica."""
    return common_pb2.Model(
        name="llama",
        source="/models/llama.gguf",
        context_length=8192,
        max_output=2048,
        profiles=[
            common_pb2.Profile(
                name="gguf",
                engine="llamacpp",
                args=["-c", "16384", "-np", "4", "-ngl", "99"],
                gpu_class="H100-80GB",
                gpus_per_node=1,
                replicas=replicas,
            )
        ],
    )


class Reader:
    """Reads a WatchReplicas stream into a list in the background."""

    def __init__(self, stub: fleet_pb2_grpc.FleetServiceAsyncStub, **request: object) -> None:
        self.events: list[fleet_pb2.WatchReplicasResponse] = []
        self.call = stub.WatchReplicas(fleet_pb2.WatchReplicasRequest(**request))  # type: ignore[arg-type]
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for ev in self.call:
            self.events.append(ev)

    def of(self, kind: int) -> list[fleet_pb2.WatchReplicasResponse]:
        """The events of one kind so far."""
        return [e for e in self.events if e.kind == kind]

    def stop(self) -> None:
        """Cancel the stream."""
        self.call.cancel()


@pytest.fixture
async def fleet_and_agent(
    tmp_path: Path,
) -> AsyncIterator[tuple[fleet_pb2_grpc.FleetServiceAsyncStub, ScriptedAgent]]:
    """A fleet (NOT_READY after 0.6 s of silence) with one scripted agent that sends no
    heartbeats of its own (its reports are what the fleet hears)."""
    async with running_fleet(tmp_path, liveness=SLOW_LOSS) as (fleet, stub):
        fleet.controller.hub.heartbeat_s = 0.5  # streams read it at each wait
        agent = ScriptedAgent(f"127.0.0.1:{fleet.port}", "node-a", gpus=2, heartbeat_s=0.1)
        agent.start()
        try:
            yield stub, agent
        finally:
            await agent.stop()


async def test_endpoint_carries_what_a_gateway_routes_by(
    fleet_and_agent: tuple[fleet_pb2_grpc.FleetServiceAsyncStub, ScriptedAgent],
) -> None:
    """An ADDED endpoint says engine, dialect, per-request context, max output, slots, cards,
    weight and when it became ready; events carry a rising sequence, time and epoch."""
    stub, _agent = fleet_and_agent
    await stub.CreateModel(fleet_pb2.CreateModelRequest(model=llama()))
    reader = Reader(stub, model="llama")
    await assert_eventually(lambda: reader.of(W.KIND_ADDED), what="ADDED")
    e = reader.of(W.KIND_ADDED)[0]
    ep = e.endpoint
    assert (ep.model, ep.profile, ep.engine) == ("llama", "gguf", "llamacpp")
    assert ep.api_dialect == fleet_pb2.API_DIALECT_LLAMACPP
    assert (ep.context_tokens, ep.slots, ep.max_output) == (4096, 4, 2048)
    assert (ep.cards, len(ep.gpus), ep.gpu_class, ep.weight) == (1, 1, "H100-80GB", 100)
    assert ep.address and ep.ready_since.seconds > 0 and ep.revision == 1
    assert e.seq > 0 and e.epoch and e.time.seconds > 0
    # The snapshot ends in SYNCED: first when the replica turned ready after the watch opened,
    # right after its ADDED when it was ready before.
    assert W.KIND_SYNCED in [ev.kind for ev in reader.events[:2]]
    reader.stop()


async def test_unknown_model_is_not_found_with_error_info(
    fleet_and_agent: tuple[fleet_pb2_grpc.FleetServiceAsyncStub, ScriptedAgent],
) -> None:
    """Watching a model the catalog does not have is NOT_FOUND with MODEL_NOT_FOUND, not an
    empty SYNCED."""
    stub, _agent = fleet_and_agent
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in stub.WatchReplicas(fleet_pb2.WatchReplicasRequest(model="nope")):
            pass
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    status = rpc_status.from_call(caught.value)
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    assert any(d.Unpack(info) for d in status.details if d.Is(info.DESCRIPTOR))
    assert info.reason == "MODEL_NOT_FOUND" and info.domain == "fleet.llmgw.dev"


async def test_not_ready_node_leaves_routing_and_comes_back(
    fleet_and_agent: tuple[fleet_pb2_grpc.FleetServiceAsyncStub, ScriptedAgent],
) -> None:
    """A node that falls silent takes its endpoints out (NODE_NOT_READY) long before it
    would be LOST; when it is heard again they are ADDED back, same id and address."""
    stub, agent = fleet_and_agent
    await stub.CreateModel(fleet_pb2.CreateModelRequest(model=llama()))
    reader = Reader(stub, model="llama")
    await assert_eventually(lambda: reader.of(W.KIND_ADDED), what="ADDED")
    added = reader.of(W.KIND_ADDED)[0].endpoint
    await agent.stop()  # the stream drops: the node is NOT_READY, its engine may still run
    await assert_eventually(lambda: reader.of(W.KIND_REMOVED), what="REMOVED")
    gone = reader.of(W.KIND_REMOVED)[0]
    assert gone.reason == fleet_pb2.ENDPOINT_REASON_NODE_NOT_READY
    assert gone.endpoint.replica_id == added.replica_id
    agent.start()  # hello again with the replica running
    await assert_eventually(lambda: len(reader.of(W.KIND_ADDED)) == 2, what="ADDED again")
    back = reader.of(W.KIND_ADDED)[1].endpoint
    assert (back.replica_id, back.address) == (added.replica_id, added.address)
    seqs = [e.seq for e in reader.events if e.kind != W.KIND_HEARTBEAT]
    assert seqs == sorted(seqs) and len(set(seqs[1:])) == len(seqs[1:])
    reader.stop()


async def test_crash_restart_is_removed_failed_then_added_at_its_new_address(
    fleet_and_agent: tuple[fleet_pb2_grpc.FleetServiceAsyncStub, ScriptedAgent],
) -> None:
    """A crashed engine leaves routing as FAILED; its restart under the same replica id at a
    new address is ADDED again (a gateway upserts by replica id)."""
    stub, agent = fleet_and_agent
    await stub.CreateModel(fleet_pb2.CreateModelRequest(model=llama()))
    reader = Reader(stub, model="llama")
    await assert_eventually(lambda: reader.of(W.KIND_ADDED), what="ADDED")
    first = reader.of(W.KIND_ADDED)[0].endpoint
    spec = agent.running[first.replica_id]
    agent.report(spec, agent_pb2.PROCESS_PHASE_CRASHED, "exit 139")
    await assert_eventually(lambda: reader.of(W.KIND_REMOVED), what="REMOVED")
    assert reader.of(W.KIND_REMOVED)[0].reason == fleet_pb2.ENDPOINT_REASON_FAILED
    agent.report(spec, agent_pb2.PROCESS_PHASE_HEALTHY, address="127.0.0.1:9777")
    await assert_eventually(lambda: len(reader.of(W.KIND_ADDED)) == 2, what="ADDED again")
    again = reader.of(W.KIND_ADDED)[1].endpoint
    assert (again.replica_id, again.address) == (first.replica_id, "127.0.0.1:9777")
    reader.stop()


async def test_reconnect_resumes_from_the_last_sequence(
    fleet_and_agent: tuple[fleet_pb2_grpc.FleetServiceAsyncStub, ScriptedAgent],
) -> None:
    """A watcher that reconnects with its last sequence and epoch gets exactly the events it
    missed and a SYNCED saying resumed; a made-up epoch gets a snapshot that says why."""
    stub, _agent = fleet_and_agent
    await stub.CreateModel(fleet_pb2.CreateModelRequest(model=llama(1)))
    first = Reader(stub, model="llama")
    await assert_eventually(lambda: first.of(W.KIND_ADDED), what="ADDED")
    last = first.events[-1]
    first.stop()
    current = await stub.GetModel(fleet_pb2.GetModelRequest(name="llama"))
    await stub.UpdateModel(fleet_pb2.UpdateModelRequest(model=llama(2), etag=current.model.etag))
    probe = Reader(stub, model="llama")
    await assert_eventually(lambda: len(probe.of(W.KIND_ADDED)) == 2, what="second ADDED")
    probe.stop()
    resumed = Reader(stub, model="llama", after_seq=last.seq, epoch=last.epoch)
    await assert_eventually(lambda: resumed.of(W.KIND_SYNCED), what="SYNCED")
    synced = resumed.of(W.KIND_SYNCED)[0]
    assert synced.resumed
    missed = [e for e in resumed.events if e.kind == W.KIND_ADDED]
    assert len(missed) == 1 and missed[0].seq > last.seq
    assert missed[0].endpoint.replica_id != last.endpoint.replica_id
    resumed.stop()
    fresh = Reader(stub, model="llama", after_seq=last.seq, epoch="someone-else")
    await assert_eventually(lambda: fresh.of(W.KIND_SYNCED), what="SYNCED")
    assert not fresh.of(W.KIND_SYNCED)[0].resumed
    assert "epoch" in fresh.of(W.KIND_SYNCED)[0].note
    assert len(fresh.of(W.KIND_ADDED)) == 2
    fresh.stop()


async def test_address_change_while_ready_is_an_update(
    fleet_and_agent: tuple[fleet_pb2_grpc.FleetServiceAsyncStub, ScriptedAgent],
) -> None:
    """A READY replica re-reported at another address stays routable: one UPDATED with the
    new address, no REMOVED."""
    stub, agent = fleet_and_agent
    await stub.CreateModel(fleet_pb2.CreateModelRequest(model=llama()))
    reader = Reader(stub, model="llama")
    await assert_eventually(lambda: reader.of(W.KIND_ADDED), what="ADDED")
    first = reader.of(W.KIND_ADDED)[0].endpoint
    agent.report(agent.running[first.replica_id], agent_pb2.PROCESS_PHASE_HEALTHY, address="h:1")
    await assert_eventually(lambda: reader.of(W.KIND_UPDATED), what="UPDATED")
    updated = reader.of(W.KIND_UPDATED)[0].endpoint
    assert (updated.replica_id, updated.address) == (first.replica_id, "h:1")
    assert not reader.of(W.KIND_REMOVED)
    reader.stop()


async def test_quiet_stream_gets_heartbeats_over_grpc(
    fleet_and_agent: tuple[fleet_pb2_grpc.FleetServiceAsyncStub, ScriptedAgent],
) -> None:
    """With nothing changing, the stream carries HEARTBEAT messages with the latest sequence
    and the fleet's epoch (what a proxy's read timeout needs to see)."""
    stub, _agent = fleet_and_agent
    await stub.CreateModel(fleet_pb2.CreateModelRequest(model=llama(replicas=0)))
    reader = Reader(stub, model="llama")
    await assert_eventually(lambda: reader.of(W.KIND_SYNCED), what="SYNCED")
    synced = reader.of(W.KIND_SYNCED)[0]
    await assert_eventually(lambda: len(reader.of(W.KIND_HEARTBEAT)) >= 2, what="heartbeats")
    beat = reader.of(W.KIND_HEARTBEAT)[0]
    assert (beat.seq, beat.epoch) == (synced.seq, synced.epoch) and beat.time.seconds > 0
    assert not beat.HasField("endpoint")
    reader.stop()
