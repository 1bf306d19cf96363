"""Applying plans: SetContext and SetGPUs rolled out beside or in place, refusals that change
nothing, failures, undo, and resuming after the fleet restarts (scripted agents)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from fleet_svc.server import FleetServer
from llmgw.agent.v1 import agent_pb2
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.scripted_agent import ScriptedAgent
from tests.support.fleet import running_fleet
from tests.support.planner import running_planner
from tests.support.shapes import LLAMA_31_8B, QWEN25_7B, inline

READY = fleet_pb2.REPLICA_PHASE_READY
H100 = 81559 << 20

# Llama-3.1-8B and Qwen2.5-7B given inline (tests/support/shapes.py), so the planner reads no
# source.
LLAMA_8B = inline(LLAMA_31_8B)
QWEN_7B = inline(QWEN25_7B)


def llamacpp_model(replicas: int = 2) -> common_pb2.Model:
    """A GGUF model served by llama.cpp on one card a replica."""
    return common_pb2.Model(
        name="llama",
        source="/models/llama.gguf",
        context_length=8192,
        shape=LLAMA_8B,
        profiles=[
            common_pb2.Profile(
                name="gguf",
                engine="llamacpp",
                args=["-c", "8192", "-np", "1", "-ngl", "99"],
                gpu_class="H100-80GB",
                gpus_per_node=1,
                replicas=replicas,
            )
        ],
    )


def vllm_model(replicas: int = 2, shape: common_pb2.ModelShape = LLAMA_8B) -> common_pb2.Model:
    """An HF model served by vLLM on one card a replica."""
    return common_pb2.Model(
        name="vmodel",
        source="hf://org/model",
        context_length=8192,
        shape=shape,
        profiles=[
            common_pb2.Profile(
                name="gpu",
                engine="vllm",
                args=["--max-model-len", "8192"],
                gpu_class="H100-80GB",
                gpus_per_node=1,
                replicas=replicas,
            )
        ],
    )


@asynccontextmanager
async def cluster(
    tmp_path: Path, gpus_per_node: int = 4, nodes: int = 2, **agent_kw: object
) -> AsyncIterator[tuple[FleetServer, fleet_pb2_grpc.FleetServiceAsyncStub, list[ScriptedAgent]]]:
    """A planner, a fleet and `nodes` scripted agents of `gpus_per_node` H100s."""
    async with (
        running_planner() as (planner, _p, _c),
        running_fleet(tmp_path, planner=f"127.0.0.1:{planner.port}", start_timeout_s=20.0) as (
            fleet,
            stub,
        ),
    ):
        agents = [
            ScriptedAgent(
                f"127.0.0.1:{fleet.port}",
                f"node-{i}",
                gpus=gpus_per_node,
                **agent_kw,  # type: ignore[arg-type]
            )
            for i in range(nodes)
        ]
        for a in agents:
            a.start()
        try:
            yield fleet, stub, agents
        finally:
            for a in agents:
                await a.stop()


async def replicas(stub: fleet_pb2_grpc.FleetServiceAsyncStub) -> list[fleet_pb2.Replica]:
    """The fleet's replicas now."""
    return list((await stub.ListReplicas(fleet_pb2.ListReplicasRequest())).replicas)


async def ready_count(stub: fleet_pb2_grpc.FleetServiceAsyncStub) -> int:
    """How many replicas are READY."""
    return sum(1 for r in await replicas(stub) if r.phase == READY)


async def wait_rollout(stub: fleet_pb2_grpc.FleetServiceAsyncStub, rid: str) -> fleet_pb2.Rollout:
    """Follow WatchRollout to the end; the rollout as it ended."""
    async for _ in stub.WatchRollout(fleet_pb2.WatchRolloutRequest(id=rid)):
        pass
    return (await stub.GetRollout(fleet_pb2.GetRolloutRequest(id=rid))).rollout


def reason_and_meta(err: grpc.aio.AioRpcError) -> tuple[str, dict[str, str]]:
    """The ErrorInfo reason and metadata of a refusal."""
    status = rpc_status.from_call(err)
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return str(info.reason), dict(info.metadata)
    return "", {}


