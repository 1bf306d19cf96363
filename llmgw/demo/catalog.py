"""The demo's example catalog: a GGUF model served by llama.cpp and a Hugging Face repo
served by vLLM, each with one replica on one card, their files served by the demo's file
server; loading it through the fleet's API, and waiting until its replicas serve."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TextIO

import grpc
import httpx
from google.protobuf import json_format

from llmgw.common.v1 import common_pb2
from llmgw.demo.hf_repo import REPO
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc

GGUF_MODEL = "tiny-llama-gguf"
HF_MODEL = "tiny-llama-hf"
GGUF_FILE = "tiny-llama.gguf"
"""The tiny model's file name in the served folder."""
CALLER = "llmgw-up"
"""Who the example catalog's revisions are written by: a model last written by someone else
is left as it is."""


def example_models(*, gguf_source: str, gpu_class: str) -> list[common_pb2.Model]:
    """The two example models.

    Args:
        gguf_source: where the GGUF model is read from: the file server's URL of it, or its
            local path where a real llama-server runs it (llama-server's `-m` takes a path).
        gpu_class: the class of the local agent's cards, e.g. "H100-80GB".
    """
    gguf = common_pb2.Model(
        name=GGUF_MODEL,
        source=gguf_source,
        context_length=4096,
        profiles=[
            common_pb2.Profile(
                name="gpu",
                engine="llamacpp",
                args=["--ctx-size", "4096", "--parallel", "1"],
                gpu_class=gpu_class,
                gpus_per_node=1,
                replicas=1,
            )
        ],
    )
    hf = common_pb2.Model(
        name=HF_MODEL,
        source=f"hf://{REPO}",
        context_length=8192,
        profiles=[
            common_pb2.Profile(
                name="gpu",
                engine="vllm",
                args=["--max-model-len", "8192", "--tensor-parallel-size", "1"],
                gpu_class=gpu_class,
                gpus_per_node=1,
                tp=1,
                replicas=1,
            )
        ],
    )
    return [gguf, hf]


def ensure_example_catalog(
    stub: fleet_pb2_grpc.FleetServiceStub, models: Sequence[common_pb2.Model]
) -> list[str]:
    """Create the example models that are not in the catalog. One that is there is left as it
    is, unless `llmgw up` wrote it last and it differs (e.g. the file server's port changed):
    then it is updated, guarded by its etag. Returns a line per model saying what was done."""
    metadata = (("x-llmgw-caller", CALLER),)
    said = []
    for model in models:
        try:
            got = stub.GetModel(
                fleet_pb2.GetModelRequest(name=model.name), timeout=10, metadata=metadata
            ).model
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.NOT_FOUND:
                raise
            stub.CreateModel(
                fleet_pb2.CreateModelRequest(model=model, request_id=f"llmgw-up-{model.name}-1"),
                timeout=10,
                metadata=metadata,
            )
            said.append(f"created {model.name}")
            continue
        if got.updated_by == CALLER and not got.declared and _differs(got.model, model):
            stub.UpdateModel(
                fleet_pb2.UpdateModelRequest(model=model, etag=got.etag),
                timeout=10,
                metadata=metadata,
            )
            said.append(f"updated {model.name} (its example settings changed)")
        else:
            said.append(f"kept {model.name} (revision {got.revision}, by {got.updated_by})")
    return said


def _differs(a: common_pb2.Model, b: common_pb2.Model) -> bool:
    return json_format.MessageToDict(a) != json_format.MessageToDict(b)


def _phase(r: fleet_pb2.Replica) -> str:
    return str(fleet_pb2.ReplicaPhase.Name(r.phase)).removeprefix("REPLICA_PHASE_")


def answers_health(address: str) -> bool:
    """Whether the engine at HOST:PORT answers GET /health with 200 now."""
    try:
        return httpx.get(f"http://{address}/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def serving(
    stub: fleet_pb2_grpc.FleetServiceStub, replicas: Sequence[fleet_pb2.Replica]
) -> list[fleet_pb2.Replica]:
    """The replicas that serve now: READY, on a node whose agent is connected, and answering
    their health check. A fleet started again on an old store still shows the replicas of its
    last run as READY until their agent has said hello, so READY alone is not enough."""
    nodes = stub.ListNodes(fleet_pb2.ListNodesRequest(), timeout=5).nodes
    up_nodes = {n.name for n in nodes if n.phase == fleet_pb2.NODE_PHASE_READY}
    return [
        r
        for r in replicas
        if _phase(r) == "READY" and r.node in up_nodes and answers_health(r.address)
    ]


def wait_ready(
    stub: fleet_pb2_grpc.FleetServiceStub,
    models: Sequence[common_pb2.Model],
    timeout_s: float,
    stop: threading.Event,
    out: TextIO,
) -> list[fleet_pb2.Replica] | None:
    """Wait until every wanted replica of `models` serves (see `serving`), printing a line
    whenever one changes phase. The serving replicas, or None after `timeout_s` (or when
    stopped)."""
    names = {m.name for m in models}
    wanted = sum(p.replicas for m in models for p in m.profiles)
    seen: dict[str, tuple[str, str, str]] = {}
    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        try:
            answer = stub.ListReplicas(fleet_pb2.ListReplicasRequest(), timeout=5)
            replicas = [r for r in answer.replicas if r.model in names]
            for r in replicas:
                key = (_phase(r), r.address, r.reason)
                if seen.get(r.id) != key:
                    seen[r.id] = key
                    where = f" on {r.node} card(s) {','.join(map(str, r.gpus))}" if r.node else ""
                    at = f" at {r.address}" if r.address and _phase(r) == "READY" else ""
                    why = f": {r.reason}" if r.reason and _phase(r) != "READY" else ""
                    print(f"  {r.model}/{r.profile} {r.id}: {_phase(r)}{where}{at}{why}", file=out)
                    out.flush()
            ready = serving(stub, replicas)
            if len(ready) >= wanted:
                return ready
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline:
            return None
        stop.wait(0.25)
    return None
