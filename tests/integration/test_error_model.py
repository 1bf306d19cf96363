"""One error model at every edge, over real channels: malformed and oversized bytes, the size
limits, needs that would overflow the contract's fields, checks made before any fetch, and a
planner failure the fleet does not pass on as a refusal."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from llmgw.agent.v1 import agent_pb2
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2
from llmgw.limits import Limits
from llmgw.planner.v1 import planner_pb2, planner_pb2_grpc
from llmgw.rpc.intake import core_limit
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.range_server import RangeServer
from planner_svc.server import start_planner
from planner_svc.sources.policy import ENV_HOSTS
from tests.support.fleet import running_fleet
from tests.support.gguf_files import write_gguf
from tests.support.planner import running_planner
from tests.support.shapes import LLAMA_31_8B, inline
from tests.support.shapes import llama_8b_model as gpu_model

LLAMA_8B = inline(LLAMA_31_8B)
H100 = common_pb2.Inventory(
    nodes=[
        common_pb2.InventoryNode(
            name="n1", gpu_class="H100-80GB", gpus=8, free_gpus=8, gpu_memory_bytes=81559 << 20
        )
    ]
)
# The largest inline shape the contract's checks let through (llmgw/rpc/common.py's
# ceilings): at 2^24 tokens its KV cache is ~2^72 bytes, past int64.
HUGE = common_pb2.ModelShape(
    layers=4096,
    attention_heads=65_536,
    kv_heads=65_536,
    head_dim_k=65_536,
    trained_context=1 << 24,
    weights_bytes=1 << 50,
)


def info_of(err: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo of a refusal (None when it carries none)."""
    status = rpc_status.from_call(err)
    for detail in status.details if status is not None else ():
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info
    return None


def raw_method(channel: grpc.aio.Channel, method: str) -> Any:
    """A unary method of `channel` that sends and returns bytes as they are."""
    return channel.unary_unary(
        method, request_serializer=lambda b: b, response_deserializer=lambda b: b
    )


# -- the request's bytes ----------------------------------------------------------------------

GARBAGE = [
    pytest.param(b"\xff\xff\xff\xff", id="bad-tag"),
    pytest.param(b"\x0a\x80\x80\x80\x80\x80\x01", id="length-past-the-end"),
    pytest.param(b"\x12\x05abc", id="truncated-field"),
]


@pytest.mark.parametrize("garbage", GARBAGE)
async def test_bytes_that_do_not_parse_are_invalid_argument_on_the_planner(
    garbage: bytes,
) -> None:
    """Bytes that are not a SizeContextRequest answer INVALID_ARGUMENT MALFORMED_MESSAGE with
    the planner's domain and the message type named, not gRPC's UNKNOWN."""
    async with running_planner() as (_server, _stub, channel):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await raw_method(channel, "/llmgw.planner.v1.PlannerService/SizeContext")(garbage)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    info = info_of(caught.value)
    assert info is not None
    assert (info.reason, info.domain) == ("MALFORMED_MESSAGE", "planner.llmgw.dev")
    assert info.metadata["message_type"] == "llmgw.planner.v1.SizeContextRequest"


