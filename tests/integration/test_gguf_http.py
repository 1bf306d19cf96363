"""read_gguf_header against real GGUF files: sparse giants over HTTP ranges, local paths, and
every way a file or server can be wrong."""

from __future__ import annotations

import re
import struct
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

from llmgw.testing.range_server import RangeServer
from planner_svc.domain.errors import InvalidShape, SourceUnreachable
from planner_svc.domain.gguf_shape import shape_from_gguf
from planner_svc.sources.gguf_header import ArraySummary, GGUFHeader
from planner_svc.sources.gguf_http import read_gguf_header
from tests.support.gguf_files import (
    TensorSpec,
    WrittenGGUF,
    llama_tensors,
    tokenizer_kv,
    write_gguf,
)
from tests.support.gguf_hostile import HOSTILE_HEADERS

GB = 10**9
# The bound DESIGN.md §4 asks for: bytes fetched stay within a small factor of the header.
MAX_RATIO = 1.25


@dataclass(frozen=True)
class Geometry:
    """A model's size class: Llama-3.2-1B-like in Q4_0 for 1 GB, Llama-3.1-405B-like in Q6_K
    for 400 GB (tensor data ~0.85 GB and ~333 GB, padded up to the file size)."""

    file_bytes: int
    n_embd: int
    n_head: int
    n_ff: int
    block_count: int
    ggml_type: GGMLQuantizationType


SIZES = {
    "1GB": Geometry(1 * GB, 2048, 32, 8192, 16, GGMLQuantizationType.Q4_0),
    "400GB": Geometry(400 * GB, 16384, 128, 53248, 126, GGMLQuantizationType.Q6_K),
}
# Header size classes: (blocks of tensor infos written, vocabulary size, merges).
HEADERS = {"10KB": (1, 600, 0), "600KB": (None, 30_000, 0), "5MB": (None, 120_000, 100_000)}
HEADER_RANGES = {"10KB": (10_000, 30_000), "600KB": (400_000, 900_000), "5MB": (4 << 20, 9 << 20)}


def write_model(path: Path, size: str, header: str) -> WrittenGGUF:
    """A sparse GGUF of the size class with a header of the size class."""
    g = SIZES[size]
    blocks, n_tokens, merges = HEADERS[header]
    tensor_blocks = blocks or g.block_count
    return write_gguf(
        path,
        arch="llama",
        block_count=g.block_count,
        n_embd=g.n_embd,
        n_head=g.n_head,
        n_head_kv=8,
        context_length=131072,
        extra_kv={
            **tokenizer_kv(n_tokens, merges=merges),
            "llama.rope.dimension_count": g.n_embd // g.n_head,
            "general.name": f"test {size} {header}",
        },
        tensors=llama_tensors(
            block_count=tensor_blocks,
            n_embd=g.n_embd,
            n_head=g.n_head,
            n_head_kv=8,
            n_ff=g.n_ff,
            n_vocab=128256,
            ggml_type=g.ggml_type,
        ),
        pad_to_bytes=g.file_bytes,
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], WrittenGGUF]:
    """Every (size, header) combination, written once for the module."""
    folder = tmp_path_factory.mktemp("models")
    return {
        (size, header): write_model(folder / f"{size}-{header}.gguf", size, header)
        for size in SIZES
        for header in HEADERS
    }


@pytest.fixture
def server(models: dict[tuple[str, str], WrittenGGUF]) -> Iterator[RangeServer]:
    """A fresh range server over the module's models (fresh counts and switches)."""
    folder = next(iter(models.values())).path.parent
    with RangeServer(folder) as srv:
        yield srv


def requested_ends(server: RangeServer) -> list[int]:
    """The end (exclusive) of every byte range the server was asked for."""
    ends = []
    for request in server.requests:
        match = re.match(r"bytes=(\d+)-(\d+)", request.range_header)
        assert match, request
        ends.append(int(match.group(2)) + 1)
    return ends


