"""A profile's arguments never pin another Hugging Face revision than its source: CreateModel
and UpdateModel refuse it with BadRequest naming the args (a real fleet, no agents)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2
from tests.support.fleet import running_fleet

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def model(source: str, engine: str, args: list[str]) -> common_pb2.Model:
    """A one-profile model of `engine` with `args`."""
    return common_pb2.Model(
        name="pinned",
        source=source,
        context_length=4096,
        profiles=[
            common_pb2.Profile(
                name="gpu", engine=engine, args=args, gpu_class="H100-80GB", gpus_per_node=1
            )
        ],
    )


def refusal(err: grpc.aio.AioRpcError) -> tuple[str, list[str]]:
    """The ErrorInfo reason and the BadRequest fields of a refusal."""
    status = rpc_status.from_call(err)
    assert status is not None
    reason, fields = "", []
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason = info.reason
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            fields = [v.field for v in bad.field_violations]
    return reason, fields


@pytest.mark.parametrize(
    ("engine", "args"),
    [
        ("vllm", ["--max-model-len", "4096", "--revision", "main"]),
        ("vllm", ["--revision=v2"]),
        ("vllm", ["--revis", "main"]),
        ("sglang", ["--revision", "deadbeef"]),
        ("trtllm", ["--revision", "main"]),
    ],
)
async def test_a_revision_in_the_args_other_than_the_pin_is_refused(
    tmp_path: Path, engine: str, args: list[str]
) -> None:
    """CreateModel of `hf://org/model@COMMIT` whose args pin another revision (in any spelling
    the engine reads) is INVALID_MODEL naming model.profiles[0].args, and nothing is stored."""
    async with running_fleet(tmp_path) as (_fleet, stub):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.CreateModel(
                fleet_pb2.CreateModelRequest(model=model(f"hf://org/model@{COMMIT}", engine, args))
            )
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert refusal(caught.value) == ("INVALID_MODEL", ["model.profiles[0].args"])
        assert COMMIT in (caught.value.details() or "")
        listed = await stub.ListModels(fleet_pb2.ListModelsRequest())
        assert not listed.models


async def test_update_refuses_a_revision_the_source_does_not_pin(tmp_path: Path) -> None:
    """The pin itself in the args is accepted; an UpdateModel to a revision in the args beside
    an unpinned source is refused, the stored model unchanged."""
    async with running_fleet(tmp_path) as (_fleet, stub):
        ok = model(f"hf://org/model@{COMMIT}", "vllm", ["--revision", COMMIT])
        created = await stub.CreateModel(fleet_pb2.CreateModelRequest(model=ok))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.UpdateModel(
                fleet_pb2.UpdateModelRequest(
                    model=model("hf://org/model", "vllm", ["--revision", COMMIT])
                )
            )
        assert refusal(caught.value) == ("INVALID_MODEL", ["model.profiles[0].args"])
        assert f"hf://ORG/NAME@{COMMIT}" in (caught.value.details() or "")
        got = await stub.GetModel(fleet_pb2.GetModelRequest(name="pinned"))
        assert got.model.revision == created.model.revision
        assert got.model.model.source == f"hf://org/model@{COMMIT}"
