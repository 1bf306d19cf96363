"""The planner reading real sources over the network edge: a sparse 40 GB GGUF served by byte
ranges (header only), Hugging Face repos through an HF-shaped endpoint, and what its source
policy lets it fetch (hosts, redirects, local roots, hf:// revisions, one network error)."""

from __future__ import annotations

import os
import re
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from llmgw.common.v1 import common_pb2
from llmgw.planner.v1 import planner_pb2
from llmgw.testing.hub import HFServer
from llmgw.testing.range_server import RangeServer
from planner_svc.sources.policy import ENV_HOSTS, ENV_ROOTS
from tests.support.gguf_files import llama_tensors, tokenizer_kv, write_gguf
from tests.support.hf_repos import LLAMA_1B
from tests.support.planner import running_planner

pytest_plugins = ("tests.support.hf_fixtures",)


@pytest.fixture(autouse=True)
def loopback_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests serve files on 127.0.0.1, which a planner reads only when told it may."""
    monkeypatch.setenv(ENV_HOSTS, "127.0.0.1:*")
    monkeypatch.delenv(ENV_ROOTS, raising=False)


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


# -- the source policy ------------------------------------------------------------------------


async def describe_refusal(source: str) -> grpc.aio.AioRpcError:
    """DescribeModel of `source` on a fresh planner, which must refuse it; the error."""
    async with running_planner() as (_, stub, _ch):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.DescribeModel(planner_pb2.DescribeModelRequest(source=source))
    return caught.value


async def test_a_host_not_allowed_is_refused_before_any_request(
    tmp_path: Path, range_server: RangeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GGUF URL on a host:port the policy does not list is INVALID_ARGUMENT
    SOURCE_NOT_ALLOWED, naming what is allowed, and its server is never asked."""
    llama_gguf(tmp_path / "llama.gguf")
    monkeypatch.setenv(ENV_HOSTS, "127.0.0.1:1,models.example.org")
    error = await describe_refusal(range_server.url("llama.gguf"))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert reason_of(error) == "SOURCE_NOT_ALLOWED"
    assert "models.example.org" in str(error.details())
    assert range_server.requests == []


