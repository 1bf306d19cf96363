"""The fleet over real mutual TLS with certificates the tests make (llmgw.certs): who is
refused at the handshake, who gets in, and certificate rotation with an agent's stream open."""

from __future__ import annotations

import asyncio
import datetime
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fleet_svc.domain.nodes import Liveness
from fleet_svc.server import FleetOptions, FleetServer, start_fleet
from llmgw import certs
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.scripted_agent import ScriptedAgent
from llmgw.tls import ClientTLS, ServerTLS, aio_channel

FAST = Liveness(interval_s=0.2, grace_heartbeats=3, lost_after_s=1.5)

NODES = ("a", "b")
USERS = ("admin", "operator", "viewer", "alice", "gateway", "fleet-caller")


@dataclass
class Pki:
    """A local CA with a fleet server pair, node pairs a and b, user pairs, and another CA."""

    folder: Path
    local: certs.LocalTLS
    other: certs.Authority

    @property
    def fleet(self) -> ServerTLS:
        """The fleet's pair, requiring clients of the local CA."""
        cert, key = self.local.servers["fleet"]
        return ServerTLS(cert=cert, key=key, ca=self.local.ca_cert)

    def user(self, name: str) -> ClientTLS:
        """User `name`'s pair, trusting the local CA."""
        cert, key = self.local.clients[name]
        return ClientTLS(ca=self.local.ca_cert, cert=cert, key=key)

    def node(self, name: str) -> ClientTLS:
        """Node `name`'s agent pair, trusting the local CA."""
        cert, key = self.local.nodes[name]
        return ClientTLS(ca=self.local.ca_cert, cert=cert, key=key)

    def write(self, stem: str, pair: certs.Pair) -> tuple[Path, Path]:
        """A pair written beside the others."""
        return certs.write_pair(self.folder, stem, pair)


def make_pki(folder: Path) -> Pki:
    """A fresh PKI under `folder`."""
    return Pki(
        folder,
        certs.make_local_tls(folder, servers=("fleet", "planner"), nodes=NODES, clients=USERS),
        certs.new_authority("another CA"),
    )


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """A fresh local CA with its pairs, and another CA."""
    return make_pki(tmp_path / "tls")


@asynccontextmanager
async def tls_fleet(
    data: Path,
    tls: ServerTLS | None,
    *,
    settings: str = "",
    tokens: str = "",
    planner: str = "127.0.0.1:1",
    planner_tls: ClientTLS | None = None,
) -> AsyncIterator[FleetServer]:
    """A fleet on 127.0.0.1:0 with the given transport security; stopped after."""
    server = await start_fleet(
        FleetOptions(
            listen="127.0.0.1:0",
            store_url=str(data / "fleet.db"),
            settings_path=settings,
            liveness=FAST,
            drain_s=0.2,
            tick_s=0.05,
            planner=planner,
            start_timeout_s=30.0,
            tls=tls,
            tokens_path=tokens,
            planner_tls=planner_tls,
        )
    )
    try:
        yield server
    finally:
        await server.stop(grace_s=0.5)


@asynccontextmanager
async def fleet_stub(
    port: int, tls: ClientTLS | None, metadata: Iterable[tuple[str, str]] = ()
) -> AsyncIterator[fleet_pb2_grpc.FleetServiceAsyncStub]:
    """A FleetService stub over a fresh channel."""
    channel = aio_channel(f"127.0.0.1:{port}", tls)
    try:
        yield fleet_pb2_grpc.FleetServiceStub(channel)
    finally:
        await channel.close()


def tls_agent(port: int, node: str, tls: ClientTLS | None, gpus: int = 2) -> ScriptedAgent:
    """A scripted agent of `node` dialling the fleet with `tls`."""
    return ScriptedAgent(f"127.0.0.1:{port}", node, gpus=gpus, tls=tls)


async def health(port: int, tls: ClientTLS | None) -> int:
    """The fleet's health status over a fresh channel."""
    channel = aio_channel(f"127.0.0.1:{port}", tls)
    try:
        answer = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
        return int(answer.status)
    finally:
        await channel.close()


