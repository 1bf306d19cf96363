"""The fleet's catalog over real gRPC: revisions, etags, request ids, declared models."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2
from tests.support.fleet import running_fleet


def model(
    name: str = "qwen", replicas: int = 1, args: tuple[str, ...] = ("--max-model-len", "8192")
) -> common_pb2.Model:
    """A model with one vLLM profile on 1 H100."""
    return common_pb2.Model(
        name=name,
        source="hf://Qwen/Qwen3-8B",
        context_length=8192,
        profiles=[
            common_pb2.Profile(
                name="gpu",
                engine="vllm",
                args=list(args),
                gpu_class="H100-80GB",
                gpus_per_node=1,
                replicas=replicas,
            )
        ],
    )


def reason_of(err: grpc.aio.AioRpcError) -> str:
    """The ErrorInfo reason of a refusal."""
    status = rpc_status.from_call(err)
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return str(info.reason)
    return ""


def metadata_of(err: grpc.aio.AioRpcError) -> dict[str, str]:
    """The ErrorInfo metadata of a refusal."""
    status = rpc_status.from_call(err)
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return dict(info.metadata)
    return {}


async def test_revisions_count_up_with_who_and_when(tmp_path: Path) -> None:
    """Create then update makes revisions 1 and 2, each with the caller and a time."""
    async with running_fleet(tmp_path) as (_, stub):
        created = await stub.CreateModel(
            fleet_pb2.CreateModelRequest(model=model()), metadata=(("x-llmgw-caller", "ada"),)
        )
        assert (created.model.revision, created.model.updated_by) == (1, "ada")
        assert created.model.etag and created.model.etag != "1"
        updated = await stub.UpdateModel(
            fleet_pb2.UpdateModelRequest(model=model(replicas=2), etag=created.model.etag),
            metadata=(("x-llmgw-caller", "bob"),),
        )
        assert updated.model.revision == 2
        history = await stub.ListModelRevisions(fleet_pb2.ListModelRevisionsRequest(name="qwen"))
        assert [(r.revision, r.updated_by) for r in history.revisions] == [(1, "ada"), (2, "bob")]
        assert (
            history.revisions[1].updated_at.seconds >= history.revisions[0].updated_at.seconds > 0
        )


async def test_stale_etag_is_aborted_and_changes_nothing(tmp_path: Path) -> None:
    """A write with an old etag is ABORTED with STALE_REVISION and the model stays as it was."""
    async with running_fleet(tmp_path) as (_, stub):
        created = await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model()))
        read = created.model.etag
        await stub.UpdateModel(fleet_pb2.UpdateModelRequest(model=model(replicas=2), etag=read))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.UpdateModel(fleet_pb2.UpdateModelRequest(model=model(replicas=5), etag=read))
        assert caught.value.code() is grpc.StatusCode.ABORTED
        assert reason_of(caught.value) == "STALE_REVISION"
        current = (await stub.GetModel(fleet_pb2.GetModelRequest(name="qwen"))).model.etag
        assert metadata_of(caught.value) == {
            "model": "qwen",
            "etag": read,
            "current_etag": current,
        }
        got = await stub.GetModel(fleet_pb2.GetModelRequest(name="qwen"))
        assert (got.model.revision, got.model.model.profiles[0].replicas) == (2, 2)


async def test_retry_with_the_same_request_id_returns_the_first_answer(tmp_path: Path) -> None:
    """A retried create with the same request id answers as the first did, writing once."""
    async with running_fleet(tmp_path) as (_, stub):
        first = await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model(), request_id="r1"))
        again = await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model(), request_id="r1"))
        assert again == first
        history = await stub.ListModelRevisions(fleet_pb2.ListModelRevisionsRequest(name="qwen"))
        assert len(history.revisions) == 1
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.DeleteModel(fleet_pb2.DeleteModelRequest(name="qwen", request_id="r1"))
        assert reason_of(caught.value) == "REQUEST_ID_REUSED"


async def test_a_request_id_sent_with_another_body_is_refused(tmp_path: Path) -> None:
    """The same request id with another body is ALREADY_EXISTS with REQUEST_ID_REUSED naming
    the id, and changes nothing; the first body's retry still gets the first answer."""
    async with running_fleet(tmp_path) as (_, stub):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model()))
        first = await stub.UpdateModel(
            fleet_pb2.UpdateModelRequest(model=model(replicas=2), request_id="r2")
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.UpdateModel(
                fleet_pb2.UpdateModelRequest(model=model(replicas=3), request_id="r2")
            )
        assert caught.value.code() is grpc.StatusCode.ALREADY_EXISTS
        assert reason_of(caught.value) == "REQUEST_ID_REUSED"
        assert metadata_of(caught.value)["request_id"] == "r2"
        got = await stub.GetModel(fleet_pb2.GetModelRequest(name="qwen"))
        assert (got.model.revision, got.model.model.profiles[0].replicas) == (2, 2)
        again = await stub.UpdateModel(
            fleet_pb2.UpdateModelRequest(model=model(replicas=2), request_id="r2")
        )
        assert again == first


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (common_pb2.Model(name="Bad Name!"), "INVALID_MODEL"),
        (model(replicas=-1), "INVALID_MODEL"),
        (model(replicas=100_000), "INVALID_MODEL"),
    ],
)
async def test_bad_models_are_refused(tmp_path: Path, bad: common_pb2.Model, reason: str) -> None:
    """Malformed names and absurd numbers are INVALID_ARGUMENT and nothing is stored."""
    async with running_fleet(tmp_path) as (_, stub):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.CreateModel(fleet_pb2.CreateModelRequest(model=bad))
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert reason_of(caught.value) == reason
        assert not (await stub.ListModels(fleet_pb2.ListModelsRequest())).models


