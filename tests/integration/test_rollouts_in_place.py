"""In-place changes that cannot fit are refused before anything stops, and an in-place rollout
that ends early starts the old revision again (a planner, a fleet, scripted agents)."""

from __future__ import annotations

import asyncio
import os
import sys

import grpc
import pytest

from llmgw.agent.v1 import agent_pb2
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.eventually import assert_eventually
from tests.integration.test_rollouts import (
    READY,
    cluster,
    reason_and_meta,
    replicas,
    vllm_model,
    wait_rollout,
)

PENDING = fleet_pb2.REPLICA_PHASE_PENDING


def other_model(replicas: int) -> common_pb2.Model:
    """Another vLLM model of one card a replica, to hold cards the change cannot have."""
    model = vllm_model(replicas)
    model.name = "other"
    return model


async def _of(stub: fleet_pb2_grpc.FleetServiceAsyncStub, model: str) -> list[fleet_pb2.Replica]:
    return [r for r in await replicas(stub) if r.model == model]


async def _ready(stub: fleet_pb2_grpc.FleetServiceAsyncStub, model: str, n: int) -> bool:
    rs = await _of(stub, model)
    return len(rs) == n and all(r.phase == READY for r in rs)


async def test_in_place_change_that_can_never_fit_is_refused_before_anything_stops(
    tmp_path: object,
) -> None:
    """gpus 4 --in-place on the one 4-card node, where another model holds a card, is
    NO_ROOM_IN_PLACE naming the 3 cards it could ever have; the replica keeps running."""
    async with cluster(tmp_path, gpus_per_node=4, nodes=1) as (_fleet, stub, _agents):  # type: ignore[arg-type]
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=vllm_model(1)))
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=other_model(1)))
        await assert_eventually(lambda: _ready(stub, "vmodel", 1), what="vmodel READY")
        await assert_eventually(lambda: _ready(stub, "other", 1), what="other READY")
        before = await _of(stub, "vmodel")
        revision = (await stub.GetModel(fleet_pb2.GetModelRequest(name="vmodel"))).model.revision
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SetGPUs(fleet_pb2.SetGPUsRequest(name="vmodel", gpus=4, in_place=True))
        assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        reason, meta = reason_and_meta(caught.value)
        assert reason == "NO_ROOM_IN_PLACE"
        assert meta["need_gpus"] == "4" and meta["most_gpus"] == "3"
        assert "4" in (caught.value.details() or "") and "3" in (caught.value.details() or "")
        after = await _of(stub, "vmodel")
        assert [(r.id, r.phase) for r in after] == [(before[0].id, READY)]
        got = await stub.GetModel(fleet_pb2.GetModelRequest(name="vmodel"))
        assert got.model.revision == revision
        assert not (await stub.ListRollouts(fleet_pb2.ListRolloutsRequest())).rollouts


async def test_cancelled_in_place_rollout_starts_the_old_revision_again(tmp_path: object) -> None:
    """Two one-card replicas on a 2-card node go to 2 cards each in place: the first new one
    waits PENDING (its sibling holds a card); cancelling brings the old revision back READY on
    one card."""
    async with cluster(tmp_path, gpus_per_node=2, nodes=1) as (_fleet, stub, _agents):  # type: ignore[arg-type]
        created = await stub.CreateModel(fleet_pb2.CreateModelRequest(model=vllm_model(2)))
        await assert_eventually(lambda: _ready(stub, "vmodel", 2), what="2 READY")
        answer = await stub.SetGPUs(fleet_pb2.SetGPUsRequest(name="vmodel", gpus=2, in_place=True))
        assert answer.rollout_id

        async def new_pending() -> bool:
            return any(
                r.phase == PENDING and r.revision == answer.model.revision
                for r in await _of(stub, "vmodel")
            )

        await assert_eventually(new_pending, what="the new replica PENDING")
        await stub.CancelRollout(fleet_pb2.CancelRolloutRequest(id=answer.rollout_id))
        ro = await wait_rollout(stub, answer.rollout_id)
        assert ro.state == fleet_pb2.ROLLOUT_STATE_CANCELLED
        await assert_eventually(lambda: _ready(stub, "vmodel", 2), what="2 READY again")
        back = await _of(stub, "vmodel")
        assert {r.revision for r in back} == {created.model.revision}
        assert all(len(r.gpus) == 1 for r in back)
        assert all("--tensor-parallel-size" not in list(r.args) for r in back)


async def test_cli_following_an_in_place_change_says_why_its_replica_waits(
    tmp_path: object,
) -> None:
    """`llmgw ctl model gpus --in-place` prints the PENDING reason of the replica it waits
    for (no rollout event comes while it waits), and exits 5 once the rollout is cancelled."""
    async with cluster(tmp_path, gpus_per_node=2, nodes=1) as (fleet, stub, _agents):  # type: ignore[arg-type]
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=vllm_model(2)))
        await assert_eventually(lambda: _ready(stub, "vmodel", 2), what="2 READY")
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
        env["LLMGW_DATA"] = "/nonexistent/llmgw-data"
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "llmgw.cli.main",
            "ctl",
            "--fleet",
            f"127.0.0.1:{fleet.port}",
            "model",
            "gpus",
            "vmodel",
            "2",
            "--in-place",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        assert proc.stdout is not None
        seen: list[str] = []

        async def until_waiting() -> str:
            assert proc.stdout is not None
            while line := (await proc.stdout.readline()).decode():
                seen.append(line)
                if " pending: " in line:
                    return line
            return ""

        try:
            waiting = await asyncio.wait_for(until_waiting(), 60)
        finally:
            rollouts = (await stub.ListRollouts(fleet_pb2.ListRolloutsRequest())).rollouts
            for ro in rollouts:
                await stub.CancelRollout(fleet_pb2.CancelRolloutRequest(id=ro.id))
            out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert waiting, "".join(seen) + out.decode() + err.decode()
        assert "waiting [gpu]" in waiting and "2" in waiting.split(" pending: ", 1)[1]
        assert proc.returncode == 5, err.decode()


async def test_failed_in_place_rollout_starts_the_old_revision_again_on_its_cards(
    tmp_path: object,
) -> None:
    """An in-place gpus 2 whose new engine crashes fails the rollout, and the old revision
    comes back READY on one card with its old args (not placed as the new one would be)."""

    def crash_new(spec: agent_pb2.ReplicaSpec) -> agent_pb2.ProcessPhase.ValueType:
        return (
            agent_pb2.PROCESS_PHASE_CRASHED
            if spec.revision >= 2
            else agent_pb2.PROCESS_PHASE_HEALTHY
        )

    async with cluster(tmp_path, gpus_per_node=4, nodes=1, phase_for=crash_new) as (  # type: ignore[arg-type]
        _fleet,
        stub,
        _agents,
    ):
        created = await stub.CreateModel(fleet_pb2.CreateModelRequest(model=vllm_model(1)))
        await assert_eventually(lambda: _ready(stub, "vmodel", 1), what="1 READY")
        answer = await stub.SetGPUs(fleet_pb2.SetGPUsRequest(name="vmodel", gpus=2, in_place=True))
        ro = await wait_rollout(stub, answer.rollout_id)
        assert ro.state == fleet_pb2.ROLLOUT_STATE_FAILED, ro.reason
        await assert_eventually(lambda: _ready(stub, "vmodel", 1), what="the old revision READY")
        [back] = await _of(stub, "vmodel")
        assert back.revision == created.model.revision
        assert len(back.gpus) == 1
        assert "--tensor-parallel-size" not in list(back.args)
