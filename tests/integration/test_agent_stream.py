"""The node agent over a real stream: desired sets in, replicas, Acks, heartbeats out."""

from __future__ import annotations

import itertools
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

import grpc
import httpx

from fleet_svc.agent import claims
from fleet_svc.agent.admission import ArgRules
from fleet_svc.agent.config import EngineConfig
from fleet_svc.agent.replica import Phase
from llmgw.agent.v1 import agent_pb2
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.fake_fleet import running_fake_fleet, spec
from tests.support.agents import fast_config, running_agent

HEALTHY = agent_pb2.PROCESS_PHASE_HEALTHY
STOPPED = agent_pb2.PROCESS_PHASE_STOPPED


def card_used(heartbeat: agent_pb2.Heartbeat, index: int) -> int:
    """Memory in use on one card as a heartbeat reports it."""
    return next(c.memory_used_bytes for c in heartbeat.cards if c.index == index)


async def test_desired_replica_runs_healthy_and_answers(tmp_path: Path) -> None:
    """A desired replica is started, reported HEALTHY with an address whose /v1/models lists
    its model, and the Hello named the node, its cards (NVML's and CUDA's totals) and engines
    (with the versions the config gives)."""
    engines = dict(fast_config().engines)
    engines["vllm"] = replace(engines["vllm"], version="0.10.2")
    config = fast_config(engines=engines)
    async with (
        running_fake_fleet() as (fleet, port),
        running_agent(port, tmp_path, config=config) as agent,
    ):
        await assert_eventually(lambda: fleet.streams, what="the agent connecting")
        hello = fleet.hellos[0]
        assert hello.node_name == "node-1"
        assert [c.model for c in hello.cards] == ["H100-80GB", "H100-80GB"]
        assert hello.cards[0].memory_total_bytes == 81559 << 20
        assert hello.cards[0].cuda_memory_total_bytes == 81090 << 20
        assert set(hello.engines) == {"standin", "vllm"}
        assert dict(hello.engine_versions) == {"vllm": "0.10.2"}
        assert hello.labels["zone"] == "test"

        version = fleet.desire(spec("r1", model="tiny"))
        await assert_eventually(lambda: fleet.ack(version), what="the Ack")
        assert not fleet.ack(version).rejected  # type: ignore[union-attr]
        healthy = await assert_eventually(
            lambda: next((u for u in fleet.updates_of("r1") if u.phase == HEALTHY), None),
            what="r1 healthy",
        )
        assert healthy.pid > 0 and healthy.gpus == [0] and healthy.engine == "standin"
        async with httpx.AsyncClient(trust_env=False) as http:
            models = (await http.get(f"http://{healthy.address}/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["tiny"]
        assert agent.client.applied_version == version


async def test_same_desired_again_starts_nothing_twice(tmp_path: Path) -> None:
    """Sending the same (replica, revision) again leaves the running process alone."""
    async with running_fake_fleet() as (fleet, port), running_agent(port, tmp_path) as agent:
        await assert_eventually(lambda: fleet.streams)
        fleet.desire(spec("r1"))
        first = await assert_eventually(
            lambda: next((u for u in fleet.updates_of("r1") if u.phase == HEALTHY), None)
        )
        seen = len(fleet.updates)
        again = fleet.desire(spec("r1"))
        await assert_eventually(lambda: fleet.ack(again))
        # The agent decides what to start and stop before it acks a desired set, and its
        # replica set lists stopping replicas too: a restart would show here already.
        observed = [(o.spec.replica_id, o.pid, o.phase) for o in agent.replicas.observed()]
        assert observed == [("r1", first.pid, Phase.HEALTHY)], "no replica changed"
        assert len(fleet.updates) == seen
        assert claims.process_alive(first.pid)


async def test_removed_replica_stops_and_frees_its_card(tmp_path: Path) -> None:
    """A replica left out of the desired set is stopped: STOPPED is reported once its process
    is gone, and the next heartbeat shows its card's memory freed."""
    async with running_fake_fleet() as (fleet, port), running_agent(port, tmp_path):
        await assert_eventually(lambda: fleet.streams)
        fleet.desire(spec("r1", gpus=[1], args=["--load-s", "0.2", "--memory-bytes", "5000"]))
        healthy = await assert_eventually(
            lambda: next((u for u in fleet.updates_of("r1") if u.phase == HEALTHY), None)
        )
        await assert_eventually(
            lambda: fleet.heartbeats and card_used(fleet.heartbeats[-1].message, 1) == 5000,
            what="the claim showing in a heartbeat",
        )
        fleet.desire()
        stopped = await assert_eventually(
            lambda: next((u for u in fleet.updates_of("r1") if u.phase == STOPPED), None)
        )
        assert not claims.process_alive(healthy.pid), "STOPPED only once the process is gone"
        assert stopped.pid == 0
        beats_before = len(fleet.heartbeats)
        await assert_eventually(lambda: len(fleet.heartbeats) > beats_before)
        assert card_used(fleet.heartbeats[-1].message, 1) == 0


async def test_unknown_engine_and_smuggled_args_are_rejected(tmp_path: Path) -> None:
    """An engine the agent's config does not name, shell syntax and a code-loading flag are
    refused in the Ack with their reasons, and nothing of them runs."""
    async with running_fake_fleet() as (fleet, port), running_agent(port, tmp_path) as agent:
        await assert_eventually(lambda: fleet.streams)
        version = fleet.desire(
            spec("bad-engine", engine="sglang-nightly", gpus=[0]),
            spec("bad-shell", args=["--model", "x; rm -rf /"], gpus=[1]),
            spec("bad-flag", engine="vllm", args=["--worker-cls", "evil.Worker"], gpus=[]),
            spec("bad-card", gpus=[7]),
        )
        ack = await assert_eventually(lambda: fleet.ack(version))
        reasons = {r.replica_id: r.reason for r in ack.rejected}
        assert reasons == {
            "bad-engine": "ENGINE_NOT_ALLOWED",
            "bad-shell": "ARGS_REFUSED",
            "bad-flag": "ARGS_REFUSED",
            "bad-card": "GPUS_UNKNOWN",
        }
        assert all(r.message for r in ack.rejected)
        assert agent.replicas.observed() == []


async def test_dropped_stream_reconnects_and_hello_lists_running_replica(tmp_path: Path) -> None:
    """When the fleet drops the stream the agent connects again and its new Hello lists the
    replica, which kept running (same pid) across the reconnect."""
    async with running_fake_fleet() as (fleet, port), running_agent(port, tmp_path):
        await assert_eventually(lambda: fleet.streams)
        version = fleet.desire(spec("r1"))
        healthy = await assert_eventually(
            lambda: next((u for u in fleet.updates_of("r1") if u.phase == HEALTHY), None)
        )
        fleet.drop(grpc.StatusCode.UNAVAILABLE)
        await assert_eventually(lambda: len(fleet.hellos) == 2, what="a second Hello")
        hello = fleet.hellos[1]
        assert hello.applied_version == version
        [replica] = hello.replicas
        assert (replica.replica_id, replica.revision) == ("r1", 1)
        assert replica.phase == HEALTHY and replica.pid == healthy.pid
        assert claims.process_alive(healthy.pid)


async def test_heartbeats_come_on_the_welcomed_interval(tmp_path: Path) -> None:
    """The agent sends heartbeats at the interval the Welcome gave, each with its cards."""
    async with (
        running_fake_fleet(heartbeat_interval_s=1) as (fleet, port),
        running_agent(port, tmp_path),
    ):
        await assert_eventually(lambda: len(fleet.heartbeats) >= 3, timeout_s=6)
    times = [h.at_s for h in fleet.heartbeats[:3]]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(0.7 < g < 1.5 for g in gaps), gaps
    assert [h.message.seq for h in fleet.heartbeats[:3]] == [1, 2, 3]
    assert len(fleet.heartbeats[0].message.cards) == 2


async def test_new_revision_replaces_the_process(tmp_path: Path) -> None:
    """A new revision of a running replica stops the old process before the new one starts."""
    async with running_fake_fleet() as (fleet, port), running_agent(port, tmp_path) as agent:
        await assert_eventually(lambda: fleet.streams)
        fleet.desire(spec("r1", revision=1))
        old = await assert_eventually(
            lambda: next((u for u in fleet.updates_of("r1") if u.phase == HEALTHY), None)
        )
        fleet.desire(spec("r1", revision=2))
        new = await assert_eventually(
            lambda: next(
                (u for u in fleet.updates_of("r1") if u.phase == HEALTHY and u.revision == 2),
                None,
            )
        )
        assert new.pid != old.pid and not claims.process_alive(old.pid)
        order = [(u.revision, u.phase) for u in fleet.updates_of("r1")]
        assert order.index((1, STOPPED)) < order.index((2, agent_pb2.PROCESS_PHASE_STARTING))
        assert [o.phase for o in agent.replicas.observed()] == [Phase.HEALTHY]


# An engine that starts a worker which ignores SIGTERM (as engines' workers may); the worker
# writes its pid next to it once deaf to SIGTERM. The engine never becomes healthy.
FORKING_ENGINE = """
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", WORKER, os.environ["LLMGW_REPLICA_ID"] + ".worker"])
time.sleep(60)
""".replace(
    "WORKER",
    repr(
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
        "time.sleep(60)\n"
    ),
)


async def test_stopping_kills_the_engines_whole_process_group(tmp_path: Path) -> None:
    """A worker the engine started, deaf to SIGTERM, is killed with the engine before the
    replica is reported STOPPED."""
    forking = EngineConfig(
        name="forking",
        program=(sys.executable, "-c", FORKING_ENGINE),
        template=("{args}",),
        rules=ArgRules("standin"),
        stop_grace_s=1.0,
    )
    config = fast_config(engines={"forking": forking})
    async with running_fake_fleet() as (fleet, port), running_agent(port, tmp_path, config=config):
        await assert_eventually(lambda: fleet.streams)
        fleet.desire(spec("r1", engine="forking", args=[]))
        pid_file = tmp_path / "r1.worker"
        await assert_eventually(lambda: pid_file.exists() and pid_file.read_text())
        worker = int(pid_file.read_text())
        try:
            assert claims.process_alive(worker)
            fleet.desire()
            await assert_eventually(lambda: STOPPED in fleet.phases_of("r1"))
            assert not claims.process_alive(worker)
        finally:
            if claims.process_alive(worker):
                os.kill(worker, signal.SIGKILL)
