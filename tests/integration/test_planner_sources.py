"""The planner reading real sources over the network edge: a sparse 40 GB GGUF served by byte
ranges (header only), and Hugging Face repos through an HF-shaped endpoint."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from llmgw.common.v1 import common_pb2
from llmgw.planner.v1 import planner_pb2
from llmgw.testing.hub import HFServer
from llmgw.testing.range_server import RangeServer
from tests.support.gguf_files import llama_tensors, tokenizer_kv, write_gguf
from tests.support.hf_repos import LLAMA_1B
from tests.support.planner import running_planner

pytest_plugins = ("tests.support.hf_fixtures",)

H100 = common_pb2.Inventory(
    nodes=[
        common_pb2.InventoryNode(
            name="n1", gpu_class="H100-80GB", gpus=8, free_gpus=8, gpu_memory_bytes=81559 << 20
        )
    ]
)


def llama_gguf(path: Path) -> int:
    """A Llama-3.1-8B-shaped GGUF header with a 32k-token vocabulary, padded sparsely to
    40 GB; returns the header's bytes."""
    written = write_gguf(
        path,
        arch="llama",
        block_count=32,
        n_embd=4096,
        n_head=32,
        n_head_kv=8,
        context_length=131_072,
        extra_kv=tokenizer_kv(32_000),
        tensors=llama_tensors(
            block_count=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14_336, n_vocab=32_000
        ),
        pad_to_bytes=40 * 10**9,
    )
    return written.header_bytes


def reason_of(err: grpc.aio.AioRpcError) -> str:
    """The ErrorInfo reason of a refusal."""
    status = rpc_status.from_call(err)
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            detail.Unpack(info)
    return str(info.reason)


async def test_gguf_over_ranges_costs_about_its_header(
    tmp_path: Path, range_server: RangeServer
) -> None:
    """DescribeModel and SizeContext on a 40 GB GGUF fetch about its header, once (cached)."""
    header = llama_gguf(tmp_path / "llama.gguf")
    url = range_server.url("llama.gguf")
    model = common_pb2.Model(
        name="llama",
        source=url,
        context_length=8192,
        profiles=[
            common_pb2.Profile(
                name="gguf",
                engine="llamacpp",
                args=["-c", "8192", "-np", "1", "-ngl", "99"],
                gpu_class="H100-80GB",
                gpus_per_node=1,
            )
        ],
    )
    async with running_planner() as (_, stub, _ch):
        described = await stub.DescribeModel(planner_pb2.DescribeModelRequest(source=url))
        sized = await stub.SizeContext(
            planner_pb2.SizeContextRequest(model=model, tokens=32_768, slots=2, inventory=H100)
        )
    range_server.wait_idle()
    served = range_server.served_bytes("llama.gguf")
    assert served <= 1.25 * header, (served, header)
    shape = described.shape
    assert (shape.layers, shape.attention_heads, shape.kv_heads, shape.head_dim_k) == (
        32,
        32,
        8,
        128,
    )
    assert shape.kv_bytes_per_token == 131_072
    assert shape.trained_context == 131_072
    assert list(sized.profiles[0].args) == ["-c", "65536", "-np", "2", "-ngl", "99"]
    # 2 slots of 32768 cells each (per-slot cache), 131072 B a cell: exactly 8 GiB of KV.
    assert sized.change.profiles[0].memory.kv_bytes == 65_536 * 131_072
    assert sized.llamacpp_version


async def test_truncated_gguf_is_invalid_argument(
    tmp_path: Path, range_server: RangeServer
) -> None:
    """A GGUF cut inside its header is INVALID_SHAPE for DescribeModel and SizeContext."""
    llama_gguf(tmp_path / "full.gguf")
    with (tmp_path / "full.gguf").open("rb") as full:
        (tmp_path / "cut.gguf").write_bytes(full.read(5000))
    url = range_server.url("cut.gguf")
    async with running_planner() as (_, stub, _ch):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.DescribeModel(planner_pb2.DescribeModelRequest(source=url))
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert reason_of(caught.value) == "INVALID_SHAPE"


async def test_unreachable_source_goes_ahead_with_a_note(tmp_path: Path) -> None:
    """A source that does not answer leaves SizeContext to change the args, saying memory was
    not checked; DescribeModel refuses it as SOURCE_UNREACHABLE."""
    url = "http://127.0.0.1:9/missing.gguf"
    model = common_pb2.Model(
        name="gone",
        source=url,
        profiles=[common_pb2.Profile(name="p", engine="vllm", gpu_class="H100-80GB")],
    )
    async with running_planner() as (_, stub, _ch):
        sized = await stub.SizeContext(planner_pb2.SizeContextRequest(model=model, tokens=4096))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.DescribeModel(planner_pb2.DescribeModelRequest(source=url))
    assert list(sized.profiles[0].args) == ["--max-model-len", "4096"]
    assert "not checked" in sized.change.note
    assert reason_of(caught.value) == "SOURCE_UNREACHABLE"


async def test_hf_repo_through_the_endpoint(hf_server: HFServer) -> None:
    """An hf:// model is sized from its config and safetensors weights via HF_ENDPOINT."""
    model = common_pb2.Model(
        name="llama-1b",
        source=f"hf://{LLAMA_1B}",
        context_length=8192,
        profiles=[
            common_pb2.Profile(
                name="gpu",
                engine="vllm",
                args=["--max-model-len", "8192"],
                gpu_class="H100-80GB",
                gpus_per_node=1,
            )
        ],
    )
    async with running_planner() as (_, stub, _ch):
        described = await stub.DescribeModel(
            planner_pb2.DescribeModelRequest(source=f"hf://{LLAMA_1B}")
        )
        sized = await stub.SizeContext(
            planner_pb2.SizeContextRequest(model=model, tokens=65_536, inventory=H100)
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SizeContext(
                planner_pb2.SizeContextRequest(model=model, tokens=200_000, inventory=H100)
            )
    shape = described.shape
    # Llama-3.2-1B: 16 layers × 8 KV heads × 64 × 2 (K, V) × 2 B = 32,768 B a token.
    assert (shape.layers, shape.kv_heads, shape.head_dim_k) == (16, 8, 64)
    assert shape.kv_bytes_per_token == 32_768
    assert shape.trained_context == 131_072
    assert shape.weights_bytes > 2_000_000_000
    assert sized.change.trained == 131_072
    assert sized.change.profiles[0].memory.weights_bytes == shape.weights_bytes
    assert reason_of(caught.value) == "CONTEXT_OVER_TRAINED"
