"""The planner over real TLS with certificates the tests make: who is refused, who answers,
health and reflection over mutual TLS, certificate rotation without a restart, and the
loopback-only rule for plaintext."""

from __future__ import annotations

import asyncio
import datetime
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from llmgw import certs
from llmgw.common.v1 import common_pb2
from llmgw.planner.v1 import planner_pb2, planner_pb2_grpc
from llmgw.tls import ClientTLS, ServerTLS, TLSConfigError, aio_channel
from planner_svc.rpc.servicer import SERVICE_NAME
from planner_svc.server import PlannerServer, start_planner
from tests.support.shapes import LLAMA_31_8B, inline

ROOT = Path(__file__).resolve().parents[2]

# Llama-3.1-8B given inline (tests/support/shapes.py), so the planner reads no source.
LLAMA_8B = inline(LLAMA_31_8B)
SIZE = planner_pb2.SizeContextRequest(
    model=common_pb2.Model(
        name="m",
        shape=LLAMA_8B,
        context_length=8192,
        profiles=[
            common_pb2.Profile(
                name="gpu",
                engine="vllm",
                args=["--max-model-len", "8192"],
                gpu_class="H100-80GB",
                gpus_per_node=1,
            )
        ],
    ),
    tokens=16384,
)


@dataclass
class Pki:
    """The test's CA folder (`certs.make_local_tls`) and a second, unrelated CA."""

    folder: Path
    local: certs.LocalTLS
    other: certs.Authority

    @property
    def server(self) -> ServerTLS:
        """The planner's pair; clients must be signed by the local CA."""
        cert, key = self.local.servers["planner"]
        return ServerTLS(cert=cert, key=key, ca=self.local.ca_cert)

    def client(self, user: str = "admin") -> ClientTLS:
        """A client of the local CA, trusting it."""
        cert, key = self.local.clients[user]
        return ClientTLS(ca=self.local.ca_cert, cert=cert, key=key)

    def write(self, stem: str, pair: certs.Pair) -> tuple[Path, Path]:
        """A pair written beside the others."""
        return certs.write_pair(self.folder, stem, pair)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """A fresh local CA with its pairs, and another CA."""
    folder = tmp_path / "tls"
    return Pki(folder, certs.make_local_tls(folder), certs.new_authority("another CA"))


@pytest.fixture
async def planner(pki: Pki) -> AsyncIterator[PlannerServer]:
    """A planner on 127.0.0.1 requiring client certificates of the local CA."""
    server = await start_planner("127.0.0.1:0", tls=pki.server)
    yield server
    await server.stop(grace_s=0.5)


async def check(address: str, tls: ClientTLS | None) -> health_pb2.HealthCheckResponse:
    """One health Check over a fresh channel."""
    channel = aio_channel(address, tls)
    try:
        return await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=10
        )
    finally:
        await channel.close()


async def test_a_client_of_the_ca_answers_health_reflection_and_the_planner(
    pki: Pki, planner: PlannerServer
) -> None:
    """Over mutual TLS a certificate of the CA gets health, reflection and SizeContext."""
    address = f"127.0.0.1:{planner.port}"
    assert (await check(address, pki.client())).status == health_pb2.HealthCheckResponse.SERVING
    channel = aio_channel(address, pki.client("viewer"))
    try:
        sized = await planner_pb2_grpc.PlannerServiceStub(channel).SizeContext(SIZE, timeout=10)
        assert list(sized.profiles[0].args) == ["--max-model-len", "16384"]
        reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = [
            reply
            async for reply in reflect.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
            )
        ]
        names = {s.name for s in replies[0].list_services_response.service}
        assert SERVICE_NAME in names
    finally:
        await channel.close()


def expired_pair(pki: Pki) -> certs.Pair:
    """A client pair of the local CA whose validity ended yesterday."""
    ca = certs.load_ca(pki.folder)
    now = datetime.datetime.now(datetime.UTC)
    return certs.issue(
        ca,
        "old",
        uris=["spiffe://llmgw/user/old"],
        client=True,
        not_before=now - datetime.timedelta(days=30),
        not_after=now - datetime.timedelta(days=1),
    )