async def test_bytes_that_do_not_parse_are_invalid_argument_on_the_fleet_and_its_streams(
    tmp_path: Path,
) -> None:
    """The fleet refuses garbage the same way on a unary call, on WatchReplicas (a stream's
    request) and inside the agents' Connect stream."""
    async with running_fleet(tmp_path) as (fleet, _stub):
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{fleet.port}")
        try:
            for method in (
                "/llmgw.fleet.v1.FleetService/GetModel",
                "/llmgw.fleet.v1.FleetService/ListModels",
            ):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await raw_method(channel, method)(b"\xff\xff\xff\xff")
                assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT, method
                info = info_of(caught.value)
                assert info is not None
                assert (info.reason, info.domain) == ("MALFORMED_MESSAGE", "fleet.llmgw.dev")
            watch = channel.unary_stream(
                "/llmgw.fleet.v1.FleetService/WatchReplicas",
                request_serializer=lambda b: b,
                response_deserializer=lambda b: b,
            )
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in watch(b"\xff\xff"):
                    pass
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            info = info_of(caught.value)
            assert info is not None and info.reason == "MALFORMED_MESSAGE"

            async def garbage() -> AsyncIterator[bytes]:
                yield b"\xff\xff\xff\xff"

            connect = channel.stream_stream(
                "/llmgw.agent.v1.AgentService/Connect",
                request_serializer=lambda b: b,
                response_deserializer=agent_pb2.ConnectResponse.FromString,
            )
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in connect(garbage()):
                    pass
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            info = info_of(caught.value)
            assert info is not None
            assert info.metadata["message_type"] == "llmgw.agent.v1.ConnectRequest"
        finally:
            await channel.close()


async def test_a_request_past_the_byte_limit_names_the_limit() -> None:
    """A request past max_message_bytes is RESOURCE_EXHAUSTED MESSAGE_TOO_LARGE naming the
    limit, its maximum and the request's size; past gRPC core's own limit (twice ours, at
    least 16 MiB) core refuses it itself (RESOURCE_EXHAUSTED, no ErrorInfo), as
    docs/errors.md says."""
    limits = Limits(max_message_bytes=64 << 10, max_arg_bytes=32 << 20)
    server = await start_planner("127.0.0.1:0", limits=limits)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    stub = planner_pb2_grpc.PlannerServiceStub(channel)
    try:
        small = planner_pb2.SizeContextRequest(model=gpu_model(), tokens=16_384, inventory=H100)
        answer = await stub.SizeContext(small)
        assert answer.change.after == 16_384
        for extra, has_info in ((100 << 10, True), (8 << 20, True), (core_limit(limits), False)):
            big = gpu_model()
            big.profiles[0].args.extend(["--served-model-name", "x" * extra])
            request = planner_pb2.SizeContextRequest(model=big, tokens=16_384, inventory=H100)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.SizeContext(request)
            assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            info = info_of(caught.value)
            if not has_info:
                assert info is None
                continue
            assert info is not None and info.reason == "MESSAGE_TOO_LARGE"
            assert info.metadata["limit"] == "max_message_bytes"
            assert info.metadata["maximum"] == str(64 << 10)
            assert info.metadata["count"] == str(request.ByteSize())
    finally:
        await channel.close()
        await server.stop(grace_s=1.0)


async def test_the_default_limit_refuses_five_mebibytes_with_details() -> None:
    """With the default limits a 5 MiB request (past gRPC's own 4 MiB default, the issue's
    case) is refused with ErrorInfo naming the 1 MiB limit, not core's bare
    RESOURCE_EXHAUSTED."""
    async with running_planner() as (_server, stub, _channel):
        big = gpu_model()
        big.profiles[0].args.extend(["--served-model-name", "x" * (5 << 20)])
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SizeContext(planner_pb2.SizeContextRequest(model=big, tokens=16_384))
    info = info_of(caught.value)
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert info is not None and info.reason == "MESSAGE_TOO_LARGE"
    assert info.metadata["maximum"] == str(1 << 20)


# -- the count limits -------------------------------------------------------------------------


def _bare_profiles(n: int) -> list[common_pb2.Profile]:
    """`n` profiles with a name only: 60,000 of them fit under the byte limit."""
    return [common_pb2.Profile(name=f"p{i}") for i in range(n)]


def _profiles(n: int) -> list[common_pb2.Profile]:
    return [
        common_pb2.Profile(name=f"p{i}", engine="vllm", gpu_class="H100-80GB", gpus_per_node=1)
        for i in range(n)
    ]