def expired_pair(pki: Pki, uri: str = "spiffe://llmgw/user/admin") -> certs.Pair:
    """A pair of the local CA whose validity ended yesterday."""
    ca = certs.load_ca(pki.folder)
    now = datetime.datetime.now(datetime.UTC)
    return certs.issue(
        ca,
        "old",
        uris=[uri],
        client=True,
        not_before=now - datetime.timedelta(days=30),
        not_after=now - datetime.timedelta(days=1),
    )


async def test_clients_without_a_good_certificate_are_refused(pki: Pki, tmp_path: Path) -> None:
    """No certificate, one from another CA, an expired one, and plaintext: each fails at the
    handshake (UNAVAILABLE, no RPC reaches the fleet), for the API as for Connect, while the
    admin's certificate lists models and node a's opens a stream."""
    other = pki.write("stranger", certs.issue_client(pki.other, "admin"))
    other_node = pki.write("stranger-node", certs.issue_node(pki.other, "a"))
    expired = pki.write("expired", expired_pair(pki))
    ca = pki.local.ca_cert
    refused: dict[str, ClientTLS | None] = {
        "no certificate": ClientTLS(ca=ca),
        "another CA": ClientTLS(ca=ca, cert=other[0], key=other[1]),
        "another CA's node a": ClientTLS(ca=ca, cert=other_node[0], key=other_node[1]),
        "expired": ClientTLS(ca=ca, cert=expired[0], key=expired[1]),
        "plaintext": None,
    }
    async with tls_fleet(tmp_path, pki.fleet) as fleet:
        for what, tls in refused.items():
            async with fleet_stub(fleet.port, tls) as stub:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await stub.ListModels(fleet_pb2.ListModelsRequest(), timeout=10)
                assert caught.value.code() is grpc.StatusCode.UNAVAILABLE, what
            agent = tls_agent(fleet.port, "a", tls)
            agent.start()
            await asyncio.wait_for(agent.closed.wait(), 10)
            assert agent.close_code is grpc.StatusCode.UNAVAILABLE, what
            assert "a" not in fleet.controller.state.nodes, what
        async with fleet_stub(fleet.port, pki.user("admin")) as stub:
            assert list((await stub.ListModels(fleet_pb2.ListModelsRequest())).models) == []
        good = tls_agent(fleet.port, "a", pki.node("a"))
        good.start()
        await assert_eventually(lambda: _connected(fleet, "a"), what="node a connected over mTLS")
        await good.stop()


async def _connected(fleet: FleetServer, node: str) -> bool:
    view = fleet.controller.state.nodes.get(node)
    return view is not None and view.connected


async def test_a_client_that_does_not_trust_the_fleet_refuses_it(pki: Pki, tmp_path: Path) -> None:
    """An agent trusting another CA does not accept the fleet's certificate."""
    cert, key = pki.local.nodes["a"]
    other_ca = pki.folder / "other-ca.crt"
    other_ca.write_bytes(pki.other.cert_pem)
    async with tls_fleet(tmp_path, pki.fleet) as fleet:
        agent = tls_agent(fleet.port, "a", ClientTLS(ca=other_ca, cert=cert, key=key))
        agent.start()
        await asyncio.wait_for(agent.closed.wait(), 10)
        assert agent.close_code is grpc.StatusCode.UNAVAILABLE
        assert "a" not in fleet.controller.state.nodes


async def test_health_needs_no_role_but_the_api_does(pki: Pki, tmp_path: Path) -> None:
    """Over mutual TLS node a's certificate may ask health (no role needed) but not list
    models (a node identity has only Connect)."""
    async with tls_fleet(tmp_path, pki.fleet) as fleet:
        assert await health(fleet.port, pki.node("a")) == health_pb2.HealthCheckResponse.SERVING
        async with fleet_stub(fleet.port, pki.node("a")) as stub:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.ListModels(fleet_pb2.ListModelsRequest(), timeout=10)
        assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "viewer" in (caught.value.details() or "")


async def test_server_tls_without_a_client_ca_admits_no_anonymous_agent(
    pki: Pki, tmp_path: Path
) -> None:
    """With TLS but no client CA, an agent cannot prove its node: Connect is UNAUTHENTICATED
    and nothing of the node it names is kept."""
    cert, key = pki.local.servers["fleet"]
    async with tls_fleet(tmp_path, ServerTLS(cert=cert, key=key)) as fleet:
        agent = tls_agent(fleet.port, "a", ClientTLS(ca=pki.local.ca_cert))
        agent.start()
        await asyncio.wait_for(agent.closed.wait(), 10)
        assert agent.close_code is grpc.StatusCode.UNAUTHENTICATED
        assert "a" not in fleet.controller.state.nodes