class Prober:
    """Counts ready endpoints of a model from WatchReplicas throughout a rollout."""

    def __init__(self, stub: fleet_pb2_grpc.FleetServiceAsyncStub, model: str) -> None:
        self.ready: set[str] = set()
        self.low = 1 << 30
        self.synced = asyncio.Event()
        self._task = asyncio.create_task(self._run(stub, model))

    async def _run(self, stub: fleet_pb2_grpc.FleetServiceAsyncStub, model: str) -> None:
        kinds = fleet_pb2.WatchReplicasResponse
        async for ev in stub.WatchReplicas(fleet_pb2.WatchReplicasRequest(model=model)):
            if ev.kind == kinds.KIND_ADDED:
                self.ready.add(ev.endpoint.replica_id)
            elif ev.kind == kinds.KIND_REMOVED:
                self.ready.discard(ev.endpoint.replica_id)
            elif ev.kind == kinds.KIND_SYNCED:
                self.synced.set()
            if self.synced.is_set():
                self.low = min(self.low, len(self.ready))

    def stop(self) -> None:
        """Stop watching."""
        self._task.cancel()


async def test_context_change_rolls_out_beside_and_never_drops_below_two(tmp_path: Path) -> None:
    """A context change on a 2-replica llama.cpp model rolls out beside: the prober never
    sees fewer than 2 ready, and the new replicas run the planner's args."""
    async with cluster(tmp_path) as (_fleet, stub, agents):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=llamacpp_model(2)))
        await assert_eventually(lambda: _is(ready_count(stub), 2), what="2 READY")
        prober = Prober(stub, "llama")
        await asyncio.wait_for(prober.synced.wait(), 5)
        old = {r.id for r in await replicas(stub)}
        answer = await stub.SetContext(fleet_pb2.SetContextRequest(name="llama", tokens=16384))
        assert answer.rollout_id and answer.change.after == 16384
        assert list(answer.model.model.profiles[0].args) == [
            "-c",
            "16384",
            "-np",
            "1",
            "-ngl",
            "99",
        ]
        ro = await wait_rollout(stub, answer.rollout_id)
        assert ro.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, ro.reason
        assert [s.mode for s in ro.steps] == [fleet_pb2.ROLLOUT_MODE_BESIDE] * 2
        await assert_eventually(lambda: _is(ready_count(stub), 2), what="2 READY after")
        prober.stop()
        assert prober.low >= 2
        now = await replicas(stub)
        assert not {r.id for r in now} & old
        assert all(list(r.args) == ["-c", "16384", "-np", "1", "-ngl", "99"] for r in now)
        sent = {s.replica_id: list(s.args) for a in agents for d in a.desired for s in d.replicas}
        assert all(sent[r.id] == list(r.args) for r in now)


async def _is(value: Awaitable[int], want: int) -> bool:
    """Whether an awaited count equals `want`."""
    return await value == want


async def test_gpus_without_room_beside_is_refused_then_in_place_completes(tmp_path: Path) -> None:
    """gpus 2 with every card busy is NO_ROOM_BESIDE and changes nothing; --in-place then
    completes with never more than one replica down."""
    async with cluster(tmp_path, gpus_per_node=2, nodes=2) as (_fleet, stub, _agents):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=vllm_model(replicas=4)))
        await assert_eventually(lambda: _is(ready_count(stub), 4), what="4 READY")
        before = await stub.GetModel(fleet_pb2.GetModelRequest(name="vmodel"))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SetGPUs(fleet_pb2.SetGPUsRequest(name="vmodel", gpus=2))
        assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        reason, meta = reason_and_meta(caught.value)
        assert reason == "NO_ROOM_BESIDE"
        assert meta["need_free_gpus"] == "2" and meta["most_free_gpus"] == "0"
        assert "--in-place" in (caught.value.details() or "")
        after = await stub.GetModel(fleet_pb2.GetModelRequest(name="vmodel"))
        assert after.model.revision == before.model.revision
        assert not (await stub.ListRollouts(fleet_pb2.ListRolloutsRequest())).rollouts

        # 4 replicas of 1 card cannot all become 2 cards on 4 cards: ask for 2 replicas first.
        shrunk = vllm_model(replicas=2)
        await stub.UpdateModel(fleet_pb2.UpdateModelRequest(model=shrunk))
        await assert_eventually(lambda: _is(count(stub), 2), what="2 replicas left")
        prober = Prober(stub, "vmodel")
        await asyncio.wait_for(prober.synced.wait(), 5)
        answer = await stub.SetGPUs(fleet_pb2.SetGPUsRequest(name="vmodel", gpus=2, in_place=True))
        ro = await wait_rollout(stub, answer.rollout_id)
        assert ro.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, ro.reason
        assert {s.mode for s in ro.steps} == {fleet_pb2.ROLLOUT_MODE_IN_PLACE}
        await assert_eventually(lambda: _is(ready_count(stub), 2), what="2 READY after")
        prober.stop()
        assert prober.low >= 1
        for r in await replicas(stub):
            assert len(r.gpus) == 2
            assert "--tensor-parallel-size" in list(r.args)