@pytest.mark.parametrize(
    ("model", "limit", "field", "count"),
    [
        pytest.param(gpu_model(profiles=_profiles(65)), "max_profiles", "model.profiles", 65),
        pytest.param(
            gpu_model(profiles=_bare_profiles(60_000)), "max_profiles", "model.profiles", 60_000
        ),
        pytest.param(
            gpu_model(
                profiles=[
                    common_pb2.Profile(
                        name="gpu", engine="vllm", gpu_class="H100-80GB", args=["-x"] * 257
                    )
                ]
            ),
            "max_args",
            "model.profiles[0].args",
            257,
        ),
        pytest.param(
            gpu_model(
                profiles=[
                    common_pb2.Profile(
                        name="gpu", engine="vllm", gpu_class="H100-80GB", args=["y" * 70_000]
                    )
                ]
            ),
            "max_arg_bytes",
            "model.profiles[0].args[0]",
            70_000,
        ),
    ],
    ids=["65-profiles", "60000-profiles", "257-args", "70k-arg"],
)
async def test_counts_past_a_limit_are_refused_naming_it(
    model: common_pb2.Model, limit: str, field: str, count: int
) -> None:
    """Profiles, arguments and an argument's length past the limits are INVALID_ARGUMENT
    LIMIT_EXCEEDED with the limit named, its maximum and the count, as strings; 60,000
    profiles are refused as early as 65."""
    maximum = getattr(Limits(), limit)
    async with running_planner() as (_server, stub, _channel):
        for call in (
            stub.SizeContext(planner_pb2.SizeContextRequest(model=model, tokens=16_384)),
            stub.PlanGPUs(planner_pb2.PlanGPUsRequest(model=model, gpus=2)),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            info = info_of(caught.value)
            assert info is not None and info.reason == "LIMIT_EXCEEDED"
            assert dict(info.metadata) == {
                "field": field,
                "limit": limit,
                "maximum": str(maximum),
                "count": str(count),
            }


async def test_the_fleet_refuses_a_model_past_its_limits(tmp_path: Path) -> None:
    """CreateModel of 65 profiles is the fleet's LIMIT_EXCEEDED, naming the limit, and
    nothing is written."""
    async with running_fleet(tmp_path) as (_fleet, stub):
        model = gpu_model(name="many", source="hf://org/many", profiles=_profiles(65))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model))
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        info = info_of(caught.value)
        assert info is not None
        assert (info.reason, info.domain) == ("LIMIT_EXCEEDED", "fleet.llmgw.dev")
        assert (info.metadata["limit"], info.metadata["maximum"]) == ("max_profiles", "64")
        listed = await stub.ListModels(fleet_pb2.ListModelsRequest())
        assert [m.model.name for m in listed.models] == []


# -- needs past the contract's fields --------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "inventory"),
    [
        pytest.param(
            common_pb2.Profile(name="cpu", engine="llamacpp", cpu_only=True), None, id="cpu"
        ),
        pytest.param(
            common_pb2.Profile(name="gpu", engine="vllm", gpu_class="H100-80GB", gpus_per_node=1),
            None,
            id="gpu-no-inventory",
        ),
    ],
)
async def test_a_need_past_any_machine_is_refused_not_internal(
    profile: common_pb2.Profile, inventory: common_pb2.Inventory | None
) -> None:
    """A huge inline shape at a long context (a need past int64) is INVALID_ARGUMENT
    MEMORY_OUT_OF_RANGE naming the profile and the ceiling, never INTERNAL; at 256 tokens the
    CPU profile is answered and the card one is CARDS_TOO_SMALL."""
    model = gpu_model(name="huge", shape=HUGE, profiles=[profile])
    async with running_planner() as (_server, stub, _channel):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SizeContext(
                planner_pb2.SizeContextRequest(
                    model=model, tokens=1 << 24, slots=64, inventory=inventory
                )
            )
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        info = info_of(caught.value)
        assert info is not None and info.reason == "MEMORY_OUT_OF_RANGE"
        assert info.metadata["profile"] == profile.name
        assert info.metadata["maximum_bytes"] == str(1 << 60)
        assert int(info.metadata["need_bytes"]) > 1 << 63
        short = planner_pb2.SizeContextRequest(model=model, tokens=256, inventory=inventory)
        if profile.cpu_only:
            assert (await stub.SizeContext(short)).change.after == 256
            return
        # On a card, 256 tokens of it still does not fit: a refusal with the need as a string.
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SizeContext(short)
        info = info_of(caught.value)
        assert info is not None and info.reason == "CARDS_TOO_SMALL"


