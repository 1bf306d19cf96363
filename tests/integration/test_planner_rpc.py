"""The planner over real gRPC: answers, refusals with details, health, reflection, shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status
from structlog.testing import capture_logs

from llmgw.common.v1 import common_pb2
from llmgw.planner.v1 import planner_pb2
from llmgw.shape import ModelShape
from tests.support.planner import running_planner
from tests.support.shapes import LLAMA_31_8B, inline
from tests.support.shapes import llama_8b_model as llama_model

SERVICE = "llmgw.planner.v1.PlannerService"

# Llama-3.1-8B given inline (tests/support/shapes.py), so the planner reads no source.
LLAMA_8B = inline(LLAMA_31_8B)
INVENTORY = common_pb2.Inventory(
    nodes=[
        common_pb2.InventoryNode(
            name="n1", gpu_class="H100-80GB", gpus=8, free_gpus=8, gpu_memory_bytes=81559 << 20
        )
    ]
)


def error_info(err: grpc.aio.AioRpcError) -> tuple[error_details_pb2.ErrorInfo, list[Any]]:
    """The ErrorInfo of a refusal and all its unpacked details' type names."""
    status = rpc_status.from_call(err)
    assert status is not None, "the refusal carries a google.rpc.Status"
    info = error_details_pb2.ErrorInfo()
    names = []
    for detail in status.details:
        names.append(detail.TypeName())
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            detail.Unpack(info)
    return info, names


async def test_size_context_answers_args_and_memory_in_bytes() -> None:
    """SizeContext over gRPC rewrites vLLM's context flag and reports memory as numbers."""
    async with running_planner() as (_, stub, _ch):
        answer = await stub.SizeContext(
            planner_pb2.SizeContextRequest(model=llama_model(), tokens=32_768, inventory=INVENTORY)
        )
    change = answer.change
    assert (change.before, change.after, change.trained) == (8192, 32_768, 131_072)
    assert list(answer.profiles[0].args) == ["--max-model-len", "32768"]
    memory = change.profiles[0].memory
    assert memory.weights_bytes == 16_060_522_496
    assert memory.kv_bytes >= 32_768 * 131_072
    assert 0 < memory.per_card_bytes <= memory.budget_bytes
    assert memory.cards == 1
    assert answer.llamacpp_version


async def test_refusal_carries_reason_metadata_and_field() -> None:
    """A short context is INVALID_ARGUMENT with CONTEXT_TOO_SHORT and a BadRequest on tokens."""
    async with running_planner() as (_, stub, _ch):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SizeContext(planner_pb2.SizeContextRequest(model=llama_model(), tokens=100))
    err = caught.value
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    info, names = error_info(err)
    assert info.reason == "CONTEXT_TOO_SHORT"
    assert info.metadata["tokens"] == "100"
    assert "google.rpc.BadRequest" in names
    assert "256" in (err.details() or "")


async def test_plan_gpus_refuses_heads_with_the_counts_that_work() -> None:
    """PlanGPUs with 3 cards for 32/8 heads is HEADS_NOT_DIVISIBLE naming 1,2,4,8."""
    async with running_planner() as (_, stub, _ch):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.PlanGPUs(
                planner_pb2.PlanGPUsRequest(model=llama_model(), gpus=3, inventory=INVENTORY)
            )
        ok = await stub.PlanGPUs(
            planner_pb2.PlanGPUsRequest(model=llama_model(), gpus=2, inventory=INVENTORY)
        )
    info, _ = error_info(caught.value)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert info.reason == "HEADS_NOT_DIVISIBLE"
    assert info.metadata["valid_counts"] == "1,2,4,8"
    assert list(ok.profiles[0].args) == ["--max-model-len", "8192", "--tensor-parallel-size", "2"]
    assert ok.change.profiles[0].memory.cards == 2


async def test_bad_numbers_in_the_model_are_invalid_argument() -> None:
    """Negative counts and absurd inline shapes are INVALID_ARGUMENT, not a crash."""
    bad_profile = llama_model()
    bad_profile.profiles[0].gpus_per_node = -3
    bad_shape = llama_model()
    bad_shape.shape.layers = 10**9
    async with running_planner() as (_, stub, _ch):
        for model in (bad_profile, bad_shape):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.SizeContext(planner_pb2.SizeContextRequest(model=model, tokens=4096))
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT


