"""One name per service: server pairs carry `NAME.service.llmgw`, and a client that dials
with the service it expects as its TLS server name refuses another service's certificate of
the same CA (the planner's posing as the fleet), while pairs from before service names are
told apart for `llmgw up` to keep their host-name check."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2

from llmgw import certs
from llmgw.cmdline import EXIT_UNREACHABLE
from llmgw.fleet.v1 import fleet_pb2
from llmgw.tls import ServerTLS
from planner_svc.server import start_planner
from tests.integration.test_fleet_auth import error_info, llama
from tests.integration.test_fleet_tls import Pki, fleet_stub, health, make_pki, tls_fleet


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


async def _cli(*args: str) -> tuple[int, str]:
    """Run `llmgw ARGS…` as a process (no local `llmgw up` folder); its exit code and stderr."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmgw.cli.main",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env | {"LLMGW_DATA": "/nonexistent-llmgw-data"},
    )
    _, err = await proc.communicate()
    return proc.returncode or 0, err.decode()


def _flags(pki: Pki, user: str = "admin") -> list[str]:
    """`--tls-ca/--tls-cert/--tls-key` of `user`'s pair."""
    cert, key = pki.local.clients[user]
    return ["--tls-ca", str(pki.local.ca_cert), "--tls-cert", str(cert), "--tls-key", str(key)]


async def test_ctl_pointed_at_the_planner_is_refused_with_a_clear_message(pki: Pki) -> None:
    """`llmgw ctl model list` given the planner's address, with a valid pair of the CA, is
    refused (exit 3, unreachable) saying the certificate does not name fleet.service.llmgw;
    `llmgw plan` at the same planner is served, and at the fleet is refused the same way."""
    cert, key = pki.local.servers["planner"]
    planner = await start_planner(
        "127.0.0.1:0", tls=ServerTLS(cert=cert, key=key, ca=pki.local.ca_cert)
    )
    try:
        at = f"127.0.0.1:{planner.port}"
        code, err = await _cli("ctl", "--fleet", at, *_flags(pki), "model", "list")
        assert code == EXIT_UNREACHABLE, err
        assert "fleet.service.llmgw" in err and "another service" in err
        _, err = await _cli("plan", "--planner", at, *_flags(pki), "describe", "hf://x/y")
        assert "service.llmgw" not in err and "certificate" not in err
    finally:
        await planner.stop(0.5)


async def test_plan_pointed_at_the_fleet_is_refused(pki: Pki, tmp_path: Path) -> None:
    """`llmgw plan` given the fleet's address is refused: its certificate does not name
    planner.service.llmgw."""
    async with tls_fleet(tmp_path, pki.fleet) as fleet:
        at = f"127.0.0.1:{fleet.port}"
        code, err = await _cli("plan", "--planner", at, *_flags(pki), "describe", "hf://x/y")
    assert code == EXIT_UNREACHABLE, err
    assert "planner.service.llmgw" in err


async def test_the_fleet_refuses_a_planner_presenting_the_fleet_certificate(
    pki: Pki, tmp_path: Path
) -> None:
    """A "planner" serving fleet.crt is never asked: the fleet's SetGPUs answers
    PLANNER_UNAVAILABLE, nothing changes; the real planner's pair is served."""
    cert, key = pki.local.servers["fleet"]
    impostor = await start_planner(
        "127.0.0.1:0", tls=ServerTLS(cert=cert, key=key, ca=pki.local.ca_cert)
    )
    try:
        async with (
            tls_fleet(
                tmp_path,
                pki.fleet,
                planner=f"127.0.0.1:{impostor.port}",
                planner_tls=pki.user("admin"),
            ) as fleet,
            fleet_stub(fleet.port, pki.user("admin")) as admin,
        ):
            await admin.CreateModel(fleet_pb2.CreateModelRequest(model=llama()))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await admin.SetContext(
                    fleet_pb2.SetContextRequest(name="llama", tokens=16384), timeout=30
                )
            assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
            info = error_info(caught.value)
            assert info.reason == "PLANNER_UNAVAILABLE"
            model = await admin.GetModel(fleet_pb2.GetModelRequest(name="llama"))
            assert model.model.revision == 1
    finally:
        await impostor.stop(0.5)
