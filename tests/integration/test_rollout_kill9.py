"""A fleet killed with SIGKILL in the middle of a rollout resumes it when started again: the
rollout completes and no replica is started twice."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc

from llmgw.agent.v1 import agent_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.scripted_agent import ScriptedAgent
from tests.integration.test_rollouts import vllm_model
from tests.support.planner import running_planner


@contextmanager
def fleet_process(data: Path, planner: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """`python -m fleet_svc` with fast heartbeats; its process and port."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fleet_svc",
            "--listen",
            "127.0.0.1:0",
            "--store",
            str(data / "fleet.db"),
            "--planner",
            planner,
            "--heartbeat-s",
            "0.5",
            "--drain-s",
            "0",
            "--start-timeout-s",
            "60",
            "--log-format",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=(data / "fleet.log").open("ab"),
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("fleet listening on"), line
        yield proc, int(line.rsplit(":", 1)[1])
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


async def test_kill_9_mid_rollout_resumes_without_duplicates(tmp_path: Path) -> None:
    """SIGKILL while a new replica starts; after a restart the rollout finishes, every new
    replica id is started once, and two replicas serve the new revision."""
    gate = {"hold": True}

    def phase(spec: agent_pb2.ReplicaSpec) -> agent_pb2.ProcessPhase.ValueType:
        if spec.revision >= 2 and gate["hold"]:
            return agent_pb2.PROCESS_PHASE_STARTING
        return agent_pb2.PROCESS_PHASE_HEALTHY

    async with running_planner() as (planner, _p, _c):
        address = f"127.0.0.1:{planner.port}"
        with fleet_process(tmp_path, address) as (proc, port):
            agent = ScriptedAgent(f"127.0.0.1:{port}", "node-0", gpus=4, phase_for=phase)
            agent.start()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = fleet_pb2_grpc.FleetServiceStub(channel)
                await stub.CreateModel(fleet_pb2.CreateModelRequest(model=vllm_model(2)))

                async def ready(n: int) -> bool:
                    rs = (await stub.ListReplicas(fleet_pb2.ListReplicasRequest())).replicas
                    return sum(1 for r in rs if r.phase == fleet_pb2.REPLICA_PHASE_READY) == n

                await assert_eventually(lambda: ready(2), what="2 READY")
                answer = await stub.SetContext(
                    fleet_pb2.SetContextRequest(name="vmodel", tokens=16384)
                )
                await assert_eventually(
                    lambda: any(s.revision == 2 for d in agent.desired for s in d.replicas),
                    what="the first new replica sent to the agent",
                )
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            await agent.stop()
        before = {s.replica_id for d in agent.desired for s in d.replicas if s.revision == 2}
        assert len(before) == 1
        gate["hold"] = False
        with fleet_process(tmp_path, address) as (_proc, port):
            agent.address = f"127.0.0.1:{port}"
            for spec in list(agent.running.values()):
                if spec.revision == 2:
                    agent.report(spec, agent_pb2.PROCESS_PHASE_HEALTHY)
            agent.start()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = fleet_pb2_grpc.FleetServiceStub(channel)
                async for _ in stub.WatchRollout(
                    fleet_pb2.WatchRolloutRequest(id=answer.rollout_id)
                ):
                    pass
                ro = (
                    await stub.GetRollout(fleet_pb2.GetRolloutRequest(id=answer.rollout_id))
                ).rollout
                assert ro.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, ro.reason
                rs = (await stub.ListReplicas(fleet_pb2.ListReplicasRequest())).replicas
                assert sorted((r.revision, r.phase) for r in rs) == [
                    (2, fleet_pb2.REPLICA_PHASE_READY),
                    (2, fleet_pb2.REPLICA_PHASE_READY),
                ]
            started = {s.replica_id for d in agent.desired for s in d.replicas if s.revision == 2}
            assert before <= started and len(started | before) == 2, "no replica started twice"
            await asyncio.sleep(0)
            await agent.stop()
