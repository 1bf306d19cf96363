"""One name per service: server pairs carry `NAME.service.llmgw`, and a client that dials
with the service it expects as its TLS server name refuses another service's certificate of
the same CA (the planner's posing as the fleet), while pairs from before service names are
told apart for `llmgw up` to keep their host-name check."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from llmgw import certs
from llmgw.tls import ServerTLS
from tests.integration.test_fleet_tls import Pki, health, make_pki, tls_fleet


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """A fresh local CA with its fleet and planner pairs and node pairs."""
    return make_pki(tmp_path / "tls")


async def test_an_agent_expecting_the_fleet_refuses_the_planner_certificate(
    pki: Pki, tmp_path: Path
) -> None:
    """A "fleet" serving planner.crt is refused by a node client whose server name is
    fleet.service.llmgw (no answer comes back); the real fleet's pair answers it SERVING."""
    expecting = replace(pki.node("a"), server_name=certs.service_name("fleet"))
    cert, key = pki.local.servers["planner"]
    impostor = ServerTLS(cert=cert, key=key, ca=pki.local.ca_cert)
    async with tls_fleet(tmp_path / "impostor", impostor) as fake:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await health(fake.port, expecting)
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    async with tls_fleet(tmp_path / "real", pki.fleet) as fleet:
        assert await health(fleet.port, expecting) == health_pb2.HealthCheckResponse.SERVING


def test_service_names_tell_new_pairs_from_old(pki: Pki, tmp_path: Path) -> None:
    """A pair issued now names its service and no other; one issued as before (host names
    only) names none, so `llmgw up` keeps checking only the host name for it."""
    fleet_cert = pki.local.servers["fleet"][0]
    assert certs.names_service(fleet_cert, "fleet")
    assert not certs.names_service(fleet_cert, "planner")
    ca = certs.load_ca(pki.folder)
    old = certs.issue(ca, "fleet", dns_or_ips=list(certs.SERVER_NAMES), server=True)
    old_cert, _ = certs.write_pair(tmp_path / "old", "fleet", old)
    assert not certs.names_service(old_cert, "fleet")