@pytest.mark.parametrize("header", list(HEADERS))
@pytest.mark.parametrize("size", list(SIZES))
async def test_reads_only_the_header_of_a_sparse_file(
    models: dict[tuple[str, str], WrittenGGUF], server: RangeServer, size: str, header: str
) -> None:
    """Over HTTP only the header is fetched, within 1.25x its size, whatever the file's size."""
    written = models[(size, header)]
    lo, hi = HEADER_RANGES[header]
    assert lo <= written.header_bytes <= hi, "the case is not the header size it claims"

    got = await read_gguf_header(server.url(written.path.name))

    assert (got.header_bytes, got.tensor_bytes, got.file_bytes) == (
        written.header_bytes,
        written.tensor_bytes,
        written.file_bytes,
    )
    assert got.metadata["general.name"] == f"test {size} {header}"
    assert got.metadata["llama.block_count"] == SIZES[size].block_count
    assert got.metadata["tokenizer.ggml.tokens"] == ArraySummary(
        GGUFValueType.STRING, HEADERS[header][1]
    )
    server.wait_idle()
    assert got.bytes_fetched == server.served_bytes(written.path.name)
    assert got.bytes_fetched / got.header_bytes <= MAX_RATIO
    assert max(requested_ends(server)) <= MAX_RATIO * got.header_bytes
    assert all(r.status == 206 for r in server.requests)


async def test_shape_from_a_served_header(
    models: dict[tuple[str, str], WrittenGGUF], server: RangeServer
) -> None:
    """The header read over HTTP sizes the model: KV per token and weights from the tensors."""
    written = models[("400GB", "600KB")]
    got = await read_gguf_header(server.url(written.path.name))
    shape = shape_from_gguf(got.metadata, file_bytes=got.file_bytes, tensor_bytes=got.tensor_bytes)
    # 126 layers x 8 KV heads x (128 + 128) x 2 B = 516,096 B/token (Llama-3.1-405B).
    assert shape.kv_bytes_per_token() == 516_096
    assert shape.weights_bytes == written.tensor_bytes > 300 * GB


@pytest.mark.parametrize("header", list(HEADERS))
async def test_local_path_and_file_url(
    models: dict[tuple[str, str], WrittenGGUF], header: str
) -> None:
    """A local path and a file:// URL read the same header, header-only."""
    written = models[("400GB", header)]
    by_path = await read_gguf_header(str(written.path))
    by_url = await read_gguf_header(written.path.as_uri())
    assert by_path == by_url
    assert (by_path.header_bytes, by_path.tensor_bytes, by_path.file_bytes) == (
        written.header_bytes,
        written.tensor_bytes,
        written.file_bytes,
    )
    assert by_path.bytes_fetched / by_path.header_bytes <= MAX_RATIO