async def test_a_dry_run_of_a_huge_shape_through_the_fleet_is_the_planner_s_refusal(
    tmp_path: Path,
) -> None:
    """The fleet's SetContext dry run of such a model passes the planner's refusal on
    (INVALID_ARGUMENT MEMORY_OUT_OF_RANGE, planner domain), not an INTERNAL."""
    async with (
        running_planner() as (planner, _p, _c),
        running_fleet(tmp_path, planner=f"127.0.0.1:{planner.port}") as (_fleet, stub),
    ):
        model = gpu_model(
            name="huge",
            source="hf://org/huge",
            shape=HUGE,
            profiles=[common_pb2.Profile(name="cpu", engine="llamacpp", cpu_only=True)],
        )
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SetContext(
                fleet_pb2.SetContextRequest(name="huge", tokens=1 << 24, slots=64, dry_run=True)
            )
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    info = info_of(caught.value)
    assert info is not None
    assert (info.reason, info.domain) == ("MEMORY_OUT_OF_RANGE", "planner.llmgw.dev")


class BrokenPlanner(planner_pb2_grpc.PlannerServiceServicer):
    """A planner whose SizeContext fails as a bug would: INTERNAL, no details."""

    async def SizeContext(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.INTERNAL, "Value out of range: 75557864908110299345715")

    async def PlanGPUs(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.INTERNAL, "Value out of range")

    async def DescribeModel(self, request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.INTERNAL, "Value out of range")


async def test_a_planner_failure_is_the_fleet_s_planner_failed(tmp_path: Path) -> None:
    """When the planner answers INTERNAL, the fleet's dry run answers its own INTERNAL with
    reason PLANNER_FAILED (fleet domain, the planner's code named), not the planner's status."""
    broken = grpc.aio.server()
    planner_pb2_grpc.add_PlannerServiceServicer_to_server(BrokenPlanner(), broken)
    port = broken.add_insecure_port("127.0.0.1:0")
    await broken.start()
    try:
        async with running_fleet(tmp_path, planner=f"127.0.0.1:{port}") as (_fleet, stub):
            model = gpu_model(name="llama", source="hf://org/llama")
            await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.SetContext(
                    fleet_pb2.SetContextRequest(name="llama", tokens=16_384, dry_run=True)
                )
    finally:
        await broken.stop(None)
    assert caught.value.code() is grpc.StatusCode.INTERNAL
    assert "Value out of range" not in (caught.value.details() or "")
    info = info_of(caught.value)
    assert info is not None
    assert (info.reason, info.domain) == ("PLANNER_FAILED", "fleet.llmgw.dev")
    assert info.metadata["planner_code"] == "INTERNAL"


# -- cheap checks before any fetch ------------------------------------------------------------


def tiny_gguf(path: Path) -> None:
    """A small llama-shaped GGUF header."""
    write_gguf(
        path,
        arch="llama",
        block_count=2,
        n_embd=256,
        n_head=4,
        n_head_kv=4,
        context_length=32_768,
        pad_to_bytes=1 << 20,
    )


