"""llmgw.tls and llmgw.identity against real grpc servers on 127.0.0.1: the peer identity a
call carries, and the certificate reloader's decisions."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llmgw import certs
from llmgw.identity import Identity, peer_identity
from llmgw.tls import CertificateReloader, ClientTLS, ServerTLS, TLSConfigError, aio_channel, bind


class WhoAsks(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """A health service that records the identity of each caller."""

    def __init__(self) -> None:
        self.seen: list[Identity | None] = []

    async def Check(
        self,
        request: health_pb2.HealthCheckRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> health_pb2.HealthCheckResponse:
        self.seen.append(peer_identity(context))
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


@pytest.fixture
def local(tmp_path: Path) -> certs.LocalTLS:
    """A CA with the planner's, node local's and admin's pairs."""
    return certs.make_local_tls(tmp_path, servers=("planner",), clients=("admin",))


async def serve(tls: ServerTLS | None) -> tuple[grpc.aio.Server, int, WhoAsks]:
    """A started server with WhoAsks on 127.0.0.1."""
    server = grpc.aio.server()
    who = WhoAsks()
    health_pb2_grpc.add_HealthServicer_to_server(who, server)
    port = bind(server, "127.0.0.1:0", tls)
    await server.start()
    return server, port, who


async def ask(port: int, tls: ClientTLS | None) -> None:
    """One Check."""
    channel = aio_channel(f"127.0.0.1:{port}", tls)
    try:
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    finally:
        await channel.close()


async def test_the_peer_identity_is_the_client_certificates_spiffe_id(
    local: certs.LocalTLS,
) -> None:
    """Over mutual TLS a user pair reads as that user and a node pair as that node."""
    cert, key = local.servers["planner"]
    server, port, who = await serve(ServerTLS(cert, key, local.ca_cert))
    try:
        admin = local.clients["admin"]
        node = local.nodes["local"]
        await ask(port, ClientTLS(local.ca_cert, *admin))
        await ask(port, ClientTLS(local.ca_cert, *node))
    finally:
        await server.stop(0)
    assert who.seen == [Identity("user", "admin"), Identity("node", "local")]


async def test_no_client_certificate_is_no_identity(local: certs.LocalTLS) -> None:
    """Server-only TLS and plaintext calls carry no identity (None), even when the client
    has a pair to show."""
    cert, key = local.servers["planner"]
    admin = local.clients["admin"]
    tls_server, tls_port, tls_who = await serve(ServerTLS(cert, key))
    plain_server, plain_port, plain_who = await serve(None)
    try:
        await ask(tls_port, ClientTLS(local.ca_cert, *admin))
        await ask(tls_port, ClientTLS(local.ca_cert))
        await ask(plain_port, None)
    finally:
        await tls_server.stop(0)
        await plain_server.stop(0)
    assert tls_who.seen == [None, None]
    assert plain_who.seen == [None]


def test_the_reloader_takes_only_whole_changed_pairs(local: certs.LocalTLS) -> None:
    """Unchanged files: None; a new certificate beside the old key: None (deferred); the new
    key as well: a new configuration; files that are not a pair at start: TLSConfigError."""
    cert, key = local.servers["planner"]
    reloader = CertificateReloader(ServerTLS(cert, key, local.ca_cert))
    assert reloader() is None
    fresh = certs.issue_server(certs.load_ca(local.folder), "planner")
    cert.write_bytes(fresh.cert_pem)
    assert reloader() is None
    assert reloader.reloads == 0
    key.write_bytes(fresh.key_pem)
    assert reloader() is not None
    assert reloader.reloads == 1
    assert reloader() is None
    node_cert, _ = local.nodes["local"]
    with pytest.raises(TLSConfigError, match="not the private key"):
        CertificateReloader(ServerTLS(node_cert, key))
    with pytest.raises(TLSConfigError, match="cannot be read"):
        CertificateReloader(ServerTLS(cert.with_name("missing.crt"), key))


async def test_a_server_name_override_checks_the_certificate_against_that_name(
    tmp_path: Path,
) -> None:
    """A server whose certificate names only `fleet.internal` is refused when dialled as
    127.0.0.1, and accepted with server_name="fleet.internal"."""
    ca = certs.init_ca(tmp_path)
    cert, key = certs.write_pair(
        tmp_path, "named", certs.issue(ca, "fleet", dns_or_ips=["fleet.internal"], server=True)
    )
    server, port, who = await serve(ServerTLS(cert, key))
    try:
        with pytest.raises(grpc.aio.AioRpcError):
            await ask(port, ClientTLS(ca=tmp_path / "ca.crt"))
        await ask(port, ClientTLS(ca=tmp_path / "ca.crt", server_name="fleet.internal"))
    finally:
        await server.stop(0)
    assert who.seen == [None]
