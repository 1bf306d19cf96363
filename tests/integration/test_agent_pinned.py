"""What the agent starts is what was sized: a pinned hf:// revision on each engine's real
command line (the argv its child recorded), refused where an engine cannot take it, and READY
only once the engine lists the served model (the agent as its own process, the stand-in under
the engines' real argument templates)."""

from __future__ import annotations

import json
from pathlib import Path

from llmgw.agent.v1 import agent_pb2
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.fake_fleet import FakeFleet, running_fake_fleet
from tests.integration.test_agent_process import HEALTHY, STARTING, agent_process, stop_agent

COMMIT = "0123456789abcdef0123456789abcdef01234567"
PINNED = f"hf://org/model@{COMMIT}"

# The engines as deploy/agent.example.yaml runs them, the program being the stand-in (which
# records its argv in the folder the env names). Each engine's real template.
CONFIG = """\
health_interval_s: 0.1
health_timeout_s: 1
restart: {{base_s: 0.2, factor: 2, cap_s: 1, jitter: 0, max_crashes: 1}}
engines:
  vllm:
    module: fleet_svc.standin
    family: vllm
    args: ["serve", "{{source_args}}", "--served-model-name", "{{model}}",
           "--host", "{{host}}", "--port", "{{port}}", "{{args}}"]
    env: {{LLMGW_STANDIN_ARGV_DIR: "{argv}"}}
    start_timeout_s: 30
  sglang:
    module: fleet_svc.standin
    family: sglang
    args: ["-m", "sglang.launch_server", "--model-path", "{{source_args}}",
           "--served-model-name", "{{model}}", "--host", "{{host}}", "--port", "{{port}}",
           "{{args}}"]
    env: {{LLMGW_STANDIN_ARGV_DIR: "{argv}"}}
    start_timeout_s: 30
  trtllm:
    module: fleet_svc.standin
    family: trtllm
    args: ["{{source_args}}", "--host", "{{host}}", "--port", "{{port}}", "{{args}}"]
    env: {{LLMGW_STANDIN_ARGV_DIR: "{argv}"}}
    start_timeout_s: 30
  llamacpp:
    module: fleet_svc.standin
    family: llamacpp
    args: ["--host", "{{host}}", "--port", "{{port}}", "{{source_args}}", "--alias", "{{model}}",
           "{{args}}"]
    env: {{LLMGW_STANDIN_ARGV_DIR: "{argv}"}}
    start_timeout_s: 30
"""


def _config(tmp_path: Path) -> tuple[Path, Path]:
    argv_dir = tmp_path / "argv"
    path = tmp_path / "agent.yaml"
    path.write_text(CONFIG.format(argv=argv_dir))
    return path, argv_dir


def _spec(rid: str, engine: str, args: list[str], source: str = PINNED) -> agent_pb2.ReplicaSpec:
    return agent_pb2.ReplicaSpec(
        replica_id=rid,
        revision=1,
        model="tiny",
        profile="gpu",
        engine=engine,
        args=["--load-s", "0.2", *args],
        source=source,
    )


async def _healthy(fleet: FakeFleet, rid: str) -> agent_pb2.ObservedReplica:
    return await assert_eventually(
        lambda: next((u for u in fleet.updates_of(rid) if u.phase == HEALTHY), None),
        timeout_s=30,
        what=f"{rid} HEALTHY",
    )


