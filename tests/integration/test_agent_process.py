"""The node agent as its own process: its command line, config file, demo mode and shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from fleet_svc.agent import claims
from llmgw.agent.v1 import agent_pb2
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.fake_fleet import FakeFleet, running_fake_fleet, spec

ROOT = Path(__file__).resolve().parents[2]
HEALTHY = agent_pb2.PROCESS_PHASE_HEALTHY
STARTING = agent_pb2.PROCESS_PHASE_STARTING

CONFIG = """\
health_interval_s: 0.1
health_timeout_s: 1
restart: {base_s: 0.2, factor: 2, cap_s: 1, jitter: 0}
engines:
  standin:
    module: fleet_svc.standin
    args: ["--host", "{host}", "--port", "{port}", "--model", "{model}", "{args}"]
    start_timeout_s: 20
    stop_grace_s: 2
"""


@asynccontextmanager
async def agent_process(
    port: int, state_dir: Path, *extra: str, config: Path | None = None
) -> AsyncIterator[asyncio.subprocess.Process]:
    """`python -m fleet_svc.agent` against the fleet on `port`; killed after if still up."""
    args: Sequence[str] = [
        "--fleet",
        f"127.0.0.1:{port}",
        "--node",
        "proc-node",
        "--gpus",
        "2xL4-24GB",
        "--state-dir",
        str(state_dir),
        "--label",
        "rack=r1",
        *(["--config", str(config)] if config else []),
        *extra,
    ]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "fleet_svc.agent",
        *args,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def stop_agent(proc: asyncio.subprocess.Process) -> tuple[int, str]:
    """SIGTERM the agent; its exit code and its log."""
    proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), timeout=20)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


async def healthy(fleet: FakeFleet, replica_id: str) -> agent_pb2.ObservedReplica:
    """Wait for the replica's HEALTHY report."""
    return await assert_eventually(
        lambda: next((u for u in fleet.updates_of(replica_id) if u.phase == HEALTHY), None),
        timeout_s=20,
    )


async def test_sigterm_stops_the_replicas_it_runs(tmp_path: Path) -> None:
    """By default an agent told to stop stops its engines first, then exits 0, its log
    JSON events with the node bound."""
    config = tmp_path / "agent.yaml"
    config.write_text(CONFIG)
    async with running_fake_fleet() as (fleet, port):
        async with agent_process(port, tmp_path / "state", config=config) as proc:
            await assert_eventually(lambda: fleet.streams, timeout_s=20)
            hello = fleet.hellos[0]
            assert hello.node_name == "proc-node" and dict(hello.labels) == {"rack": "r1"}
            assert [c.memory_total_bytes for c in hello.cards] == [23034 << 20] * 2
            assert list(hello.engines) == ["standin"]
            fleet.desire(spec("r1"))
            up = await healthy(fleet, "r1")
            code, log = await stop_agent(proc)
        assert code == 0
        assert not claims.process_alive(up.pid)
        assert '"event": "replica_stopped"' in log and '"node": "proc-node"' in log


async def test_left_replicas_are_adopted_by_the_next_agent(tmp_path: Path) -> None:
    """With --leave-replicas the engine outlives the agent; the next agent on the same state
    dir adopts it, lists it in its Hello, and starts nothing for the same desired set."""
    config = tmp_path / "agent.yaml"
    config.write_text(CONFIG)
    state = tmp_path / "state"
    async with running_fake_fleet() as (fleet, port):
        async with agent_process(port, state, "--leave-replicas", config=config) as proc:
            await assert_eventually(lambda: fleet.streams, timeout_s=20)
            fleet.desire(spec("r1"))
            up = await healthy(fleet, "r1")
            code, _ = await stop_agent(proc)
        assert code == 0 and claims.process_alive(up.pid), "the engine was left running"
        try:
            updates_before = len(fleet.updates)
            async with agent_process(port, state, config=config) as proc:
                await assert_eventually(lambda: len(fleet.hellos) == 2, timeout_s=20)
                [replica] = fleet.hellos[1].replicas
                assert replica.replica_id == "r1" and replica.pid == up.pid
                version = fleet.desire(spec("r1"))
                await assert_eventually(lambda: fleet.ack(version), timeout_s=10)
                # The agent decides what to start and stop before it acks a desired set, and
                # a Hello lists every replica it has, stopping ones too: the Hello after a
                # reconnect shows whether it started or stopped anything for this set.
                fleet.drop()
                await assert_eventually(lambda: len(fleet.hellos) == 3, timeout_s=20)
                listed = [(r.replica_id, r.pid) for r in fleet.hellos[2].replicas]
                assert listed == [("r1", up.pid)], "no second process"
                later = fleet.updates[updates_before:]
                assert all(u.pid in (0, up.pid) for u in later), "no second process"
                code, _ = await stop_agent(proc)
            assert not claims.process_alive(up.pid), "the adopting agent stopped it"
        finally:
            if claims.process_alive(up.pid):
                os.killpg(up.pid, signal.SIGKILL)


async def test_demo_stands_in_for_engines_and_shows_their_refusal(tmp_path: Path) -> None:
    """--demo runs vLLM profiles on the stand-in: a fitting one becomes healthy, one whose
    tensor parallel size does not match its cards crashes with the engine's error in the
    reported log lines."""
    async with running_fake_fleet() as (fleet, port):
        async with agent_process(port, tmp_path / "state", "--demo") as proc:
            await assert_eventually(lambda: fleet.streams, timeout_s=20)
            assert {"standin", "vllm", "sglang", "trtllm"} <= set(fleet.hellos[0].engines)
            fleet.desire(
                spec("ok", engine="vllm", args=["--tensor-parallel-size", "1"], gpus=[0]),
                spec("bad", engine="vllm", args=["--tensor-parallel-size", "2"], gpus=[1]),
            )
            await healthy(fleet, "ok")
            crash = await assert_eventually(
                lambda: next((u for u in fleet.updates_of("bad") if u.log_tail), None),
                timeout_s=20,
            )
            assert any("tensor parallel size 2" in line for line in crash.log_tail)
            code, _ = await stop_agent(proc)
        assert code == 0