async def test_missing_model_is_not_found(tmp_path: Path) -> None:
    """Reading, updating or deleting an unknown model is NOT_FOUND with MODEL_NOT_FOUND."""
    async with running_fleet(tmp_path) as (_, stub):
        for call in (
            stub.GetModel(fleet_pb2.GetModelRequest(name="nope")),
            stub.DeleteModel(fleet_pb2.DeleteModelRequest(name="nope")),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            assert caught.value.code() is grpc.StatusCode.NOT_FOUND
            assert reason_of(caught.value) == "MODEL_NOT_FOUND"


async def test_declared_models_are_read_only(tmp_path: Path) -> None:
    """A model from the settings file is listed, and changing it names the file."""
    settings = tmp_path / "cluster.yaml"
    settings.write_text(
        "models:\n  - name: declared\n    source: hf://x/y\n    profiles:\n"
        "      - {name: gpu, engine: vllm, gpu_class: H100-80GB, gpus_per_node: 1, replicas: 0}\n"
    )
    async with running_fleet(tmp_path, settings=str(settings)) as (_, stub):
        got = await stub.GetModel(fleet_pb2.GetModelRequest(name="declared"))
        assert got.model.declared and got.model.declared_in == str(settings)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.DeleteModel(fleet_pb2.DeleteModelRequest(name="declared"))
        assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert reason_of(caught.value) == "MODEL_DECLARED"
        assert str(settings) in (caught.value.details() or "")


async def test_a_declared_pinned_model_keeps_one_revision_over_three_starts(
    tmp_path: Path,
) -> None:
    """A declared model with a pinned engine_version that did not change writes no revision
    when the fleet starts again: three starts, one revision, the version still there."""
    settings = tmp_path / "cluster.yaml"
    settings.write_text(
        "models:\n  - name: pinned\n    source: hf://Qwen/Qwen3-8B\n    profiles:\n"
        "      - {name: gpu, engine: vllm, gpu_class: H100-80GB, gpus_per_node: 1,"
        " engine_version: 0.11.0}\n"
    )
    for _start in range(3):
        async with running_fleet(tmp_path, settings=str(settings)) as (_, stub):
            got = await stub.GetModel(fleet_pb2.GetModelRequest(name="pinned"))
            assert got.model.model.profiles[0].engine_version == "0.11.0"
    async with running_fleet(tmp_path, settings=str(settings)) as (_, stub):
        history = await stub.ListModelRevisions(fleet_pb2.ListModelRevisionsRequest(name="pinned"))
        assert [r.revision for r in history.revisions] == [1]


async def test_a_request_id_replayed_after_its_model_was_deleted_is_not_answered_created(
    tmp_path: Path,
) -> None:
    """A create retried with its first request id after the model was deleted is not given
    the stored "created" answer of a model that is gone: it is a new create, and the model
    is there afterwards; a restart does not bring the old answer back."""
    async with running_fleet(tmp_path) as (_, stub):
        first = await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model(), request_id="r1"))
        assert first.model.revision == 1
        await stub.DeleteModel(fleet_pb2.DeleteModelRequest(name="qwen"))
    async with running_fleet(tmp_path) as (_, stub):
        again = await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model(), request_id="r1"))
        assert again.model.revision == 3
        got = await stub.GetModel(fleet_pb2.GetModelRequest(name="qwen"))
        assert (got.model.revision, got.model.deleted) == (3, False)
        # The new answer is the id's answer now: a retry of it is replayed, writing nothing.
        retried = await stub.CreateModel(
            fleet_pb2.CreateModelRequest(model=model(), request_id="r1")
        )
        assert retried == again
        history = await stub.ListModelRevisions(fleet_pb2.ListModelRevisionsRequest(name="qwen"))
        assert [(r.revision, r.deleted) for r in history.revisions] == [
            (1, False),
            (2, True),
            (3, False),
        ]


def bad_request_field(err: grpc.aio.AioRpcError) -> str:
    """The field BadRequest names in a refusal ("" when it has none)."""
    status = rpc_status.from_call(err)
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            return str(bad.field_violations[0].field)
    return ""


@pytest.mark.parametrize("engine", ["llamacp", "llama.cpp", "VLLM", "vllm; rm -rf /"])
async def test_an_engine_the_registry_does_not_know_is_refused(tmp_path: Path, engine: str) -> None:
    """CreateModel and UpdateModel of a profile whose engine is not a registered name (a typo,
    an alias the agents do not run) are INVALID_ARGUMENT UNKNOWN_ENGINE naming the field and
    the engines known; nothing is written."""
    async with running_fleet(tmp_path) as (_, stub):
        bad = model()
        bad.profiles[0].engine = engine
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.CreateModel(fleet_pb2.CreateModelRequest(model=bad))
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert reason_of(caught.value) == "UNKNOWN_ENGINE"
        assert bad_request_field(caught.value) == "model.profiles[0].engine"
        known = metadata_of(caught.value)["known"].split(",")
        assert {"vllm", "llamacpp", "sglang", "trtllm"} <= set(known)
        assert not (await stub.ListModels(fleet_pb2.ListModelsRequest())).models
        created = await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model()))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.UpdateModel(fleet_pb2.UpdateModelRequest(model=bad))
        assert reason_of(caught.value) == "UNKNOWN_ENGINE"
        got = await stub.GetModel(fleet_pb2.GetModelRequest(name="qwen"))
        assert (got.model.revision, got.model.etag) == (1, created.model.etag)
