"""A node's identity is its certificate: over mutual TLS an agent says Hello only as the node
its certificate names, sees only that node's desired set, and reports only that node's
replicas (as Kubernetes' node authorizer limits a kubelet)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

import grpc
import pytest
from structlog.testing import capture_logs

from llmgw.agent.v1 import agent_pb2
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.scripted_agent import ScriptedAgent
from tests.integration.test_fleet_tls import (
    Pki,
    fleet_stub,
    make_pki,
    tls_agent,
    tls_fleet,
)

READY = fleet_pb2.REPLICA_PHASE_READY


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """A fresh local CA with node pairs a and b and user pairs."""
    return make_pki(tmp_path / "tls")


def model(replicas: int) -> common_pb2.Model:
    """`replicas` replicas of two H100s each (one fills a node of the scripted agents)."""
    return common_pb2.Model(
        name="qwen",
        source="hf://Qwen/Qwen3-8B",
        profiles=[
            common_pb2.Profile(
                name="gpu",
                engine="vllm",
                args=["-tp", "2"],
                gpu_class="H100-80GB",
                gpus_per_node=2,
                replicas=replicas,
            )
        ],
    )


async def start(agent: ScriptedAgent) -> ScriptedAgent:
    """Start a scripted agent."""
    agent.start()
    return agent


async def test_a_hello_for_another_node_is_refused_and_nothing_of_it_is_sent(
    pki: Pki, tmp_path: Path
) -> None:
    """Node a's certificate saying Hello as b: PERMISSION_DENIED (NODE_IDENTITY_MISMATCH);
    b's stream is not replaced, and the impostor receives no Welcome and no desired set."""
    async with tls_fleet(tmp_path, pki.fleet) as fleet:
        b = await start(tls_agent(fleet.port, "b", pki.node("b")))
        async with fleet_stub(fleet.port, pki.user("admin")) as stub:
            await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model(1)))

            async def b_ready() -> bool:
                rs = (await stub.ListReplicas(fleet_pb2.ListReplicasRequest())).replicas
                return len(rs) == 1 and rs[0].phase == READY and rs[0].node == "b"

            await assert_eventually(b_ready, what="b's replica READY")
            with capture_logs() as logs:
                impostor = await start(tls_agent(fleet.port, "b", pki.node("a")))
                await asyncio.wait_for(impostor.closed.wait(), 10)
            assert impostor.close_code is grpc.StatusCode.PERMISSION_DENIED
            assert impostor.desired == [] and impostor.running == {}
            assert any(e["event"] == "agent_hello_refused" for e in logs)
            assert not b.closed.is_set()
            assert fleet.controller.state.links["b"] is not None
            assert await b_ready()
        await b.stop()


async def test_a_user_certificate_cannot_connect_as_an_agent(pki: Pki, tmp_path: Path) -> None:
    """The admin's certificate is not a node's: Connect is PERMISSION_DENIED."""
    async with tls_fleet(tmp_path, pki.fleet) as fleet:
        agent = await start(tls_agent(fleet.port, "admin", pki.user("admin")))
        await asyncio.wait_for(agent.closed.wait(), 10)
        assert agent.close_code is grpc.StatusCode.PERMISSION_DENIED
        assert "admin" not in fleet.controller.state.nodes


