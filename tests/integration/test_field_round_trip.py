"""Every field of a catalog model survives every layer: CreateModel, UpdateModel, GetModel,
ListModels, the settings file and a restart, on both stores; and every field of a starting
replica's progress survives the agent stream, the store, ListReplicas and a restart. The
messages are built from the proto descriptors (tests/support/filled.py), every field set, so a
field added to the contract and dropped by any layer fails here without anyone adding it to a
list."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from google.protobuf import json_format

from fleet_svc.domain.nodes import Liveness
from llmgw.agent.v1 import agent_pb2
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.scripted_agent import ScriptedAgent
from tests.support.filled import fill, unset_fields
from tests.support.fleet import running_fleet
from tests.support.postgres import fresh_database


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Each store: a SQLite file in a temporary folder, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield str(tmp_path / "fleet.db")
        return
    with fresh_database() as (_name, dsn):
        yield dsn


def filled_model(seed: int, name: str = "") -> common_pb2.Model:
    """A model with every field (nested ones too) set, differing from another seed's in each."""
    msg = fill(common_pb2.Model(), seed)
    assert isinstance(msg, common_pb2.Model)
    if name:
        msg.name = name
    assert unset_fields(msg) == []
    return msg


def test_the_filled_model_sets_every_field_of_every_message() -> None:
    """The fixture leaves no field at its default, Model's, Profile's and every nested one."""
    msg = filled_model(1)
    assert msg.profiles[0].engine_version and msg.shape.layer_shapes[0].state_bytes
    assert filled_model(2).profiles[0] != msg.profiles[0]


async def test_every_field_survives_create_update_get_and_a_restart(
    tmp_path: Path, store_url: str
) -> None:
    """What CreateModel and UpdateModel accepted, GetModel, ListModels and the revision
    history give back field for field, before and after the fleet restarts on its store."""
    created_msg = filled_model(1)
    updated_msg = filled_model(2, name=created_msg.name)
    name = created_msg.name
    async with running_fleet(tmp_path, store_url=store_url) as (_, stub):
        created = await stub.CreateModel(fleet_pb2.CreateModelRequest(model=created_msg))
        assert created.model.model == created_msg
        got = await stub.GetModel(fleet_pb2.GetModelRequest(name=name))
        assert got.model.model == created_msg
        updated = await stub.UpdateModel(
            fleet_pb2.UpdateModelRequest(
                model=updated_msg,
                etag=got.model.etag,
                strategy=fleet_pb2.STRATEGY_IN_PLACE,
            )
        )
        assert updated.model.model == updated_msg
        assert (await stub.GetModel(fleet_pb2.GetModelRequest(name=name))).model.model == (
            updated_msg
        )
    async with running_fleet(tmp_path, store_url=store_url) as (_, stub):
        got = await stub.GetModel(fleet_pb2.GetModelRequest(name=name))
        assert got.model.model == updated_msg
        assert got.model.etag == updated.model.etag
        listed = await stub.ListModels(fleet_pb2.ListModelsRequest())
        assert [m.model for m in listed.models] == [updated_msg]
        history = await stub.ListModelRevisions(fleet_pb2.ListModelRevisionsRequest(name=name))
        assert [r.model for r in history.revisions] == [created_msg, updated_msg]


async def test_every_field_of_a_declared_model_survives_the_settings_file_and_restarts(
    tmp_path: Path, store_url: str
) -> None:
    """A model declared in the settings file (its JSON form, every field set) reads back
    field for field, and fleet starts on the same file and store keep its one revision."""
    declared = filled_model(3)
    settings = tmp_path / "cluster.yaml"
    settings.write_text(
        yaml.safe_dump(
            {"models": [json_format.MessageToDict(declared, preserving_proto_field_name=True)]}
        )
    )
    for _start in range(3):
        async with running_fleet(tmp_path, settings=str(settings), store_url=store_url) as (
            _,
            stub,
        ):
            got = await stub.GetModel(fleet_pb2.GetModelRequest(name=declared.name))
            assert got.model.model == declared
            assert got.model.declared_in == str(settings)
    async with running_fleet(tmp_path, settings=str(settings), store_url=store_url) as (_, stub):
        history = await stub.ListModelRevisions(
            fleet_pb2.ListModelRevisionsRequest(name=declared.name)
        )
        assert [r.revision for r in history.revisions] == [1]