class BrokenResolver:
    """A resolver that fails in a way the planner does not expect."""

    async def resolve(self, source: str, files: Any = (), *, caller: Any = "") -> ModelShape:
        """Fail."""
        raise RuntimeError("disk on fire")


async def test_unexpected_failure_is_internal_and_logged() -> None:
    """An unexpected exception answers INTERNAL with a generic message and logs the traceback."""
    async with running_planner(BrokenResolver()) as (_, stub, _ch):
        with capture_logs() as logs, pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.DescribeModel(planner_pb2.DescribeModelRequest(source="hf://a/b"))
    assert caught.value.code() is grpc.StatusCode.INTERNAL
    assert "disk on fire" not in (caught.value.details() or "")
    assert any(e["event"] == "request_failed" for e in logs)


async def test_health_serves_overall_and_per_service_then_drains() -> None:
    """Health is SERVING for "" and the service, NOT_SERVING once draining starts."""
    async with running_planner() as (server, _stub, channel):
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", SERVICE):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=name))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        await server.health.enter_graceful_shutdown()
        reply = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE))
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING


async def test_reflection_lists_services_and_describes_error_details() -> None:
    """grpcurl's view: reflection lists the planner and resolves google.rpc.ErrorInfo."""
    async with running_planner() as (_, _stub, channel):
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        requests = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="google.rpc.ErrorInfo"),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE),
        ]
        replies = [r async for r in stub.ServerReflectionInfo(iter(requests))]
    listed = {s.name for s in replies[0].list_services_response.service}
    assert {SERVICE, "grpc.health.v1.Health"} <= listed
    assert replies[1].file_descriptor_response.file_descriptor_proto
    assert replies[2].file_descriptor_response.file_descriptor_proto


def test_sigterm_stops_the_planner_gracefully() -> None:
    """`python -m planner_svc --listen 127.0.0.1:0` prints its port, and exits 0 on SIGTERM."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "planner_svc", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("planner listening on 127.0.0.1:")
        port = int(line.rsplit(":", 1)[1])
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=SERVICE), timeout=10
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


async def test_a_request_asked_again_gets_the_remembered_answer() -> None:
    """The same SizeContext asked twice is sized once and answered alike; another context is
    sized anew."""
    async with running_planner() as (_, stub, _ch):
        with capture_logs() as logs:
            first = await stub.SizeContext(
                planner_pb2.SizeContextRequest(
                    model=llama_model(), tokens=32_768, inventory=INVENTORY
                )
            )
            again = await stub.SizeContext(
                planner_pb2.SizeContextRequest(
                    model=llama_model(), tokens=32_768, inventory=INVENTORY
                )
            )
            other = await stub.SizeContext(
                planner_pb2.SizeContextRequest(
                    model=llama_model(), tokens=16_384, inventory=INVENTORY
                )
            )
    assert again == first
    assert other.change.after == 16_384
    assert [e["after"] for e in logs if e["event"] == "context_sized"] == [32_768, 16_384]


async def test_a_batch_asked_is_answered_over_the_wire() -> None:
    """`sequences` on SizeContext and PlanGPUs reaches the planner: the answer's args carry the
    engine's batch flag and `batches` says whether it fits and how many contexts are held."""
    async with running_planner() as (_, stub, _ch):
        sized = await stub.SizeContext(
            planner_pb2.SizeContextRequest(
                model=llama_model(), tokens=8192, inventory=INVENTORY, sequences=32
            )
        )
        planned = await stub.PlanGPUs(
            planner_pb2.PlanGPUsRequest(
                model=llama_model(), gpus=2, inventory=INVENTORY, sequences=32
            )
        )
    for answer in (sized, planned):
        (batch,) = answer.batches
        assert (batch.sequences, batch.flag, batch.engine) == (32, "--max-num-seqs", "vllm")
        assert batch.fits and batch.contexts_held >= 32
        assert "--max-num-seqs" in answer.profiles[0].args
    assert planned.batches[0].contexts_held > sized.batches[0].contexts_held
