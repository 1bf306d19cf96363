"""A real llama.cpp replica end to end: catalog -> fleet -> a real agent -> a real llama-server.

A tiny llama-architecture GGUF (random weights, a small made-up vocabulary) is written into the
test's folder; a planner and a fleet run in-process; a real node agent runs as a child process
with $LLMGW_LLAMA_SERVER naming the llama-server that `make llama-server` built
(scripts/build_llama_server.sh, from the llama.cpp vendored in llama-cpp-python, the one the
planner's rules are read from). A model with a llama.cpp profile is created; its replica must
reach READY through llama-server's own /health, answer a completion with generated tokens, and
go away with its process when the model is deleted. The KV cache llama-server printed must be
the planner's figure for the same arguments.

Without the binary the test fails, saying `make llama-server` builds it; with
LLMGW_SKIP_LLAMA_SERVER=1 it is skipped instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from fleet_svc.agent.claims import process_alive
from fleet_svc.agent.config import LLAMA_SERVER_ENV, find_llama_server
from fleet_svc.agent.process import RunRecord
from llmgw.common.v1 import common_pb2
from llmgw.engines.llamacpp import (
    LLAMACPP_VERSION,
    llamacpp_cache,
    llamacpp_kv_bytes,
    settings_from_args,
)
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.eventually import assert_eventually
from planner_svc.domain.gguf_shape import shape_from_gguf
from planner_svc.sources.gguf_http import read_gguf_header
from tests.oracle.llamacpp_run import parse_log, printed_mib
from tests.support.fleet import running_fleet
from tests.support.gguf_files import (
    TensorSpec,
    llama_tensors,
    tokenizer_kv,
    write_gguf,
)
from tests.support.planner import running_planner

pytestmark = pytest.mark.slow

SKIP_ENV = "LLMGW_SKIP_LLAMA_SERVER"
BUILD_HINT = (
    "no llama-server is built: run `make llama-server` (scripts/build_llama_server.sh builds "
    "it from llama-cpp-python's llama.cpp into ~/.cache/llmgw/llama.cpp/bin/llama-server, about "
    "ten minutes on 2 cores) or point $LLMGW_LLAMA_SERVER at one; set "
    f"{SKIP_ENV}=1 to skip this test"
)

MODEL = "tiny-llama"
# The profile's llama-server arguments: two slots of 512 tokens each, two CPU threads, and
# log verbosity 4: llama-server logs llama.cpp's own info lines (the cache sizes among them)
# at its trace level only (common/log.cpp:532), one above its default.
ARGS = ("-c", "1024", "-np", "2", "--threads", "2", "-lv", "4")

# The tiny model: 4 layers of 4 heads of 64 with 2 KV heads, an f16 cache of 2 KiB a cell. Its
# 2 MiB show in llama.cpp's two-decimal MiB print to 10 KiB; the printed cell and stream counts
# carry what is finer (the same total as 1 stream of 1024 cells, e.g.).
LAYERS = 4
N_EMBD = 256
HEADS = 4
KV_HEADS = 2
N_FF = 512
N_VOCAB = 128
TRAINED_CONTEXT = 4096
# Prompted with token ids: the made-up vocabulary need not tokenize text.
PROMPT_TOKENS = [0, 5, 17, 42, 99, 7, 3, 64]
PREDICT_TOKENS = 8


def built_llama_server() -> str:
    """The built llama-server: $LLMGW_LLAMA_SERVER's, else the build cache's (not PATH's: the
    KV check needs the llama.cpp the planner's rules were read from). Fails the test, or skips
    it with LLMGW_SKIP_LLAMA_SERVER=1, when there is none."""
    found = find_llama_server(os.environ, which=lambda _name: None)
    if found is not None:
        return found
    told = os.environ.get(LLAMA_SERVER_ENV, "")
    why = f"${LLAMA_SERVER_ENV}={told} is no executable; " if told else ""
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"{SKIP_ENV}=1: {why}{BUILD_HINT}")
    pytest.fail(why + BUILD_HINT, pytrace=False)


def write_tiny_llama(path: Path) -> Path:
    """A llama GGUF with seeded random f16 weights (norms 1.0) and a BPE vocabulary."""
    tensors = llama_tensors(
        block_count=LAYERS, n_embd=N_EMBD, n_head=HEADS, n_head_kv=KV_HEADS, n_ff=N_FF,
        n_vocab=N_VOCAB,
    )  # fmt: skip
    rng = np.random.default_rng(20240601)
    write_gguf(
        path,
        arch="llama",
        block_count=LAYERS,
        n_embd=N_EMBD,
        n_head=HEADS,
        n_head_kv=KV_HEADS,
        context_length=TRAINED_CONTEXT,
        extra_kv={
            "llama.feed_forward_length": N_FF,
            "llama.rope.dimension_count": N_EMBD // HEADS,
            "llama.attention.layer_norm_rms_epsilon": 1e-5,
            **tokenizer_kv(N_VOCAB, merges=N_VOCAB),
        },
        tensors=tensors,
        tensor_data={t.name: _weights(t, rng) for t in tensors},
    )
    return path


def _weights(t: TensorSpec, rng: np.random.Generator) -> bytes:
    """A tensor's data: f32 norms of 1.0, f16 matrices of small normal values."""
    n = int(np.prod(t.dims))
    if t.ggml_type == GGMLQuantizationType.F32:
        return np.ones(n, dtype=np.float32).tobytes()
    assert t.ggml_type == GGMLQuantizationType.F16
    return (rng.standard_normal(n) * 0.02).astype(np.float16).tobytes()


@contextmanager
def agent_process(
    fleet_port: int, state_dir: Path, llama_server: str, log_path: Path, models: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """A real node agent `n1` with one stand-in H100 card, running llama.cpp profiles on
    `llama_server` from local files under `models`; SIGTERM (it stops its engines) then
    SIGKILL after."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fleet_svc.agent",
                "--fleet",
                f"127.0.0.1:{fleet_port}",
                "--node",
                "n1",
                "--gpus",
                "1xH100-80GB",
                "--state-dir",
                str(state_dir),
                "--source-root",
                str(models),
                "--log-format",
                "json",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, LLAMA_SERVER_ENV: llama_server, "PYTHONUNBUFFERED": "1"},
        )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def llamacpp_model(source: Path) -> common_pb2.Model:
    """The catalog entry: the GGUF at `source`, one llama.cpp replica on one card."""
    return common_pb2.Model(
        name=MODEL,
        source=str(source),
        context_length=1024,
        profiles=[
            common_pb2.Profile(
                name="cpu",
                engine="llamacpp",
                args=list(ARGS),
                gpu_class="H100-80GB",
                gpus_per_node=1,
                replicas=1,
            )
        ],
    )


async def list_replicas(stub: fleet_pb2_grpc.FleetServiceAsyncStub) -> list[fleet_pb2.Replica]:
    """The model's replicas as the fleet sees them now (listing all: once the model is
    deleted, asking for its replicas by name is NOT_FOUND)."""
    answer = await stub.ListReplicas(fleet_pb2.ListReplicasRequest())
    return [r for r in answer.replicas if r.model == MODEL]


async def node_runs_llamacpp(stub: fleet_pb2_grpc.FleetServiceAsyncStub) -> bool:
    """Whether node n1 is READY and its agent offers the llamacpp engine."""
    nodes = (await stub.ListNodes(fleet_pb2.ListNodesRequest())).nodes
    return any(
        n.name == "n1" and n.phase == fleet_pb2.NODE_PHASE_READY and "llamacpp" in n.engines
        for n in nodes
    )


def tail(path: Path, lines: int = 30) -> str:
    """The last lines of a log, for failure messages."""
    if not path.exists():
        return f"({path} does not exist)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


async def one_ready_replica(
    stub: fleet_pb2_grpc.FleetServiceAsyncStub, state: Path, agent_log: Path
) -> fleet_pb2.Replica:
    """Wait (up to 120 s) until the model's one replica is READY and return it; failing, say
    every replica's phase and reason with the engine's and the agent's log tails."""

    async def ready() -> bool:
        rs = await list_replicas(stub)
        return len(rs) == 1 and rs[0].phase == fleet_pb2.REPLICA_PHASE_READY

    try:
        await assert_eventually(ready, timeout_s=120, every_s=0.2, what="replica READY")
    except AssertionError as exc:
        rs = await list_replicas(stub)
        logs = "\n".join(tail(p) for p in sorted((state / "logs").glob("*.log")))
        raise AssertionError(
            f"{exc}: {[(r.phase, r.reason) for r in rs]}\nengine log:\n{logs}\n"
            f"agent log:\n{tail(agent_log)}"
        ) from None
    [replica] = await list_replicas(stub)
    return replica


@pytest.mark.timeout(300)
async def test_real_llama_server_replica_serves_and_prints_the_planners_kv(tmp_path: Path) -> None:
    """A llama.cpp profile runs a real llama-server through fleet and agent: READY on its own
    /health, a completion with generated tokens, gone with its process on delete, and the KV
    cache it printed is the planner's figure for the same arguments."""
    llama_server = built_llama_server()
    gguf = write_tiny_llama(tmp_path / "tiny-llama.gguf")
    header = await read_gguf_header(str(gguf))
    shape = shape_from_gguf(
        header.metadata,
        file_bytes=header.file_bytes,
        tensor_bytes=header.tensor_bytes,
        source=str(gguf),
    )
    planned_bytes = llamacpp_kv_bytes(shape, ARGS)
    planned = llamacpp_cache(shape, settings_from_args(ARGS))
    state = tmp_path / "agent"
    agent_log = tmp_path / "agent.log"

    async with (
        running_planner() as (planner, _planner_stub, _channel),
        running_fleet(tmp_path, planner=f"127.0.0.1:{planner.port}") as (fleet, stub),
    ):
        with agent_process(fleet.port, state, llama_server, agent_log, gguf.parent):
            await assert_eventually(
                lambda: node_runs_llamacpp(stub),
                timeout_s=60,
                what="node n1 READY with the llamacpp engine",
            )
            await stub.CreateModel(fleet_pb2.CreateModelRequest(model=llamacpp_model(gguf)))
            replica = await one_ready_replica(stub, state, agent_log)
            replica_log = state / "logs" / f"{replica.id}.log"
            record = RunRecord.from_json((state / "replicas" / f"{replica.id}.json").read_text())
            assert process_alive(record.pid)

            async with httpx.AsyncClient(base_url=f"http://{replica.address}", timeout=60) as http:
                models = (await http.get("/v1/models")).json()
                assert [m["id"] for m in models["data"]] == [MODEL]
                answer = await http.post(
                    "/completion",
                    json={
                        "prompt": PROMPT_TOKENS,
                        "n_predict": PREDICT_TOKENS,
                        "ignore_eos": True,
                        "temperature": 0,
                        "return_tokens": True,
                    },
                )
                assert answer.status_code == 200, answer.text
                done = answer.json()
                assert done["tokens_predicted"] == PREDICT_TOKENS, done
                assert len(done["tokens"]) == PREDICT_TOKENS, done
                assert all(0 <= t < N_VOCAB for t in done["tokens"]), done

            await stub.DeleteModel(fleet_pb2.DeleteModelRequest(name=MODEL))
            await assert_eventually(
                lambda: _gone(stub, record.pid), timeout_s=60, what="replica and process gone"
            )
            with pytest.raises(httpx.TransportError):
                async with httpx.AsyncClient(timeout=5) as http:
                    await http.get(f"http://{replica.address}/health")

    printed = parse_log(True, replica_log.read_text(errors="replace"))
    assert len(printed.kv) == 1, f"one `llama_kv_cache: size = …` line in {replica_log}"
    kv = printed.kv[0]
    where = f"{LLAMACPP_VERSION} rules vs {llama_server}"
    assert kv.size_mib == printed_mib(planned_bytes), where
    assert (kv.cells, kv.streams, kv.layers) == (planned.full_cells, planned.streams, LAYERS), where
    assert (kv.k_mib, kv.v_mib) == (printed_mib(planned.k_bytes), printed_mib(planned.v_bytes))


async def _gone(stub: fleet_pb2_grpc.FleetServiceAsyncStub, pid: int) -> bool:
    return not await list_replicas(stub) and not process_alive(pid)