async def count(stub: fleet_pb2_grpc.FleetServiceAsyncStub) -> int:
    """How many replicas exist."""
    return len(await replicas(stub))


async def test_heads_not_divisible_reaches_the_caller_unchanged(tmp_path: Path) -> None:
    """gpus 3 on a 28-head model is the planner's HEADS_NOT_DIVISIBLE naming the counts."""
    async with cluster(tmp_path) as (_fleet, stub, _agents):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=vllm_model(1, QWEN_7B)))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SetGPUs(fleet_pb2.SetGPUsRequest(name="vmodel", gpus=3))
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        reason, meta = reason_and_meta(caught.value)
        assert reason == "HEADS_NOT_DIVISIBLE"
        assert meta["valid_counts"] == "1,2,4"


async def test_failing_engine_fails_the_rollout_and_undo_works(tmp_path: Path) -> None:
    """A new revision whose engine crashes fails the rollout; the old replicas keep serving;
    undo rolls back to the previous revision."""

    def crash_new(spec: agent_pb2.ReplicaSpec) -> agent_pb2.ProcessPhase.ValueType:
        return (
            agent_pb2.PROCESS_PHASE_CRASHED
            if spec.revision >= 2 and spec.revision != 3
            else (agent_pb2.PROCESS_PHASE_HEALTHY)
        )

    async with cluster(tmp_path, phase_for=crash_new) as (_fleet, stub, _agents):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=vllm_model(2)))
        await assert_eventually(lambda: _is(ready_count(stub), 2), what="2 READY")
        old = {r.id for r in await replicas(stub)}
        answer = await stub.SetContext(fleet_pb2.SetContextRequest(name="vmodel", tokens=16384))
        ro = await wait_rollout(stub, answer.rollout_id)
        assert ro.state == fleet_pb2.ROLLOUT_STATE_FAILED
        assert "did not become healthy" in ro.reason
        assert ro.undo_available
        await assert_eventually(
            lambda: _ids_ready(stub, old), what="the old replicas alone, still READY"
        )
        undo = await stub.UndoRollout(fleet_pb2.UndoRolloutRequest(id=answer.rollout_id))
        assert undo.model.revision == 3
        assert list(undo.model.model.profiles[0].args) == ["--max-model-len", "8192"]
        back = await wait_rollout(stub, undo.rollout.id)
        assert back.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, back.reason
        assert back.undo_of == answer.rollout_id


async def _ids_ready(stub: fleet_pb2_grpc.FleetServiceAsyncStub, ids: set[str]) -> bool:
    rs = await replicas(stub)
    return {r.id for r in rs} == ids and all(r.phase == READY for r in rs)


async def test_second_change_while_rolling_out_is_aborted(tmp_path: Path) -> None:
    """A change while another rolls out is ROLLOUT_IN_PROGRESS, unless it supersedes."""

    def slow(spec: agent_pb2.ReplicaSpec) -> agent_pb2.ProcessPhase.ValueType:
        return (
            agent_pb2.PROCESS_PHASE_STARTING
            if spec.revision >= 2
            else (agent_pb2.PROCESS_PHASE_HEALTHY)
        )

    async with cluster(tmp_path, phase_for=slow) as (_fleet, stub, _agents):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=vllm_model(1)))
        await assert_eventually(lambda: _is(ready_count(stub), 1), what="1 READY")
        first = await stub.SetContext(fleet_pb2.SetContextRequest(name="vmodel", tokens=16384))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SetContext(fleet_pb2.SetContextRequest(name="vmodel", tokens=4096))
        assert caught.value.code() is grpc.StatusCode.ABORTED
        assert reason_and_meta(caught.value)[0] == "ROLLOUT_IN_PROGRESS"
        second = await stub.SetContext(
            fleet_pb2.SetContextRequest(name="vmodel", tokens=4096, supersede=True)
        )
        gone = (await stub.GetRollout(fleet_pb2.GetRolloutRequest(id=first.rollout_id))).rollout
        assert gone.state == fleet_pb2.ROLLOUT_STATE_CANCELLED
        assert second.rollout_id != first.rollout_id