async def test_rotation_new_connections_get_the_new_certificate_open_streams_keep_going(
    pki: Pki, tmp_path: Path
) -> None:
    """Replacing the fleet's certificate files while node a's stream is open: a client that
    trusts only the new CA gets in on a new connection, one that trusts only the old no longer
    does, and node a's stream (opened under the old certificate) keeps heartbeating."""
    async with tls_fleet(tmp_path, pki.fleet) as fleet:
        agent = tls_agent(fleet.port, "a", pki.node("a"))
        agent.start()
        await assert_eventually(lambda: _connected(fleet, "a"), what="node a connected")

        new_ca_dir = tmp_path / "new-ca"
        new_ca = certs.init_ca(new_ca_dir)
        new_ca_file = new_ca_dir / certs.CA_CERT
        new_server = certs.issue_server(new_ca, "fleet")
        cert_path, key_path = pki.local.servers["fleet"]
        admin_cert, admin_key = pki.local.clients["admin"]
        trusts_new = ClientTLS(ca=new_ca_file, cert=admin_cert, key=admin_key)
        with pytest.raises(grpc.aio.AioRpcError):
            await health(fleet.port, trusts_new)
        # Key first, then the certificate (as issue_server_files does): a reload between the
        # two sees a pair that does not match and keeps the old one.
        key_path.write_bytes(new_server.key_pem)
        cert_path.write_bytes(new_server.cert_pem)

        assert await health(fleet.port, trusts_new) == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError):
            await health(fleet.port, pki.user("admin"))

        heard = fleet.controller.state.nodes["a"].last_heard_s
        await assert_eventually(
            lambda: _heard_after(fleet, "a", heard), what="node a's stream still heartbeating"
        )
        assert not agent.closed.is_set()
        assert fleet.controller.state.nodes["a"].connected
        await agent.stop()


async def _heard_after(fleet: FleetServer, node: str, since: float) -> bool:
    await asyncio.sleep(0.3)
    return fleet.controller.state.nodes[node].last_heard_s > since


async def test_plaintext_off_loopback_is_refused_without_insecure(tmp_path: Path) -> None:
    """A fleet without certificates will not listen on 0.0.0.0 unless --insecure."""
    from llmgw.tls import TLSConfigError

    with pytest.raises(TLSConfigError, match="loopback"):
        await start_fleet(
            FleetOptions(listen="0.0.0.0:0", store_url=str(tmp_path / "fleet.db"), tick_s=0.05)
        )


def _fleet_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleet_svc", "--store", str(tmp_path / "f.db"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--listen", "0.0.0.0:0"], "loopback"),
        (["--listen", "127.0.0.1:0", "--tls-ca", "ca.crt"], "--tls-cert"),
        (["--listen", "127.0.0.1:0", "--tokens", "/nonexistent/tokens"], "tokens"),
        (["--listen", "127.0.0.1:0", "--planner-tls-cert", "x.crt"], "key"),
    ],
)
def test_the_fleet_refuses_to_start_on_unusable_security_flags(
    tmp_path: Path, args: list[str], says: str
) -> None:
    """Plaintext off loopback, a CA without a pair, a tokens file it cannot read, a planner
    certificate without its key: exit 1 with a sentence saying what to change."""
    done = _fleet_cli(tmp_path, *args)
    assert done.returncode == 1, done.stderr
    assert says in done.stderr


def test_the_fleet_serves_mutual_tls_from_its_flags(pki: Pki, tmp_path: Path) -> None:
    """`python -m fleet_svc --tls-cert --tls-key --tls-ca` serves health over mutual TLS."""
    cert, key = pki.local.servers["fleet"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fleet_svc",
            "--listen",
            "127.0.0.1:0",
            "--store",
            str(tmp_path / "f.db"),
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
            "--tls-ca",
            str(pki.local.ca_cert),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        port = int(line.rsplit(":", 1)[1])
        status = asyncio.run(health(port, pki.user("viewer")))
        assert status == health_pb2.HealthCheckResponse.SERVING
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