async def test_a_bad_request_is_refused_before_its_slow_source_is_fetched(
    tmp_path: Path, range_server: RangeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tokens: 0`, a card count of 0, an unknown engine and 60,000 profiles are refused
    while the model's source stalls for a minute: each answer comes within a 20 s deadline and
    the source is never asked; a valid request then does fetch it."""
    monkeypatch.setenv(ENV_HOSTS, "127.0.0.1:*")
    tiny_gguf(tmp_path / "m.gguf")
    range_server.stall_s = 60.0
    url = range_server.url("m.gguf")
    cpu = [common_pb2.Profile(name="cpu", engine="llamacpp", args=["-c", "4096"], cpu_only=True)]
    gpu = [common_pb2.Profile(name="g", engine="vllm", gpu_class="H100-80GB", gpus_per_node=1)]
    odd = [common_pb2.Profile(name="x", engine="nope", gpu_class="H100-80GB")]
    model = common_pb2.Model(name="m", source=url, context_length=4096, profiles=cpu)
    async with running_planner() as (_server, stub, _channel):
        cases: list[tuple[Any, str]] = [
            (
                stub.SizeContext(planner_pb2.SizeContextRequest(model=model, tokens=0), timeout=20),
                "CONTEXT_TOO_SHORT",
            ),
            (
                stub.SizeContext(
                    planner_pb2.SizeContextRequest(model=model, tokens=4096, slots=65), timeout=20
                ),
                "SLOTS_OUT_OF_RANGE",
            ),
            (
                stub.PlanGPUs(
                    planner_pb2.PlanGPUsRequest(
                        model=gpu_model(name="m", source=url, profiles=gpu, shape=None), gpus=0
                    ),
                    timeout=20,
                ),
                "GPU_COUNT_OUT_OF_RANGE",
            ),
            (
                stub.PlanGPUs(planner_pb2.PlanGPUsRequest(model=model, gpus=2), timeout=20),
                "NO_GPU_PROFILE",
            ),
            (
                stub.SizeContext(
                    planner_pb2.SizeContextRequest(
                        model=common_pb2.Model(name="m", source=url, profiles=odd), tokens=4096
                    ),
                    timeout=20,
                ),
                "UNKNOWN_ENGINE",
            ),
            (
                stub.SizeContext(
                    planner_pb2.SizeContextRequest(
                        model=common_pb2.Model(
                            name="m", source=url, profiles=_bare_profiles(60_000)
                        ),
                        tokens=4096,
                    ),
                    timeout=20,
                ),
                "LIMIT_EXCEEDED",
            ),
        ]
        for call, reason in cases:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call
            info = info_of(caught.value)
            assert info is not None and info.reason == reason, caught.value.details()
        range_server.wait_idle()
        assert range_server.requests == []
        range_server.stall_s = 0.0
        answer = await stub.SizeContext(
            planner_pb2.SizeContextRequest(model=model, tokens=8192), timeout=20
        )
        assert answer.change.after == 8192
        assert range_server.requests, "the valid request reads the source"


async def test_garbage_after_hello_ends_an_agent_stream_invalid_argument(tmp_path: Path) -> None:
    """An agent stream whose Hello parses but whose next message does not ends with
    INVALID_ARGUMENT MALFORMED_MESSAGE, and the node's link is dropped."""
    hello = agent_pb2.ConnectRequest(
        hello=agent_pb2.Hello(
            node_name="node-g", cards=[common_pb2.Card(index=0, model="H100-80GB")]
        )
    )
    async with running_fleet(tmp_path) as (fleet, _stub):
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{fleet.port}")
        welcomed = asyncio.Event()

        async def messages() -> AsyncIterator[bytes]:
            yield hello.SerializeToString()
            await welcomed.wait()
            yield b"\xff\xff\xff\xff"
            await asyncio.Event().wait()  # the agent's side stays open

        connect = channel.stream_stream(
            "/llmgw.agent.v1.AgentService/Connect",
            request_serializer=lambda b: b,
            response_deserializer=agent_pb2.ConnectResponse.FromString,
        )
        try:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for msg in connect(messages()):
                    if msg.WhichOneof("msg") == "welcome":
                        welcomed.set()
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            info = info_of(caught.value)
            assert info is not None and info.reason == "MALFORMED_MESSAGE"
            await assert_eventually(
                lambda: "node-g" not in fleet.controller.state.links, what="link dropped"
            )
        finally:
            await channel.close()


@pytest.mark.parametrize(
    ("request_", "reason", "metadata"),
    [
        pytest.param(
            planner_pb2.SizeContextRequest(model=gpu_model(), tokens=(1 << 24) + 1),
            "CONTEXT_OVER_LIMIT",
            {"tokens": str((1 << 24) + 1), "maximum": str(1 << 24)},
            id="context-over-limit",
        ),
        pytest.param(
            planner_pb2.PlanGPUsRequest(
                model=gpu_model(
                    profiles=[common_pb2.Profile(name="cpu", engine="llamacpp", cpu_only=True)]
                ),
                gpus=2,
                profile="cpu",
            ),
            "PROFILE_ON_CPU",
            {"profile": "cpu"},
            id="profile-on-cpu",
        ),
        pytest.param(
            planner_pb2.PlanGPUsRequest(
                model=gpu_model(
                    profiles=[common_pb2.Profile(name="cpu", engine="llamacpp", cpu_only=True)]
                ),
                gpus=2,
            ),
            "NO_GPU_PROFILE",
            {"model": "llama-8b"},
            id="no-gpu-profile",
        ),
        pytest.param(
            planner_pb2.PlanGPUsRequest(model=gpu_model(), gpus=2000),
            "GPU_COUNT_OUT_OF_RANGE",
            {"gpus": "2000", "minimum": "1", "maximum": "1024"},
            id="gpu-count",
        ),
    ],
)
async def test_the_formerly_bare_reasons_carry_their_numbers(
    request_: Any, reason: str, metadata: dict[str, str]
) -> None:
    """CONTEXT_OVER_LIMIT, PROFILE_ON_CPU, NO_GPU_PROFILE and GPU_COUNT_OUT_OF_RANGE answer
    INVALID_ARGUMENT with their facts in ErrorInfo and the field named in BadRequest."""
    async with running_planner() as (_server, stub, _channel):
        call = (
            stub.SizeContext(request_)
            if isinstance(request_, planner_pb2.SizeContextRequest)
            else stub.PlanGPUs(request_)
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    info = info_of(caught.value)
    assert info is not None
    assert (info.reason, dict(info.metadata)) == (reason, metadata)
    status = rpc_status.from_call(caught.value)
    assert status is not None
    fields = []
    for detail in status.details:
        bad = error_details_pb2.BadRequest()
        if detail.Unpack(bad):
            fields = [v.field for v in bad.field_violations]
    assert fields == ["profile" if "PROFILE" in reason else request_field(reason)]


def request_field(reason: str) -> str:
    """The request field a refusal names."""
    return {"CONTEXT_OVER_LIMIT": "tokens", "GPU_COUNT_OUT_OF_RANGE": "gpus"}[reason]


async def test_the_fleet_s_bad_context_is_refused_before_the_planner_fetches(
    tmp_path: Path, range_server: RangeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SetContext `tokens: 0` through the fleet, its model's source stalling for a minute, is
    the planner's CONTEXT_TOO_SHORT within a 20 s deadline, and the source is never asked."""
    monkeypatch.setenv(ENV_HOSTS, "127.0.0.1:*")
    tiny_gguf(tmp_path / "m.gguf")
    range_server.stall_s = 60.0
    model = common_pb2.Model(
        name="m",
        source=range_server.url("m.gguf"),
        context_length=4096,
        profiles=[
            common_pb2.Profile(name="cpu", engine="llamacpp", args=["-c", "4096"], cpu_only=True)
        ],
    )
    async with (
        running_planner() as (planner, _p, _c),
        running_fleet(tmp_path / "fleet", planner=f"127.0.0.1:{planner.port}") as (_f, stub),
    ):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model))
        for dry_run in (True, False):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.SetContext(
                    fleet_pb2.SetContextRequest(name="m", tokens=0, dry_run=dry_run), timeout=20
                )
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            info = info_of(caught.value)
            assert info is not None
            assert (info.reason, info.domain) == ("CONTEXT_TOO_SHORT", "planner.llmgw.dev")
        range_server.wait_idle()
        assert range_server.requests == []