async def test_agrees_with_gguf_py_reader(models: dict[tuple[str, str], WrittenGGUF]) -> None:
    """Header size, tensor count and tensor bytes agree with gguf-py's own (memmap) reader."""
    written = models[("1GB", "10KB")]
    got = await read_gguf_header(str(written.path))
    reference = GGUFReader(written.path)
    assert got.header_bytes == reference.data_offset
    assert got.tensor_count == len(reference.tensors)
    assert got.tensor_bytes == sum(int(t.n_bytes) for t in reference.tensors)
    for name, field in reference.fields.items():
        if name.startswith(("GGUF.", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type")):
            continue
        assert got.metadata[name] == field.contents(), name


async def test_server_ignoring_range_is_not_downloaded(
    models: dict[tuple[str, str], WrittenGGUF], server: RangeServer
) -> None:
    """A server that answers 200 with the whole body is read only as far as the header."""
    written = models[("1GB", "5MB")]
    server.ignore_range = True
    got = await read_gguf_header(server.url(written.path.name))
    assert got.header_bytes == written.header_bytes
    assert got.file_bytes == written.file_bytes  # from Content-Length
    assert [r.status for r in server.requests] == [200]
    # One 64 KiB network read past the growth policy's last step at most.
    assert got.bytes_fetched <= MAX_RATIO * got.header_bytes + 64 * 1024
    # What the server pushed before the hang-up: socket buffers, not the gigabyte.
    server.wait_idle()
    assert server.served_bytes(written.path.name) < 64 * 2**20


# --- Malformed files, read both from disk and over HTTP ----------------------------------


def valid_small(path: Path) -> WrittenGGUF:
    """A small, valid two-tensor GGUF."""
    return write_gguf(
        path,
        arch="llama",
        block_count=2,
        n_embd=64,
        n_head=4,
        n_head_kv=2,
        context_length=4096,
        extra_kv=tokenizer_kv(300),
        tensors=[
            TensorSpec("token_embd.weight", (64, 300), GGMLQuantizationType.F16),
            TensorSpec("output.weight", (64, 300), GGMLQuantizationType.Q8_0),
        ],
    )


@pytest.fixture(params=["path", "http"])
def via(request: pytest.FixtureRequest) -> str:
    """Read from disk or over HTTP."""
    return str(request.param)


async def read(via: str, path: Path, server: RangeServer) -> GGUFHeader:
    """read_gguf_header on `path`, from disk or through `server`."""
    return await read_gguf_header(str(path) if via == "path" else server.url(path.name))


@pytest.mark.parametrize(
    ("content", "fragment"), [h[1:] for h in HOSTILE_HEADERS], ids=[h[0] for h in HOSTILE_HEADERS]
)
async def test_hostile_headers_are_refused_cheaply(
    via: str, tmp_path: Path, range_server: RangeServer, content: bytes, fragment: str
) -> None:
    """A malformed or hostile header is a clear InvalidShape, without a big read or allocation."""
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    tracemalloc.start()
    try:
        with pytest.raises(InvalidShape) as err:
            await read(via, path, range_server)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert fragment in err.value.message
    assert err.value.source.endswith("bad.gguf")
    assert peak < 8 * 2**20
    range_server.wait_idle()
    assert range_server.served_bytes("bad.gguf") <= max(len(content), 0) + 1


@pytest.mark.parametrize(
    ("cut", "fragment"),
    [
        (lambda w: 2, "ends at byte 2"),
        (lambda w: w.header_bytes // 2, "truncated"),
        (lambda w: w.header_bytes - 40, "truncated"),
        (lambda w: w.header_bytes + 100, "tensors end at byte"),
    ],
    ids=["in-magic", "in-kv", "in-tensor-infos", "in-tensor-data"],
)
async def test_truncated_files_are_refused(
    via: str, tmp_path: Path, range_server: RangeServer, cut: object, fragment: str
) -> None:
    """A file cut anywhere, header or data, is refused as truncated."""
    written = valid_small(tmp_path / "cut.gguf")
    assert callable(cut)
    with open(written.path, "r+b") as f:
        f.truncate(cut(written))
    with pytest.raises(InvalidShape) as err:
        await read(via, written.path, range_server)
    assert fragment in err.value.message


async def test_valid_small_file_reads_the_same_both_ways(
    tmp_path: Path, range_server: RangeServer
) -> None:
    """The small file the failure cases start from is itself valid, from disk and over HTTP."""
    written = valid_small(tmp_path / "ok.gguf")
    by_path = await read("path", written.path, range_server)
    by_http = await read("http", written.path, range_server)
    assert by_path.metadata == by_http.metadata
    assert by_path.header_bytes == by_http.header_bytes == written.header_bytes
    # 64 x 300 x 2 B (F16) + 64 x 300 / 32 x 34 B (Q8_0) = 38,400 + 20,400.
    assert by_path.tensor_bytes == written.tensor_bytes == 58_800


@pytest.mark.parametrize("version", [2, 3])
async def test_gguf_v2_and_v3_are_read(
    via: str, tmp_path: Path, range_server: RangeServer, version: int
) -> None:
    """GGUF v2 (same layout as v3, little-endian) and v3 files are both read."""
    written = valid_small(tmp_path / "v.gguf")
    with open(written.path, "r+b") as f:
        f.seek(4)
        f.write(struct.pack("<I", version))
    got = await read(via, written.path, range_server)
    assert (got.version, got.header_bytes) == (version, written.header_bytes)


async def test_redirects_are_followed(tmp_path: Path, range_server: RangeServer) -> None:
    """A link that redirects (as Hugging Face's /resolve/ links do) is followed for each range."""
    written = valid_small(tmp_path / "blob.gguf")
    range_server.redirects["resolve/main/model.gguf"] = "blob.gguf"
    got = await read_gguf_header(range_server.url("resolve/main/model.gguf"))
    assert got.header_bytes == written.header_bytes
    assert {r.status for r in range_server.requests} == {302, 206}


async def test_header_over_the_limit_is_refused(tmp_path: Path, range_server: RangeServer) -> None:
    """A header longer than max_header_bytes is refused after reading at most the limit."""
    written = valid_small(tmp_path / "big.gguf")
    limit = written.header_bytes // 2
    with pytest.raises(InvalidShape) as err:
        await read_gguf_header(range_server.url("big.gguf"), max_header_bytes=limit)
    assert "header limit" in err.value.message
    range_server.wait_idle()
    assert range_server.served_bytes("big.gguf") <= limit


@pytest.mark.parametrize(
    ("status", "fragment"),
    [
        (404, "not found"),
        (410, "not found"),
        (403, "refused access"),
        (500, "server error"),
        (503, "server error"),
        (418, "HTTP 418"),
    ],
)
async def test_http_errors_are_unreachable(
    tmp_path: Path, range_server: RangeServer, status: int, fragment: str
) -> None:
    """An HTTP error status is SourceUnreachable naming the status."""
    valid_small(tmp_path / "m.gguf")
    range_server.fail_status = status
    with pytest.raises(SourceUnreachable) as err:
        await read_gguf_header(range_server.url("m.gguf"))
    assert fragment in err.value.message
    assert err.value.source == range_server.url("m.gguf")


async def test_missing_remote_file_is_unreachable(range_server: RangeServer) -> None:
    """A URL the server does not have is SourceUnreachable (404)."""
    with pytest.raises(SourceUnreachable, match="HTTP 404"):
        await read_gguf_header(range_server.url("nope.gguf"))


async def test_stalled_server_times_out(tmp_path: Path, range_server: RangeServer) -> None:
    """A server that never answers is SourceUnreachable after the timeout, not a hang."""
    valid_small(tmp_path / "m.gguf")
    range_server.stall_s = 30
    with pytest.raises(SourceUnreachable, match=r"in time|longer than"):
        await read_gguf_header(range_server.url("m.gguf"), timeout_s=0.5)


async def test_closed_port_is_unreachable() -> None:
    """Nothing listening is SourceUnreachable."""
    with RangeServer(".") as srv:
        url = srv.url("m.gguf")
    with pytest.raises(SourceUnreachable, match="could not be fetched"):
        await read_gguf_header(url, timeout_s=5)


async def test_caller_client_is_used_and_left_open(
    tmp_path: Path, range_server: RangeServer
) -> None:
    """A client passed in is used for the requests and is not closed by the reader."""
    written = valid_small(tmp_path / "m.gguf")
    async with httpx.AsyncClient() as client:
        got = await read_gguf_header(range_server.url("m.gguf"), client=client)
        assert got.header_bytes == written.header_bytes
        assert not client.is_closed


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("/nonexistent/dir/m.gguf", "no file"),
        ("file:///nonexistent/m.gguf", "no file"),
        ("s3://bucket/m.gguf", "s3:// scheme"),
        ("file://otherhost/m.gguf", "another host"),
    ],
)
async def test_unreadable_local_sources(source: str, fragment: str) -> None:
    """Missing files, foreign hosts and unknown schemes are SourceUnreachable, by name."""
    with pytest.raises(SourceUnreachable) as err:
        await read_gguf_header(source)
    assert fragment in err.value.message


async def test_directory_is_unreachable(tmp_path: Path) -> None:
    """A directory given as the model file is SourceUnreachable."""
    with pytest.raises(SourceUnreachable, match="directory"):
        await read_gguf_header(str(tmp_path))