# Not LOST for 30 s: the restarted fleet keeps the replica STARTING while no agent says hello.
PATIENT = Liveness(interval_s=0.2, grace_heartbeats=3, lost_after_s=30.0)
ONE_CARD = common_pb2.Model(
    name="starting",
    source="hf://org/starting",
    context_length=8192,
    profiles=[
        common_pb2.Profile(
            name="gpu",
            engine="vllm",
            args=["--max-model-len", "8192"],
            gpu_class="H100-80GB",
            gpus_per_node=1,
            tp=1,
            replicas=1,
        )
    ],
)


async def test_every_progress_field_survives_the_stream_the_store_and_a_restart(
    tmp_path: Path, store_url: str
) -> None:
    """A starting replica's progress, every field set, is what ListReplicas shows as its agent
    reported it, and again after the fleet restarts on its store; once READY it is gone."""
    progress = fill(common_pb2.StartProgress(), 1)
    assert isinstance(progress, common_pb2.StartProgress) and unset_fields(progress) == []
    starting = agent_pb2.PROCESS_PHASE_STARTING

    async def shown(stub: fleet_pb2_grpc.FleetServiceAsyncStub) -> list[fleet_pb2.Replica]:
        answer = await stub.ListReplicas(fleet_pb2.ListReplicasRequest())
        return list(answer.replicas)

    async with running_fleet(tmp_path, store_url=store_url, liveness=PATIENT) as (fleet, stub):
        agent = ScriptedAgent(f"127.0.0.1:{fleet.port}", "node-a", phase_for=lambda s: starting)
        agent.start()
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=ONE_CARD))
        spec = await assert_eventually(
            lambda: next(iter(agent.running.values()), None), what="the replica sent"
        )
        agent.report(spec, starting, progress=progress)

        async def reported() -> bool:
            rs = await shown(stub)
            # In the store too: the restart below reads it from there.
            stored = [r.progress for r in fleet.store.list_replicas()]
            return len(rs) == 1 and rs[0].progress == progress and stored != [{}]

        await assert_eventually(reported, what="the progress in ListReplicas and the store")
        await agent.stop()
    async with running_fleet(tmp_path, store_url=store_url, liveness=PATIENT) as (fleet, stub):
        (kept,) = await shown(stub)
        assert kept.phase == fleet_pb2.REPLICA_PHASE_STARTING and kept.progress == progress
        agent.address = f"127.0.0.1:{fleet.port}"
        agent.phase_for = lambda s: agent_pb2.PROCESS_PHASE_HEALTHY
        agent.start()
        try:

            async def ready() -> bool:
                rs = await shown(stub)
                return rs[0].phase == fleet_pb2.REPLICA_PHASE_READY

            await assert_eventually(ready, what="READY")
            (done,) = await shown(stub)
            assert not done.HasField("progress")
        finally:
            await agent.stop()


async def test_every_field_of_a_canary_policy_survives_the_rollout_and_a_restart(
    tmp_path: Path, store_url: str
) -> None:
    """A canary policy with every field set, sent with UpdateModel, reads back field for field
    in GetRollout and WatchRollout's events, before and after the fleet restarts on its store."""
    policy = fill(fleet_pb2.CanaryPolicy(), 1)
    assert isinstance(policy, fleet_pb2.CanaryPolicy) and unset_fields(policy) == []
    model = filled_model(1)
    async with running_fleet(tmp_path, store_url=store_url) as (_, stub):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model))
        changed = filled_model(2, name=model.name)
        answer = await stub.UpdateModel(fleet_pb2.UpdateModelRequest(model=changed, canary=policy))
        assert answer.rollout_id
        got = await stub.GetRollout(fleet_pb2.GetRolloutRequest(id=answer.rollout_id))
        assert got.rollout.strategy == fleet_pb2.STRATEGY_CANARY
        assert got.rollout.canary.policy == policy
    async with running_fleet(tmp_path, store_url=store_url) as (_, stub):
        again = await stub.GetRollout(fleet_pb2.GetRolloutRequest(id=answer.rollout_id))
        assert again.rollout.canary.policy == policy