async def test_a_pinned_commit_reaches_each_engines_real_command_line(tmp_path: Path) -> None:
    """vLLM, SGLang and trtllm-serve are started with `--revision COMMIT` beside the repo id,
    as their own CLIs take it, and turn HEALTHY serving the name each is told or given."""
    config, argv_dir = _config(tmp_path)
    async with (
        running_fake_fleet() as (fleet, port),
        agent_process(port, tmp_path / "state", config=config) as proc,
    ):
        await assert_eventually(lambda: fleet.streams, timeout_s=20)
        fleet.desire(
            _spec("r-vllm", "vllm", ["--max-model-len", "4096"]),
            _spec("r-sglang", "sglang", ["--context-length", "4096"]),
            _spec("r-trtllm", "trtllm", ["--max_seq_len", "4096"]),
        )
        for rid in ("r-vllm", "r-sglang", "r-trtllm"):
            await _healthy(fleet, rid)
        await stop_agent(proc)
    argv = {
        rid: json.loads((argv_dir / f"{rid}.json").read_text())
        for rid in ("r-vllm", "r-sglang", "r-trtllm")
    }
    assert argv["r-vllm"][:4] == ["serve", "org/model", "--revision", COMMIT]
    assert argv["r-sglang"][2:6] == ["--model-path", "org/model", "--revision", COMMIT]
    assert argv["r-trtllm"][:3] == ["org/model", "--revision", COMMIT]
    for rid, got in argv.items():
        assert got.count("--revision") == 1, (rid, got)


async def test_a_pin_in_the_args_is_passed_once_and_a_pin_llamacpp_cannot_take_is_refused(
    tmp_path: Path,
) -> None:
    """A `--revision` equal to the pin stays the only one on vLLM's command line; another one
    is ARGS_REFUSED; llama.cpp's -hf takes no revision, so a pinned hf:// source for it is
    SOURCE_REFUSED naming the engine; neither refused replica runs."""
    config, argv_dir = _config(tmp_path)
    async with (
        running_fake_fleet() as (fleet, port),
        agent_process(port, tmp_path / "state", config=config) as proc,
    ):
        await assert_eventually(lambda: fleet.streams, timeout_s=20)
        version = fleet.desire(
            _spec("r-same", "vllm", ["--revision", COMMIT]),
            _spec("r-other", "vllm", ["--revision", "main"]),
            _spec("r-gguf", "llamacpp", ["-c", "4096"]),
        )
        ack = await assert_eventually(lambda: fleet.ack(version), timeout_s=20, what="ack")
        await _healthy(fleet, "r-same")
        await stop_agent(proc)
    refused = {r.replica_id: r for r in ack.rejected}
    assert set(refused) == {"r-other", "r-gguf"}
    assert refused["r-other"].reason == "ARGS_REFUSED"
    assert (
        "--revision 'main'" in refused["r-other"].message and COMMIT in refused["r-other"].message
    )
    assert refused["r-gguf"].reason == "SOURCE_REFUSED"
    assert "llamacpp" in refused["r-gguf"].message and "resolve" in refused["r-gguf"].message
    assert sorted(p.name for p in argv_dir.iterdir()) == ["r-same.json"]
    same = json.loads((argv_dir / "r-same.json").read_text())
    assert same.count("--revision") == 1 and same[same.index("--revision") + 1] == COMMIT


async def test_an_engine_that_answers_health_without_the_model_stays_starting(
    tmp_path: Path,
) -> None:
    """An engine whose /health answers 200 while its /v1/models lists nothing (llama-server in
    router mode) is reported STARTING with a reason naming the model, never HEALTHY; its
    sibling that lists the model turns HEALTHY."""
    config, _argv_dir = _config(tmp_path)
    async with (
        running_fake_fleet() as (fleet, port),
        agent_process(port, tmp_path / "state", config=config) as proc,
    ):
        await assert_eventually(lambda: fleet.streams, timeout_s=20)
        fleet.desire(
            _spec("r-empty", "vllm", ["--serve-no-model"]),
            _spec("r-full", "vllm", []),
        )
        await _healthy(fleet, "r-full")
        waiting = await assert_eventually(
            lambda: next(
                (u for u in fleet.updates_of("r-empty") if "/v1/models" in u.message), None
            ),
            timeout_s=30,
            what="r-empty STARTING with the model list's reason",
        )
        phases = fleet.phases_of("r-empty")
        await stop_agent(proc)
    assert waiting.phase == STARTING
    assert "lists none, not tiny" in waiting.message
    assert HEALTHY not in phases