async def test_retry_returns_the_first_answer_and_stale_etag_is_aborted(tmp_path: Path) -> None:
    """A SetContext retried with its request id answers the first rollout; a stale etag is
    ABORTED; a dry run changes nothing and predicts no etag."""
    async with cluster(tmp_path) as (_fleet, stub, _agents):
        created = await stub.CreateModel(fleet_pb2.CreateModelRequest(model=vllm_model(1)))
        read = created.model.etag
        await assert_eventually(lambda: _is(ready_count(stub), 1), what="1 READY")
        dry = await stub.SetContext(
            fleet_pb2.SetContextRequest(name="vmodel", tokens=16384, dry_run=True)
        )
        assert dry.rollout_id == "" and dry.change.after == 16384
        assert (dry.model.revision, dry.model.etag) == (0, "")
        assert (await stub.GetModel(fleet_pb2.GetModelRequest(name="vmodel"))).model.revision == 1
        req = fleet_pb2.SetContextRequest(name="vmodel", tokens=16384, request_id="once", etag=read)
        first = await stub.SetContext(req)
        again = await stub.SetContext(req)
        assert again.rollout_id == first.rollout_id
        await wait_rollout(stub, first.rollout_id)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SetContext(
                fleet_pb2.SetContextRequest(name="vmodel", tokens=4096, etag=read)
            )
        assert caught.value.code() is grpc.StatusCode.ABORTED
        assert reason_and_meta(caught.value)[0] == "STALE_REVISION"


async def test_rollout_resumes_after_the_fleet_restarts(tmp_path: Path) -> None:
    """A fleet killed mid-rollout and started again finishes it, starting no replica twice."""
    hold = {"start": True}

    def gated(spec: agent_pb2.ReplicaSpec) -> agent_pb2.ProcessPhase.ValueType:
        if spec.revision >= 2 and hold["start"]:
            return agent_pb2.PROCESS_PHASE_STARTING
        return agent_pb2.PROCESS_PHASE_HEALTHY

    async with running_planner() as (planner, _p, _c):
        address = f"127.0.0.1:{planner.port}"
        agent: ScriptedAgent
        async with running_fleet(tmp_path, planner=address, start_timeout_s=30) as (fleet, stub):
            agent = ScriptedAgent(f"127.0.0.1:{fleet.port}", "node-0", gpus=4, phase_for=gated)
            agent.start()
            await stub.CreateModel(fleet_pb2.CreateModelRequest(model=vllm_model(2)))
            await assert_eventually(lambda: _is(ready_count(stub), 2), what="2 READY")
            answer = await stub.SetContext(fleet_pb2.SetContextRequest(name="vmodel", tokens=16384))
            await assert_eventually(
                lambda: any(s.revision == 2 for d in agent.desired for s in d.replicas),
                what="a new replica started",
            )
            await agent.stop()
        started_before = {
            s.replica_id for d in agent.desired for s in d.replicas if s.revision == 2
        }
        hold["start"] = False
        async with running_fleet(tmp_path, planner=address, start_timeout_s=30) as (fleet, stub):
            agent.address = f"127.0.0.1:{fleet.port}"
            for spec in agent.running.values():
                if spec.revision == 2:
                    agent.report(spec, agent_pb2.PROCESS_PHASE_HEALTHY)
            agent.start()
            ro = await wait_rollout(stub, answer.rollout_id)
            assert ro.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, ro.reason
            await assert_eventually(lambda: _is(ready_count(stub), 2), what="2 READY after")
            new_ids = {r.id for r in await replicas(stub)}
            started = {s.replica_id for d in agent.desired for s in d.replicas if s.revision == 2}
            assert started_before <= new_ids
            assert len(started | started_before) == 2, "no replica started twice"
            await agent.stop()
