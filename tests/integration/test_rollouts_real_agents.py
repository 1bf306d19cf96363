"""Rollouts with real node agents (child processes) running real stand-in engine processes on
stand-in cards: beside with a prober, a failing engine with its log tail and an undo, and in
place on a full node with the cards freed before the new replica starts."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import grpc
import httpx
import pytest

from fleet_svc.server import FleetServer
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.eventually import assert_eventually
from tests.integration.test_rollouts import LLAMA_8B, Prober, reason_and_meta, wait_rollout
from tests.support.fleet import running_fleet
from tests.support.planner import running_planner

pytestmark = pytest.mark.slow

READY = fleet_pb2.REPLICA_PHASE_READY


@contextmanager
def agents(
    fleet_port: int, tmp: Path, nodes: int, gpus: str
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`nodes` real agents in demo mode (vLLM stood in for), each with `gpus` stand-in cards."""
    procs = []
    for i in range(nodes):
        state = tmp / f"agent-{i}"
        state.mkdir()
        log = (tmp / f"agent-{i}.log").open("wb")
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "fleet_svc.agent",
                    "--fleet",
                    f"127.0.0.1:{fleet_port}",
                    "--node",
                    f"node-{i}",
                    "--gpus",
                    gpus,
                    "--state-dir",
                    str(state),
                    "--demo",
                    "--log-format",
                    "json",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        )
    try:
        yield procs
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


@asynccontextmanager
async def real_cluster(
    tmp_path: Path, nodes: int, gpus: str
) -> AsyncIterator[tuple[FleetServer, fleet_pb2_grpc.FleetServiceAsyncStub]]:
    """A planner, a fleet, and real agents."""
    async with (
        running_planner() as (planner, _p, _c),
        running_fleet(tmp_path, planner=f"127.0.0.1:{planner.port}", start_timeout_s=20.0) as (
            fleet,
            stub,
        ),
    ):
        with agents(fleet.port, tmp_path, nodes, gpus):
            await assert_eventually(
                lambda: _nodes_ready(stub, nodes), timeout_s=30, what="agents connected"
            )
            yield fleet, stub


async def _nodes_ready(stub: fleet_pb2_grpc.FleetServiceAsyncStub, n: int) -> bool:
    nodes = (await stub.ListNodes(fleet_pb2.ListNodesRequest())).nodes
    return sum(1 for x in nodes if x.phase == fleet_pb2.NODE_PHASE_READY) == n


def standin_model(replicas: int, gpus: int = 1, capacity: int = 12_000) -> common_pb2.Model:
    """A vLLM model the stand-in serves; its 'KV cache' holds `capacity` tokens, so a longer
    context is refused by the engine as vLLM refuses it."""
    return common_pb2.Model(
        name="vmodel",
        source="hf://org/model",
        context_length=8192,
        shape=LLAMA_8B,
        profiles=[
            common_pb2.Profile(
                name="gpu",
                engine="vllm",
                args=[
                    "--max-model-len",
                    "8192",
                    "--kv-capacity-tokens",
                    str(capacity),
                    "--load-s",
                    "0.3",
                    "-tp",
                    str(gpus),
                ],
                gpu_class="H100-80GB",
                gpus_per_node=gpus,
                replicas=replicas,
            )
        ],
    )


async def replicas(stub: fleet_pb2_grpc.FleetServiceAsyncStub) -> list[fleet_pb2.Replica]:
    """The fleet's replicas now."""
    return list((await stub.ListReplicas(fleet_pb2.ListReplicasRequest())).replicas)


async def n_ready(stub: fleet_pb2_grpc.FleetServiceAsyncStub, n: int) -> bool:
    """Whether exactly `n` replicas exist, all READY."""
    rs = await replicas(stub)
    return len(rs) == n and all(r.phase == READY for r in rs)


async def test_beside_failure_and_undo_with_real_engines(tmp_path: Path) -> None:
    """2 nodes × 4 stand-in cards: a context change rolls out beside without dropping below 2
    ready; a context the engine refuses fails the rollout with its log line, the old replicas
    keep serving, and undo restores the context."""
    async with real_cluster(tmp_path, nodes=2, gpus="4xH100-80GB") as (_fleet, stub):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=standin_model(2)))
        await assert_eventually(lambda: n_ready(stub, 2), timeout_s=30, what="2 READY")
        prober = Prober(stub, "vmodel")
        await asyncio.wait_for(prober.synced.wait(), 5)

        ok = await stub.SetContext(fleet_pb2.SetContextRequest(name="vmodel", tokens=10_000))
        ro = await wait_rollout(stub, ok.rollout_id)
        assert ro.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, ro.reason
        await assert_eventually(lambda: n_ready(stub, 2), timeout_s=20, what="2 READY after")
        assert prober.low >= 2
        async with httpx.AsyncClient() as http:
            for r in await replicas(stub):
                assert "--max-model-len" in r.args and "10000" in r.args
                answer = await http.get(f"http://{r.address}/v1/models")
                assert answer.status_code == 200
        serving = {r.id for r in await replicas(stub)}

        bad = await stub.SetContext(fleet_pb2.SetContextRequest(name="vmodel", tokens=16_384))
        failed = await wait_rollout(stub, bad.rollout_id)
        assert failed.state == fleet_pb2.ROLLOUT_STATE_FAILED
        assert any("larger than the maximum number of tokens" in line for line in failed.log_tail)
        await assert_eventually(lambda: n_ready(stub, 2), timeout_s=20, what="old still serving")
        assert {r.id for r in await replicas(stub)} == serving
        assert prober.low >= 2

        undo = await stub.UndoRollout(fleet_pb2.UndoRolloutRequest(id=bad.rollout_id))
        back = await wait_rollout(stub, undo.rollout.id)
        assert back.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, back.reason
        model = (await stub.GetModel(fleet_pb2.GetModelRequest(name="vmodel"))).model
        assert "10000" in model.model.profiles[0].args
        prober.stop()


async def test_in_place_on_a_full_node_frees_cards_first(tmp_path: Path) -> None:
    """One node of 4 stand-in cards full with 2 replicas of 2: beside is NO_ROOM_BESIDE and
    changes nothing; in place completes, one replica down at a time, each new one on freed
    cards."""
    async with real_cluster(tmp_path, nodes=1, gpus="4xH100-80GB") as (_fleet, stub):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=standin_model(2, gpus=2)))
        await assert_eventually(lambda: n_ready(stub, 2), timeout_s=30, what="2 READY")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SetContext(fleet_pb2.SetContextRequest(name="vmodel", tokens=10_000))
        assert reason_and_meta(caught.value)[0] == "NO_ROOM_BESIDE"
        assert (await stub.GetModel(fleet_pb2.GetModelRequest(name="vmodel"))).model.revision == 1
        prober = Prober(stub, "vmodel")
        await asyncio.wait_for(prober.synced.wait(), 5)
        answer = await stub.SetContext(
            fleet_pb2.SetContextRequest(
                name="vmodel", tokens=10_000, strategy=fleet_pb2.STRATEGY_IN_PLACE
            )
        )
        ro = await wait_rollout(stub, answer.rollout_id)
        assert ro.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, ro.reason
        prober.stop()
        assert prober.low >= 1
        await assert_eventually(lambda: n_ready(stub, 2), timeout_s=20, what="2 READY after")
        nodes = (await stub.ListNodes(fleet_pb2.ListNodesRequest())).nodes
        assert nodes[0].free_gpus == 0
        used = [c.memory_used_bytes for c in nodes[0].cards]
        assert all(u > 0 for u in used), "each card is claimed by exactly one live stand-in"
