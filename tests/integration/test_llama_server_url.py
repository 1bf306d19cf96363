"""A real llama-server replica of a GGUF *URL*, as deploy/model.example.yaml gives one: the
agent fetches the file (from the Hub stand-in, a real HTTP server on 127.0.0.1, never the
internet) and hands llama-server the local copy. The project's llama-server build cannot fetch
a URL itself: given `-mu URL` it starts in router mode with no model and still answers /health
200, which the fleet used to route as READY. Here READY means it serves the model: its
/v1/models names the alias and a completion generates tokens."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from llmgw.fleet.v1 import fleet_pb2
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.hub import HFServer
from tests.integration.test_llama_server_e2e import (
    MODEL,
    PREDICT_TOKENS,
    PROMPT_TOKENS,
    agent_process,
    built_llama_server,
    llamacpp_model,
    node_runs_llamacpp,
    one_ready_replica,
    write_tiny_llama,
)
from tests.support.fleet import running_fleet
from tests.support.planner import running_planner

pytestmark = pytest.mark.slow

REPO = "org/tiny-llama-GGUF"


@pytest.mark.timeout(300)
async def test_a_gguf_url_is_fetched_by_the_agent_and_served_by_real_llama_server(
    tmp_path: Path,
) -> None:
    """A llama.cpp model whose source is a Hub resolve URL turns READY only once the real
    llama-server serves it from the agent's cache: /v1/models names it, a completion
    generates tokens, and the engine was started with `-m` on the cached file."""
    llama_server = built_llama_server()
    gguf = write_tiny_llama(tmp_path / "tiny-llama.gguf")
    hub = HFServer({REPO: {"tiny-llama-F16.gguf": gguf.read_bytes()}}).start()
    url = f"{hub.url}/{REPO}/resolve/{hub.commit(REPO)}/tiny-llama-F16.gguf"
    state = tmp_path / "agent"
    agent_log = tmp_path / "agent.log"
    model = llamacpp_model(gguf)
    model.source = url
    try:
        async with (
            running_planner() as (planner, _planner_stub, _channel),
            running_fleet(tmp_path, planner=f"127.0.0.1:{planner.port}") as (fleet, stub),
        ):
            with agent_process(fleet.port, state, llama_server, agent_log, tmp_path / "none"):
                await assert_eventually(
                    lambda: node_runs_llamacpp(stub), timeout_s=60, what="node n1 READY"
                )
                await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model))
                replica = await one_ready_replica(stub, state, agent_log)
                async with httpx.AsyncClient(
                    base_url=f"http://{replica.address}", timeout=60
                ) as http:
                    models = (await http.get("/v1/models")).json()
                    assert [m["id"] for m in models["data"]] == [MODEL]
                    answer = await http.post(
                        "/completion",
                        json={
                            "prompt": PROMPT_TOKENS,
                            "n_predict": PREDICT_TOKENS,
                            "ignore_eos": True,
                            "temperature": 0,
                        },
                    )
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["tokens_predicted"] == PREDICT_TOKENS
                engine_log = (state / "logs" / f"{replica.id}.log").read_text(errors="replace")
                start = next(
                    line for line in engine_log.splitlines() if "starting revision" in line
                )
                assert '"-m"' in start and str(state / "models") in start and url not in start
                await stub.DeleteModel(fleet_pb2.DeleteModelRequest(name=MODEL))
    finally:
        hub.stop()
