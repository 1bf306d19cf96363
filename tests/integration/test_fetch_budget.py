"""The planner's fetches against a hostile Hub and hostile GGUF files, through the RPC: a
resolution stops at its byte, file and item budgets with LIMIT_EXCEEDED naming the limit,
declared lengths are refused before they are read, and an index past the budget never
reaches the Hugging Face cache."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from gguf import GGUFValueType
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from llmgw.planner.v1 import planner_pb2
from llmgw.rpc.status import error_info
from llmgw.testing.content import Content, SparseFile, safetensors_file
from llmgw.testing.hub import HFServer
from planner_svc.sources.budget import DEFAULT_FETCH_LIMITS
from tests.support.gguf_files import raw_prefix, raw_string
from tests.support.gguf_hostile import ARCH_KV, raw_kv
from tests.support.hf_repos import config_bytes
from tests.support.planner import running_planner

pytest_plugins = ("tests.support.hf_fixtures",)

REPO = "hostile/many-shards"
SHARDS = 100


def _info(err: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    status = rpc_status.from_call(err)
    assert status is not None, err.details()
    info = error_info(status)
    assert info is not None
    return info


async def _describe(source: str) -> grpc.aio.AioRpcError:
    """DescribeModel of `source` on a fresh planner; the refusal it must answer."""
    async with running_planner() as (_server, stub, _channel):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.DescribeModel(planner_pb2.DescribeModelRequest(source=source), timeout=60)
    return caught.value


def _shards_repo(header_pad_bytes: int) -> dict[str, Content]:
    """A repo whose index names 100 shards, each a safetensors file whose header is padded
    (in its __metadata__) to about `header_pad_bytes`."""
    shard = safetensors_file(
        {"w": ("BF16", [1024, 1024])}, metadata={"pad": "x" * header_pad_bytes}
    )
    names = [f"model-{i:05d}-of-{SHARDS:05d}.safetensors" for i in range(1, SHARDS + 1)]
    index = {"metadata": {"total_size": SHARDS * 2 << 20}, "weight_map": {n: n for n in names}}
    files: dict[str, Content] = {
        "config.json": config_bytes("meta-llama__Llama-3.2-1B-Instruct"),
        "model.safetensors.index.json": json.dumps(index).encode(),
    }
    files.update({name: shard for name in names})
    return files


def _requested_bytes(server: HFServer) -> int:
    """The bytes the planner asked the CDN for, by its Range headers."""
    total = 0
    for request in server.requests:
        if request.listener == "cdn" and request.range_header.startswith("bytes="):
            first, _, last = request.range_header.removeprefix("bytes=").partition("-")
            total += int(last) - int(first) + 1
    return total


async def test_hundred_shards_with_big_headers_stop_at_the_byte_budget(
    hf_server_factory: Callable[..., HFServer],
) -> None:
    """A repo of 100 shards with 3 MB headers (300 MB to read) is refused LIMIT_EXCEEDED
    (max_fetch_bytes) once the default 64 MiB budget is spent; the planner asks for no more
    than the budget, however many headers it reads at once."""
    server = hf_server_factory({REPO: _shards_repo(3 << 20)})
    err = await _describe(f"hf://{REPO}")
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, err.details()
    info = _info(err)
    assert (info.reason, info.metadata["limit"]) == ("LIMIT_EXCEEDED", "max_fetch_bytes")
    assert info.metadata["maximum"] == str(DEFAULT_FETCH_LIMITS.max_fetch_bytes)
    asked = _requested_bytes(server)
    assert asked <= DEFAULT_FETCH_LIMITS.max_fetch_bytes


async def test_shard_count_past_the_file_budget_is_refused_before_any_shard(
    hf_server_factory: Callable[..., HFServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With LLMGW_PLANNER_MAX_FETCH_FILES=16, an index of 100 shards is refused
    (max_fetch_files) before a single shard header is asked for."""
    monkeypatch.setenv("LLMGW_PLANNER_MAX_FETCH_FILES", "16")
    server = hf_server_factory({REPO: _shards_repo(16)})
    info = _info(await _describe(f"hf://{REPO}"))
    assert (info.reason, info.metadata["limit"]) == ("LIMIT_EXCEEDED", "max_fetch_files")
    assert info.metadata["maximum"] == "16"
    assert server.count(listener="cdn", path="/blobs/") == 0


async def test_huge_index_is_refused_and_never_cached(
    hf_server_factory: Callable[..., HFServer], tmp_path: Path
) -> None:
    """A 300 MB model.safetensors.index.json is refused by its declared size (max_fetch_bytes)
    and nothing of it is written under HF_HOME."""
    files: dict[str, Content] = {
        "config.json": config_bytes("meta-llama__Llama-3.2-1B-Instruct"),
        "model.safetensors.index.json": SparseFile(b'{"weight_map": {', 300 << 20),
    }
    hf_server_factory({"hostile/huge-index": files})
    info = _info(await _describe("hf://hostile/huge-index"))
    assert (info.reason, info.metadata["limit"]) == ("LIMIT_EXCEEDED", "max_fetch_bytes")
    cached = [p.name for p in tmp_path.rglob("*") if p.is_file()]
    assert not any("index" in name for name in cached), cached
    big = [p for p in tmp_path.rglob("*") if p.is_file() and p.stat().st_size > 1 << 20]
    assert big == []


def _sparse_gguf(path: Path, head: bytes, size: int) -> Path:
    """`head` then zeros up to `size` bytes, written sparse (no disk taken by the zeros)."""
    with path.open("wb") as out:
        out.write(head)
        out.truncate(size)
    return path


async def test_huge_gguf_string_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GGUF whose one string declares 200 MiB (under the 256 MiB header ceiling) is refused
    by its declared length against the 64 MiB budget (max_fetch_bytes), from a file that
    holds the 200 MiB (so only the budget stops it)."""
    monkeypatch.setenv("LLMGW_PLANNER_ALLOW_ROOTS", str(tmp_path))
    head = (
        raw_prefix(kv_count=2)
        + ARCH_KV
        + raw_kv("general.name", GGUFValueType.STRING, struct.pack("<Q", 200 << 20))
    )
    path = _sparse_gguf(tmp_path / "bomb.gguf", head, len(head) + (201 << 20))
    info = _info(await _describe(str(path)))
    assert (info.reason, info.metadata["limit"]) == ("LIMIT_EXCEEDED", "max_fetch_bytes")


async def test_millions_of_empty_gguf_strings_are_refused_by_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An array of 5 million empty strings (40 MB, within the byte budget) is refused by its
    declared count (max_header_items) before the first one is walked."""
    monkeypatch.setenv("LLMGW_PLANNER_ALLOW_ROOTS", str(tmp_path))
    count = 5_000_000
    head = (
        raw_prefix(kv_count=2)
        + ARCH_KV
        + raw_string("tokenizer.ggml.tokens")
        + struct.pack("<IIQ", GGUFValueType.ARRAY, GGUFValueType.STRING, count)
    )
    path = _sparse_gguf(tmp_path / "empties.gguf", head, len(head) + 8 * count + 64)
    info = _info(await _describe(str(path)))
    assert (info.reason, info.metadata["limit"]) == ("LIMIT_EXCEEDED", "max_header_items")
    assert info.metadata["count"] == str(count)