class Redirector:
    """An HTTP server on 127.0.0.1 answering every GET with 302 to `target`."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.hits = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.hits += 1
                self.send_response(302)
                self.send_header("Location", owner.target)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        """Where to ask."""
        return f"http://127.0.0.1:{self.server.server_address[1]}/model.gguf"

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def redirector() -> Iterator[Redirector]:
    """A redirecting server; its target is set by the test."""
    server = Redirector("")
    yield server
    server.close()


async def test_a_redirect_is_followed_only_to_an_allowed_host(
    tmp_path: Path, range_server: RangeServer, redirector: Redirector
) -> None:
    """A redirect to an allowed origin is followed; the same file behind a name the policy
    does not allow (localhost) is refused as SOURCE_NOT_ALLOWED and never requested."""
    llama_gguf(tmp_path / "llama.gguf")
    port = range_server.url("llama.gguf").split(":")[2].split("/")[0]
    redirector.target = f"http://127.0.0.1:{port}/llama.gguf"
    async with running_planner() as (_, stub, _ch):
        described = await stub.DescribeModel(
            planner_pb2.DescribeModelRequest(source=redirector.url)
        )
    assert described.shape.layers == 32
    range_server.wait_idle()
    range_server.reset_counts()
    redirector.target = f"http://localhost:{port}/llama.gguf"
    error = await describe_refusal(redirector.url)
    assert reason_of(error) == "SOURCE_NOT_ALLOWED"
    assert "redirected to http://localhost" in str(error.details())
    assert range_server.requests == []


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RawListener:
    """A TCP listener that answers each connection with `reply` (maybe nothing) and hangs up."""

    def __init__(self, reply: bytes) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.reply = reply
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                if self.reply:
                    conn.sendall(self.reply)

    def close(self) -> None:
        """Stop listening."""
        self.sock.close()


async def test_network_failures_read_the_same_whatever_the_port_is() -> None:
    """A closed port, one that hangs up at once and one that speaks another protocol give
    the same SOURCE_UNREACHABLE message, but for the URL itself."""
    hang_up, ssh = RawListener(b""), RawListener(b"SSH-2.0-OpenSSH_9.6\r\n" * 4)
    try:
        ports = [_closed_port(), hang_up.port, ssh.port]
        messages = []
        for port in ports:
            error = await describe_refusal(f"http://127.0.0.1:{port}/model.gguf")
            assert reason_of(error) == "SOURCE_UNREACHABLE"
            messages.append(str(error.details()).replace(str(port), "PORT"))
    finally:
        hang_up.close()
        ssh.close()
    assert len(set(messages)) == 1, messages
    assert "no HTTP answer" in messages[0]


async def test_local_paths_are_read_only_under_allowed_roots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A .gguf under an allowed root is read; one outside, a symlink inside that points out,
    and a missing file outside are all refused alike, so a refusal says nothing of what
    exists; with no roots no local file is read at all."""
    models, other = tmp_path / "models", tmp_path / "other"
    models.mkdir()
    other.mkdir()
    llama_gguf(models / "in.gguf")
    llama_gguf(other / "out.gguf")
    (models / "link.gguf").symlink_to(other / "out.gguf")
    async with running_planner() as (_, stub, _ch):
        with pytest.raises(grpc.aio.AioRpcError) as no_roots:
            await stub.DescribeModel(
                planner_pb2.DescribeModelRequest(source=str(models / "in.gguf"))
            )
    assert reason_of(no_roots.value) == "SOURCE_NOT_ALLOWED"
    assert "--allow-root" in str(no_roots.value.details())
    monkeypatch.setenv(ENV_ROOTS, str(models))
    async with running_planner() as (_, stub, _ch):
        inside = await stub.DescribeModel(
            planner_pb2.DescribeModelRequest(source=str(models / "in.gguf"))
        )
        refused = []
        for path in (other / "out.gguf", models / "link.gguf", other / "missing.gguf"):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.DescribeModel(planner_pb2.DescribeModelRequest(source=str(path)))
            assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert reason_of(caught.value) == "SOURCE_NOT_ALLOWED"
            refused.append(str(caught.value.details()).replace(str(path), "PATH"))
    assert inside.shape.layers == 32
    assert len(set(refused)) == 1, refused


async def test_an_hf_revision_that_climbs_is_refused_and_writes_nothing(
    hf_server: HFServer, tmp_path: Path
) -> None:
    """`hf://ORG/NAME@main/../../../../DIR/x` is INVALID_ARGUMENT before the Hub is asked,
    and nothing is written at DIR or anywhere outside the cache."""
    target = tmp_path / "escaped"
    climb = "main/" + "../" * 12 + str(target).lstrip("/") + "/x"
    before = set(os.listdir(tmp_path))
    for revision in (climb, "..", "main//x", "-x", "a" * 300):
        error = await describe_refusal(f"hf://{LLAMA_1B}@{revision}")
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert reason_of(error) == "INVALID_SHAPE"
        assert re.search("revision", str(error.details()))
    assert not target.exists()
    assert set(os.listdir(tmp_path)) - before <= {"hf-home"}
    assert hf_server.count(path=LLAMA_1B) == 0


async def test_sizing_a_model_whose_source_is_not_allowed_goes_ahead_unchecked(
    tmp_path: Path,
) -> None:
    """SizeContext of a model whose source the planner may not read (a path on the GPU
    nodes) changes the args without reading it, and its note says why memory was not
    checked; DescribeModel of the same source is refused."""
    path = tmp_path / "on-the-nodes.gguf"
    llama_gguf(path)
    model = common_pb2.Model(
        name="local",
        source=str(path),
        profiles=[common_pb2.Profile(name="p", engine="vllm", gpu_class="H100-80GB")],
    )
    async with running_planner() as (_, stub, _ch):
        sized = await stub.SizeContext(planner_pb2.SizeContextRequest(model=model, tokens=4096))
    assert list(sized.profiles[0].args) == ["--max-model-len", "4096"]
    assert "not checked" in sized.change.note
    assert "--allow-root" in sized.change.note
    error = await describe_refusal(str(path))
    assert reason_of(error) == "SOURCE_NOT_ALLOWED"