async def test_a_node_sees_only_its_own_replicas_and_cannot_report_another_nodes(
    pki: Pki, tmp_path: Path
) -> None:
    """With one replica on each of a and b: a's desired sets never name b's replica; a
    reporting b's replica HEALTHY at its own address, CRASHED, or refused in an Ack changes
    nothing (the report is dropped and logged), and the endpoint watch never shows a's
    address for it."""
    async with tls_fleet(tmp_path, pki.fleet) as fleet:
        a = await start(tls_agent(fleet.port, "a", pki.node("a")))
        b = await start(tls_agent(fleet.port, "b", pki.node("b")))
        async with fleet_stub(fleet.port, pki.user("admin")) as stub:
            await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model(2)))

            async def both_ready() -> list[fleet_pb2.Replica]:
                rs = list((await stub.ListReplicas(fleet_pb2.ListReplicasRequest())).replicas)
                ok = len(rs) == 2 and all(r.phase == READY for r in rs)
                return rs if ok and {r.node for r in rs} == {"a", "b"} else []

            await assert_eventually(both_ready, what="one READY replica on each node")
            rs = await both_ready()
            on_b = next(r for r in rs if r.node == "b")
            on_a = next(r for r in rs if r.node == "a")
            seen_by_a = {s.replica_id for d in a.desired for s in d.replicas}
            assert seen_by_a == {on_a.id}
            assert on_b.id not in {s.replica_id for d in a.desired for s in d.replicas}
            assert {s.replica_id for d in b.desired for s in d.replicas} == {on_b.id}

            watch = stub.WatchReplicas(fleet_pb2.WatchReplicasRequest(), timeout=30)
            events: list[fleet_pb2.WatchReplicasResponse] = []

            async def collect() -> None:
                async for event in watch:
                    events.append(event)

            collector = asyncio.create_task(collect())
            stolen = "10.6.6.6:6666"
            with capture_logs() as logs:
                for phase in (agent_pb2.PROCESS_PHASE_HEALTHY, agent_pb2.PROCESS_PHASE_CRASHED):
                    a._out.put_nowait(
                        agent_pb2.ConnectRequest(
                            update=agent_pb2.ReplicaUpdate(
                                replica=agent_pb2.ObservedReplica(
                                    replica_id=on_b.id,
                                    revision=on_b.revision,
                                    phase=phase,
                                    address=stolen,
                                    gpus=list(on_b.gpus),
                                )
                            )
                        )
                    )
                a._out.put_nowait(
                    agent_pb2.ConnectRequest(
                        ack=agent_pb2.Ack(
                            version=a.desired[-1].version,
                            rejected=[
                                agent_pb2.Rejection(
                                    replica_id=on_b.id,
                                    revision=on_b.revision,
                                    reason="ARGS_REFUSED",
                                    message="forged",
                                )
                            ],
                        )
                    )
                )

                async def dropped() -> bool:
                    return (
                        sum(
                            1
                            for e in logs
                            if e["event"] == "replica_report_dropped" and e.get("node") == "a"
                        )
                        >= 2
                    )

                await assert_eventually(dropped, what="a's reports of b's replica dropped")
                await asyncio.sleep(0.5)
            after = {
                r.id: r for r in (await stub.ListReplicas(fleet_pb2.ListReplicasRequest())).replicas
            }
            assert after[on_b.id].phase == READY
            assert after[on_b.id].node == "b"
            assert after[on_b.id].address == on_b.address != stolen
            collector.cancel()
            addresses = {e.endpoint.address for e in events if e.HasField("endpoint")}
            assert stolen not in addresses
        await a.stop()
        await b.stop()