async def test_clients_without_a_good_certificate_are_refused(
    pki: Pki, planner: PlannerServer
) -> None:
    """No certificate, one from another CA, an expired one, and plaintext: each is refused
    at the handshake (UNAVAILABLE), while a good client on the same server answers."""
    address = f"127.0.0.1:{planner.port}"
    other = pki.write("stranger", certs.issue_client(pki.other, "admin"))
    expired = pki.write("expired", expired_pair(pki))
    refused = {
        "no certificate": ClientTLS(ca=pki.local.ca_cert),
        "another CA": ClientTLS(ca=pki.local.ca_cert, cert=other[0], key=other[1]),
        "expired": ClientTLS(ca=pki.local.ca_cert, cert=expired[0], key=expired[1]),
        "plaintext": None,
    }
    for what, tls in refused.items():
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await check(address, tls)
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE, what
    assert (await check(address, pki.client())).status == health_pb2.HealthCheckResponse.SERVING


async def test_a_client_that_does_not_trust_the_server_refuses_it(
    pki: Pki, planner: PlannerServer
) -> None:
    """A client trusting another CA does not accept the planner's certificate."""
    cert, key = pki.local.clients["admin"]
    other_ca = pki.folder / "other-ca.crt"
    other_ca.write_bytes(pki.other.cert_pem)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await check(f"127.0.0.1:{planner.port}", ClientTLS(ca=other_ca, cert=cert, key=key))
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE


async def test_rotation_serves_new_connections_the_new_certificate(
    pki: Pki, planner: PlannerServer
) -> None:
    """Replacing the server's files: new connections get the new certificate (a client
    trusting only the new CA gets in, one trusting only the old one no longer does), a key
    that does not match yet keeps the old pair, and a Watch stream opened before keeps going."""
    address = f"127.0.0.1:{planner.port}"
    admin_cert, admin_key = pki.local.clients["admin"]
    new_ca_file = pki.folder / "new-ca.crt"
    new_ca_file.write_bytes(pki.other.cert_pem)
    trusts_new = ClientTLS(ca=new_ca_file, cert=admin_cert, key=admin_key)
    with pytest.raises(grpc.aio.AioRpcError):
        await check(address, trusts_new)

    old = aio_channel(address, pki.client())
    try:
        watch = health_pb2_grpc.HealthStub(old).Watch(
            health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=30
        )
        first = await watch.read()
        assert first.status == health_pb2.HealthCheckResponse.SERVING

        new_pair = certs.issue_server(pki.other, "planner")
        cert_path, key_path = planner_files = pki.server.cert, pki.server.key
        # Half-way: the new certificate beside the old key. The server keeps the old pair.
        cert_path.write_bytes(new_pair.cert_pem)
        assert (await check(address, pki.client())).status == 1
        # Whole: the new key too.
        key_path.write_bytes(new_pair.key_pem)
        assert planner_files == (pki.server.cert, pki.server.key)
        assert (await check(address, trusts_new)).status == 1
        with pytest.raises(grpc.aio.AioRpcError):
            await check(address, pki.client())

        # The stream opened before rotation still carries news.
        await planner.health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
        update = await asyncio.wait_for(watch.read(), 10)
        assert update.status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()
    finally:
        await old.close()


async def test_plaintext_is_refused_off_loopback() -> None:
    """Without certificates a planner will not listen on 0.0.0.0 unless told --insecure."""
    with pytest.raises(TLSConfigError, match="loopback only"):
        await start_planner("0.0.0.0:0")


def test_the_planner_process_takes_the_tls_flags(pki: Pki) -> None:
    """`python -m planner_svc --tls-cert --tls-key --tls-ca` serves mutual TLS; plaintext on
    0.0.0.0 without --insecure exits 1 saying why."""
    refused = subprocess.run(
        [sys.executable, "-m", "planner_svc", "--listen", "0.0.0.0:0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert refused.returncode == 1
    assert "--insecure" in refused.stderr
    tls = pki.server
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "planner_svc",
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            str(tls.cert),
            "--tls-key",
            str(tls.key),
            "--tls-ca",
            str(tls.ca),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        found = re.search(r"listening on (\S+:\d+)", proc.stdout.readline())
        assert found is not None
        reply = asyncio.run(check(found.group(1), pki.client()))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.aio.AioRpcError):
            asyncio.run(check(found.group(1), None))
    finally:
        proc.terminate()
        proc.wait(timeout=20)
