"""The demo's example catalog: a GGUF model served by llama.cpp and a Hugging Face repo
served by vLLM, each with one replica on one card, their files served by the demo's file
server; loading it through the fleet's API, and waiting until its replicas serve."""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Sequence
from typing import TextIO

import httpx

from llmgw.clients import ClientError, FleetClient, Refused
from llmgw.clients.convert import Model, Replica, enum_name, model_data, model_from_data
from llmgw.demo.hf_repo import REPO

GGUF_MODEL = "tiny-llama-gguf"
HF_MODEL = "tiny-llama-hf"
GGUF_FILE = "tiny-llama.gguf"
"""The tiny model's file name in the served folder."""
CALLER = "llmgw-up"
"""Who the example catalog's revisions are written by: a model last written by someone else
is left as it is."""


def example_models(*, gguf_source: str, gpu_class: str) -> list[Model]:
    """The two example models.

    Args:
        gguf_source: where the GGUF model is read from: the file server's URL of it, or its
            local path where a real llama-server runs it (llama-server's `-m` takes a path).
        gpu_class: the class of the local agent's cards, e.g. "H100-80GB".
    """
    gguf = {
        "name": GGUF_MODEL,
        "source": gguf_source,
        "context_length": 4096,
        "profiles": [
            {
                "name": "gpu",
                "engine": "llamacpp",
                "args": ["--ctx-size", "4096", "--parallel", "1"],
                "gpu_class": gpu_class,
                "gpus_per_node": 1,
                "replicas": 1,
            }
        ],
    }
    hf = {
        "name": HF_MODEL,
        "source": f"hf://{REPO}",
        "context_length": 8192,
        "profiles": [
            {
                "name": "gpu",
                "engine": "vllm",
                "args": ["--max-model-len", "8192", "--tensor-parallel-size", "1"],
                "gpu_class": gpu_class,
                "gpus_per_node": 1,
                "tp": 1,
                "replicas": 1,
            }
        ],
    }
    return [model_from_data(gguf), model_from_data(hf)]


def ensure_example_catalog(fleet: FleetClient, models: Sequence[Model]) -> list[str]:
    """Create the example models that are not in the catalog. One that is there is left as it
    is, unless `llmgw up` wrote it last (as CALLER) and it differs (e.g. the file server's port
    changed): then it is updated, guarded by its etag, and what its replicas run differently
    rolls out beside where a node has room, in place where none has (strategy auto). Returns a
    line per model saying what was done.

    Raises:
        Unreachable, Refused: the fleet did not answer, or refused a change.
    """
    said = []
    for model in models:
        try:
            got = fleet.get_model(model.name)
        except Refused as refused:
            if refused.code != "NOT_FOUND":
                raise
            # One id per create this run makes: the client's retries of it are answered once,
            # and no later run (the model deleted since) is ever given this create's answer.
            fleet.create_model(
                model, request_id=f"llmgw-up-{model.name}-{_digest(model)}-{uuid.uuid4().hex[:12]}"
            )
            said.append(f"created {model.name}")
            continue
        if got.updated_by == CALLER and not got.declared and _differs(got.model, model):
            fleet.update_model(model, etag=got.etag, strategy="auto")
            said.append(f"updated {model.name} (its example settings changed)")
        else:
            said.append(f"kept {model.name} (revision {got.revision}, by {got.updated_by})")
    return said


def _digest(model: Model) -> str:
    """A short hash of a model's content, for a request id that names it."""
    text = json.dumps(model_data(model), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _differs(a: Model, b: Model) -> bool:
    return model_data(a) != model_data(b)


def _phase(r: Replica) -> str:
    return enum_name(r, "phase").removeprefix("REPLICA_PHASE_")


def answers_health(address: str) -> bool:
    """Whether the engine at HOST:PORT answers GET /health with 200 now."""
    try:
        return httpx.get(f"http://{address}/health", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def serving(fleet: FleetClient, replicas: Sequence[Replica]) -> list[Replica]:
    """The replicas that serve now: READY, on a node whose agent is connected, and answering
    their health check. A fleet started again on an old store still shows the replicas of its
    last run as READY until their agent has said hello, so READY alone is not enough."""
    nodes = fleet.list_nodes().nodes
    up_nodes = {n.name for n in nodes if enum_name(n, "phase") == "NODE_PHASE_READY"}
    return [
        r
        for r in replicas
        if _phase(r) == "READY" and r.node in up_nodes and answers_health(r.address)
    ]


def wait_ready(
    fleet: FleetClient,
    models: Sequence[Model],
    timeout_s: float,
    stop: threading.Event,
    out: TextIO,
) -> list[Replica] | None:
    """Wait until every wanted replica of `models` serves (see `serving`), printing a line
    whenever one changes phase. The serving replicas, or None after `timeout_s` (or when
    stopped)."""
    names = {m.name for m in models}
    wanted = sum(p.replicas for m in models for p in m.profiles)
    seen: dict[str, tuple[str, str, str]] = {}
    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        try:
            replicas = [r for r in fleet.list_replicas().replicas if r.model in names]
            for r in replicas:
                key = (_phase(r), r.address, r.reason)
                if seen.get(r.id) != key:
                    seen[r.id] = key
                    where = f" on {r.node} card(s) {','.join(map(str, r.gpus))}" if r.node else ""
                    at = f" at {r.address}" if r.address and _phase(r) == "READY" else ""
                    why = f": {r.reason}" if r.reason and _phase(r) != "READY" else ""
                    print(f"  {r.model}/{r.profile} {r.id}: {_phase(r)}{where}{at}{why}", file=out)
                    out.flush()
            ready = serving(fleet, replicas)
            if len(ready) >= wanted:
                return ready
        except ClientError:
            pass  # the fleet is busy or restarting: ask again on the next round
        if time.monotonic() > deadline:
            return None
        stop.wait(0.25)
    return None
