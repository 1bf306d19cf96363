"""Every catalog change applies, over a real planner, fleet and scripted agents: UpdateModel
rolls out what replicas run (beside, in place, with the same refusals as SetContext), a replica
count change only scales, a change that changes nothing writes nothing, and a rollout's events
carry enum kinds and the state right after each."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.scripted_agent import ScriptedAgent
from tests.integration.test_rollouts import (
    Prober,
    cluster,
    reason_and_meta,
    replicas,
    vllm_model,
)

READY = fleet_pb2.REPLICA_PHASE_READY
ENDINGS = {
    fleet_pb2.ROLLOUT_EVENT_KIND_ROLLOUT_SUCCEEDED,
    fleet_pb2.ROLLOUT_EVENT_KIND_ROLLOUT_FAILED,
    fleet_pb2.ROLLOUT_EVENT_KIND_ROLLOUT_CANCELLED,
}


def with_args(model: common_pb2.Model, *args: str) -> common_pb2.Model:
    """`model` whose one profile runs `args`."""
    changed = common_pb2.Model()
    changed.CopyFrom(model)
    del changed.profiles[0].args[:]
    changed.profiles[0].args.extend(args)
    return changed


async def ready_ids(stub: fleet_pb2_grpc.FleetServiceAsyncStub) -> set[str]:
    """The ids of the READY replicas."""
    return {r.id for r in await replicas(stub) if r.phase == READY}


async def settled(stub: fleet_pb2_grpc.FleetServiceAsyncStub, n: int) -> set[str]:
    """Wait until exactly `n` replicas exist and all are READY; their ids."""

    async def done() -> bool:
        rs = await replicas(stub)
        return len(rs) == n and all(r.phase == READY for r in rs)

    await assert_eventually(done, timeout_s=30, what=f"{n} READY replicas and no other")
    return await ready_ids(stub)


async def events_of(
    stub: fleet_pb2_grpc.FleetServiceAsyncStub, rid: str
) -> list[fleet_pb2.WatchRolloutResponse]:
    """Every event of a rollout, followed to its end."""
    return [ev async for ev in stub.WatchRollout(fleet_pb2.WatchRolloutRequest(id=rid))]


def sent_specs(agents: list[ScriptedAgent], replica_id: str) -> list[tuple[int, tuple[str, ...]]]:
    """Every (revision, args) the agents were told to run `replica_id` with, in order."""
    return [
        (s.revision, tuple(s.args))
        for a in agents
        for d in a.desired
        for s in d.replicas
        if s.replica_id == replica_id
    ]


async def test_update_model_args_roll_out_beside_with_events_in_state_order(
    tmp_path: Path,
) -> None:
    """UpdateModel with new args replaces both replicas beside (never fewer than 2 ready); the
    new ones run the new args; each event is an enum kind whose state is RUNNING until the
    ending event, which alone says SUCCEEDED; every step ends DONE, beside."""
    async with cluster(tmp_path) as (_fleet, stub, agents):
        created = await stub.CreateModel(fleet_pb2.CreateModelRequest(model=vllm_model(2)))
        old = await settled(stub, 2)
        prober = Prober(stub, "vmodel")
        await asyncio.wait_for(prober.synced.wait(), 5)
        new_args = ("--max-model-len", "8192", "--max-num-seqs", "64")
        answer = await stub.UpdateModel(
            fleet_pb2.UpdateModelRequest(
                model=with_args(vllm_model(2), *new_args), etag=created.model.etag, surge=1
            )
        )
        assert answer.rollout_id and answer.restarted == 2 and not answer.unchanged
        assert answer.model.revision == 2 and answer.model.etag != created.model.etag
        events = await events_of(stub, answer.rollout_id)
        ro = (await stub.GetRollout(fleet_pb2.GetRolloutRequest(id=answer.rollout_id))).rollout
        assert ro.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, ro.reason
        assert ro.kind == "update"
        assert [(s.stage, s.mode) for s in ro.steps] == [
            (fleet_pb2.ROLLOUT_STAGE_DONE, fleet_pb2.ROLLOUT_MODE_BESIDE)
        ] * 2
        assert events[0].kind == fleet_pb2.ROLLOUT_EVENT_KIND_ROLLOUT_STARTED
        assert events[-1].kind == fleet_pb2.ROLLOUT_EVENT_KIND_ROLLOUT_SUCCEEDED
        assert events[-1].state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED
        assert all(e.state == fleet_pb2.ROLLOUT_STATE_RUNNING for e in events[:-1])
        assert not ENDINGS & {e.kind for e in events[:-1]}
        stopped = [e for e in events if e.kind == fleet_pb2.ROLLOUT_EVENT_KIND_REPLICA_STOPPED]
        assert {e.replica_id for e in stopped} == old
        assert all(e.mode == fleet_pb2.ROLLOUT_MODE_BESIDE for e in stopped)
        now = await settled(stub, 2)
        prober.stop()
        assert prober.low >= 2
        assert not now & old
        for r in await replicas(stub):
            assert tuple(r.args) == new_args and r.revision == 2
            assert sent_specs(agents, r.id)[-1] == (2, new_args)


async def test_update_model_is_refused_as_set_context_is_then_rolls_out_in_place(
    tmp_path: Path,
) -> None:
    """With every card busy, a new source is NO_ROOM_BESIDE (dry or not) and writes nothing;
    a dry run in place says what would restart and writes nothing; a stale etag is
    STALE_REVISION; in place it rolls out, and while it runs another update is
    ROLLOUT_IN_PROGRESS."""
    async with cluster(tmp_path, gpus_per_node=2, nodes=1) as (_fleet, stub, _agents):
        created = await stub.CreateModel(fleet_pb2.CreateModelRequest(model=vllm_model(2)))
        old = await settled(stub, 2)
        moved = vllm_model(2)
        moved.source = "hf://org/model@v2"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.UpdateModel(fleet_pb2.UpdateModelRequest(model=moved))
        assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert reason_and_meta(caught.value)[0] == "NO_ROOM_BESIDE"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.UpdateModel(fleet_pb2.UpdateModelRequest(model=moved, dry_run=True))
        assert reason_and_meta(caught.value)[0] == "NO_ROOM_BESIDE"
        dry = await stub.UpdateModel(
            fleet_pb2.UpdateModelRequest(
                model=moved, dry_run=True, strategy=fleet_pb2.STRATEGY_IN_PLACE
            )
        )
        assert (dry.rollout_id, dry.restarted, dry.model.revision, dry.model.etag) == (
            "",
            2,
            0,
            "",
        )
        assert dry.model.model.source == "hf://org/model@v2"
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.UpdateModel(fleet_pb2.UpdateModelRequest(model=moved, etag="1"))
        assert reason_and_meta(caught.value)[0] == "STALE_REVISION"
        got = await stub.GetModel(fleet_pb2.GetModelRequest(name="vmodel"))
        assert (got.model.revision, got.model.etag) == (1, created.model.etag)
        assert not (await stub.ListRollouts(fleet_pb2.ListRolloutsRequest())).rollouts

        answer = await stub.UpdateModel(
            fleet_pb2.UpdateModelRequest(
                model=moved, etag=created.model.etag, strategy=fleet_pb2.STRATEGY_IN_PLACE
            )
        )
        assert answer.rollout_id and answer.restarted == 2
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.UpdateModel(fleet_pb2.UpdateModelRequest(model=vllm_model(2)))
        assert caught.value.code() is grpc.StatusCode.ABORTED
        assert reason_and_meta(caught.value)[0] == "ROLLOUT_IN_PROGRESS"
        await events_of(stub, answer.rollout_id)
        ro = (await stub.GetRollout(fleet_pb2.GetRolloutRequest(id=answer.rollout_id))).rollout
        assert ro.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, ro.reason
        assert {s.mode for s in ro.steps} == {fleet_pb2.ROLLOUT_MODE_IN_PLACE}
        now = await settled(stub, 2)
        assert not now & old


async def test_a_replica_count_change_only_scales(tmp_path: Path) -> None:
    """UpdateModel of the count alone starts no rollout: 2 -> 3 adds one replica beside the two
    that serve, which are never told anything new; 3 -> 1 removes two and the one left is
    one that was serving."""
    async with cluster(tmp_path) as (_fleet, stub, agents):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=vllm_model(2)))
        first = await settled(stub, 2)
        sent_before = {rid: sent_specs(agents, rid)[-1] for rid in first}
        grown = await stub.UpdateModel(fleet_pb2.UpdateModelRequest(model=vllm_model(3)))
        assert (grown.rollout_id, grown.restarted, grown.unchanged) == ("", 0, False)
        assert grown.model.revision == 2
        three = await settled(stub, 3)
        assert first < three
        for rid in first:
            assert set(sent_specs(agents, rid)) == {sent_before[rid]}
        shrunk = await stub.UpdateModel(fleet_pb2.UpdateModelRequest(model=vllm_model(1)))
        assert shrunk.rollout_id == "" and shrunk.restarted == 0
        (left,) = await settled(stub, 1)
        assert left in three
        assert not (await stub.ListRollouts(fleet_pb2.ListRolloutsRequest())).rollouts


async def test_changes_that_change_nothing_are_answered_unchanged(tmp_path: Path) -> None:
    """SetContext to the context the model has, SetGPUs to its count and an identical
    UpdateModel write no revision, start no rollout, keep the etag and say unchanged, from the
    first call: what the planner fills in (max_output, the card flags) is not a change asked."""
    async with cluster(tmp_path) as (_fleet, stub, _agents):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=vllm_model(1)))
        serving = await settled(stub, 1)
        current = (await stub.GetModel(fleet_pb2.GetModelRequest(name="vmodel"))).model
        rollouts = len((await stub.ListRollouts(fleet_pb2.ListRolloutsRequest())).rollouts)
        context = await stub.SetContext(
            fleet_pb2.SetContextRequest(name="vmodel", tokens=8192, etag=current.etag)
        )
        gpus = await stub.SetGPUs(fleet_pb2.SetGPUsRequest(name="vmodel", gpus=1))
        same = await stub.UpdateModel(
            fleet_pb2.UpdateModelRequest(model=current.model, etag=current.etag)
        )
        for answer in (context, gpus, same):
            assert answer.unchanged and answer.rollout_id == ""
            assert (answer.model.revision, answer.model.etag) == (current.revision, current.etag)
        assert context.change.after == 8192 and context.change.max_output == 2048
        history = await stub.ListModelRevisions(fleet_pb2.ListModelRevisionsRequest(name="vmodel"))
        assert [r.revision for r in history.revisions] == [1]
        got = await stub.GetModel(fleet_pb2.GetModelRequest(name="vmodel"))
        assert got.model.model == vllm_model(1) and rollouts == 0
        assert len((await stub.ListRollouts(fleet_pb2.ListRolloutsRequest())).rollouts) == rollouts
        assert await ready_ids(stub) == serving


async def test_an_unchecked_plan_is_applied_only_when_asked(tmp_path: Path) -> None:
    """SetGPUs and SetContext of a model whose source the planner cannot read are refused
    FAILED_PRECONDITION PLAN_NOT_CHECKED, nothing written; a dry run answers with verdict
    NOT_CHECKED; with allow_unchecked the plan is applied."""
    unread = vllm_model(0)
    unread.ClearField("shape")
    unread.source = "http://127.0.0.1:1/unreachable.gguf"
    async with cluster(tmp_path) as (_fleet, stub, _agents):
        created = await stub.CreateModel(fleet_pb2.CreateModelRequest(model=unread))
        for call in (
            stub.SetGPUs(fleet_pb2.SetGPUsRequest(name="vmodel", gpus=2)),
            stub.SetContext(fleet_pb2.SetContextRequest(name="vmodel", tokens=4096)),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            reason, meta = reason_and_meta(caught.value)
            assert reason == "PLAN_NOT_CHECKED" and meta["model"] == "vmodel"
            assert "could not be read" in meta["why"]
        got = await stub.GetModel(fleet_pb2.GetModelRequest(name="vmodel"))
        assert (got.model.revision, got.model.etag) == (1, created.model.etag)
        dry = await stub.SetGPUs(fleet_pb2.SetGPUsRequest(name="vmodel", gpus=2, dry_run=True))
        assert dry.change.verdict == common_pb2.FIT_VERDICT_NOT_CHECKED
        applied = await stub.SetGPUs(
            fleet_pb2.SetGPUsRequest(name="vmodel", gpus=2, allow_unchecked=True)
        )
        assert applied.model.revision == 2
        assert applied.model.model.profiles[0].gpus_per_node == 2


async def test_a_batch_asked_of_set_context_and_set_gpus_reaches_the_engine(
    tmp_path: Path,
) -> None:
    """SetContext with `sequences` writes that batch to the engine's own flag (vLLM
    --max-num-seqs) and the new replicas run it; the answer says it does not fit (64 requests
    of 8192 tokens are more than Llama-3.1-8B's pool holds on one H100), which is said, not
    refused. Asked again, and of SetGPUs at the same count, it is unchanged; a smaller batch
    through SetGPUs is a change that fits; a batch out of range is refused INVALID_ARGUMENT
    and nothing is written."""
    async with cluster(tmp_path) as (_fleet, stub, agents):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=vllm_model(1)))
        await settled(stub, 1)
        answer = await stub.SetContext(
            fleet_pb2.SetContextRequest(name="vmodel", tokens=8192, sequences=64)
        )
        assert answer.rollout_id and not answer.unchanged
        assert [(b.profile, b.sequences, b.tokens, b.flag) for b in answer.batches] == [
            ("gpu", 64, 8192, "--max-num-seqs")
        ]
        assert not answer.batches[0].fits and 0 < answer.batches[0].contexts_held < 64
        args = tuple(answer.model.model.profiles[0].args)
        assert args == ("--max-model-len", "8192", "--max-num-seqs", "64")
        events = await events_of(stub, answer.rollout_id)
        assert events[-1].kind == fleet_pb2.ROLLOUT_EVENT_KIND_ROLLOUT_SUCCEEDED
        (running,) = await settled(stub, 1)
        assert sent_specs(agents, running)[-1] == (2, args)
        again = await stub.SetContext(
            fleet_pb2.SetContextRequest(name="vmodel", tokens=8192, sequences=64)
        )
        same = await stub.SetGPUs(fleet_pb2.SetGPUsRequest(name="vmodel", gpus=1, sequences=64))
        assert again.unchanged and same.unchanged
        assert [b.sequences for b in same.batches] == [64]
        fewer = await stub.SetGPUs(
            fleet_pb2.SetGPUsRequest(name="vmodel", gpus=1, sequences=16, dry_run=True)
        )
        assert not fewer.unchanged and fewer.model.revision == 0
        assert "--max-num-seqs" in fewer.model.model.profiles[0].args
        assert [(b.sequences, b.fits) for b in fewer.batches] == [(16, True)]
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SetContext(
                fleet_pb2.SetContextRequest(name="vmodel", tokens=8192, sequences=-1)
            )
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        history = await stub.ListModelRevisions(fleet_pb2.ListModelRevisionsRequest(name="vmodel"))
        assert [r.revision for r in history.revisions] == [1, 2]