async def _agent_process(
    port: int, tmp_path: Path, args: list[str], env: dict[str, str]
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "fleet_svc.agent",
        "--fleet",
        f"127.0.0.1:{port}",
        "--gpus",
        "1xL4-24GB",
        "--state-dir",
        str(tmp_path / "agent"),
        "--log-format",
        "json",
        *args,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


async def _stop(proc: asyncio.subprocess.Process) -> bytes:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    return err


async def _log_until(proc: asyncio.subprocess.Process, needle: bytes, timeout_s: float) -> bytes:
    """The agent's log up to the first line holding `needle` (what it wrote by `timeout_s`, or
    before it exited, when no line does): the fleet seeing the node connected comes before the
    agent reads its Welcome, so stopping it then may be too early for the line."""
    assert proc.stderr is not None
    stderr = proc.stderr
    seen = bytearray()

    async def read() -> None:
        while line := await stderr.readline():
            seen.extend(line)
            if needle in line:
                return

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(read(), timeout_s)
    return bytes(seen)


@pytest.mark.parametrize("how", ["flags", "environment"])
async def test_the_agent_connects_over_mutual_tls_as_its_certificates_node(
    pki: Pki, tmp_path: Path, how: str
) -> None:
    """`python -m fleet_svc.agent` with node a's pair (flags, or LLMGW_TLS_*) and no --node
    is welcomed as node a by a fleet requiring client certificates."""
    ca, (cert, key) = pki.local.ca_cert, pki.local.nodes["a"]
    if how == "flags":
        args, env = ["--tls-ca", str(ca), "--tls-cert", str(cert), "--tls-key", str(key)], {}
    else:
        args, env = (
            [],
            {"LLMGW_TLS_CA": str(ca), "LLMGW_TLS_CERT": str(cert), "LLMGW_TLS_KEY": str(key)},
        )
    async with tls_fleet(tmp_path, pki.fleet) as fleet:
        proc = await _agent_process(fleet.port, tmp_path, args, env)
        try:

            async def connected() -> bool:
                view = fleet.controller.state.nodes.get("a")
                return view is not None and view.connected

            await assert_eventually(connected, timeout_s=30, what="node a over mTLS")
            welcomed = await _log_until(proc, b"stream_welcomed", 30)
        finally:
            err = await _stop(proc)
        assert b"stream_welcomed" in welcomed, err


async def test_the_agent_naming_another_node_is_refused(pki: Pki, tmp_path: Path) -> None:
    """The agent with node a's pair and --node b keeps being refused; b never appears."""
    ca, (cert, key) = pki.local.ca_cert, pki.local.nodes["a"]
    args = ["--tls-ca", str(ca), "--tls-cert", str(cert), "--tls-key", str(key), "--node", "b"]
    async with tls_fleet(tmp_path, pki.fleet) as fleet:
        proc = await _agent_process(fleet.port, tmp_path, args, {})
        await asyncio.sleep(3)
        err = await _stop(proc)
        assert "b" not in fleet.controller.state.nodes
    assert b"PERMISSION_DENIED" in err


async def test_a_real_agent_refuses_hostile_sources_and_starts_nothing_of_them(
    tmp_path: Path,
) -> None:
    """Whatever a (compromised) fleet sends, the agent checks the source again: a flag, a
    revision climbing out, a path outside its roots and a symlink leading out are refused in
    the Ack (SOURCE_REFUSED) and never started; a path under a root runs."""
    from fleet_svc.agent.config import module_engine
    from llmgw.testing.fake_fleet import running_fake_fleet, spec
    from tests.support.agents import fast_config, running_agent

    root = tmp_path / "models"
    root.mkdir()
    (root / "ok.gguf").write_bytes(b"GGUF")
    (tmp_path / "secret.gguf").write_bytes(b"GGUF")
    (root / "link.gguf").symlink_to(tmp_path / "secret.gguf")
    # The stand-in, given the source as its served model name: an engine that takes it.
    takes_source = module_engine(
        "pathy",
        "fleet_svc.standin",
        ("--host", "{host}", "--port", "{port}", "--model", "{source}", "--engine", "{engine}"),
        "standin",
        start_timeout_s=30.0,
        stop_grace_s=5.0,
    )
    assert takes_source.rules.needs_source
    config = fast_config(engines={"pathy": takes_source}, source_roots=(os.path.realpath(root),))
    sources = {
        "flag": "--trust-remote-code",
        "climb": "hf://org/name@main/../../../../tmp/x",
        "outside": str(tmp_path / "secret.gguf"),
        "link": str(root / "link.gguf"),
        "ok": str(root / "ok.gguf"),
    }
    async with (
        running_fake_fleet() as (fleet, port),
        running_agent(port, tmp_path / "state", gpus="8xH100-80GB", config=config) as agent,
    ):
        await assert_eventually(lambda: fleet.streams, what="the agent connecting")
        specs = []
        for i, (rid, source) in enumerate(sources.items()):
            s = spec(rid, engine="pathy", gpus=[i])
            s.source = source
            specs.append(s)
        version = fleet.desire(*specs)
        ack = await assert_eventually(lambda: fleet.ack(version), what="the Ack")
        reasons = {r.replica_id: r.reason for r in ack.rejected}
        assert reasons == {rid: "SOURCE_REFUSED" for rid in ("flag", "climb", "outside", "link")}
        link = next(r for r in ack.rejected if r.replica_id == "link")
        assert "secret" not in link.message  # where the link leads is not told
        await assert_eventually(
            lambda: any(u.phase == agent_pb2.PROCESS_PHASE_HEALTHY for u in fleet.updates_of("ok")),
            timeout_s=30,
            what="the replica under the root healthy",
        )
        assert {o.spec.replica_id for o in agent.replicas.observed()} == {"ok"}
