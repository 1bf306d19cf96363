"""The API side hands a change to the controller through the store only: a change whose
transaction fails runs nowhere (real fleet, planner and scripted agents over gRPC)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from fleet_svc.store.base import StoreUnavailable
from llmgw.fleet.v1 import fleet_pb2
from llmgw.testing.eventually import assert_eventually
from tests.integration.test_rollouts import _is, cluster, ready_count, reason_and_meta, vllm_model


async def test_a_change_whose_commit_fails_runs_nowhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SetContext whose transaction fails after its revision and rollout were written (the
    request id's answer cannot be stored) is STORE_UNAVAILABLE, and then, while the controller
    goes on (another model is created and turns READY), the model keeps revision 1 and its
    replica, no rollout of it exists, and no agent is ever told of a revision 2."""
    async with cluster(tmp_path, nodes=1) as (fleet, stub, agents):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=vllm_model(1)))
        await assert_eventually(lambda: _is(ready_count(stub), 1), what="1 READY")
        before = {r.id for r in (await stub.ListReplicas(fleet_pb2.ListReplicasRequest())).replicas}

        def full_disk(*args: object, **kwargs: object) -> None:
            raise StoreUnavailable(fleet.store.where, "SQLite: database or disk is full")

        monkeypatch.setattr(fleet.store, "put_answer", full_disk)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SetContext(
                fleet_pb2.SetContextRequest(name="vmodel", tokens=16384, request_id="once")
            )
        monkeypatch.undo()
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
        assert reason_and_meta(caught.value)[0] == "STORE_UNAVAILABLE"

        other = vllm_model(1)
        other.name = "other"
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=other))
        await assert_eventually(lambda: _is(ready_count(stub), 2), what="other READY too")

        history = await stub.ListModelRevisions(fleet_pb2.ListModelRevisionsRequest(name="vmodel"))
        assert [r.revision for r in history.revisions] == [1]
        listed = await stub.ListRollouts(fleet_pb2.ListRolloutsRequest(model="vmodel"))
        assert list(listed.rollouts) == []
        assert fleet.controller.rollouts == {}
        now = await stub.ListReplicas(fleet_pb2.ListReplicasRequest(model="vmodel"))
        assert {r.id for r in now.replicas} == before
        told = {(s.model, s.revision) for a in agents for d in a.desired for s in d.replicas}
        assert told == {("vmodel", 1), ("other", 1)}
