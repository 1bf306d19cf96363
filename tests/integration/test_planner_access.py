"""The planner behind the fleet's roles and revoked list, over real mutual TLS on 127.0.0.1:
who may call it, a revocation or malformed edit of the settings taking effect while it runs,
and a call running for a revoked caller ended."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from llmgw import certs
from llmgw.planner.v1 import planner_pb2, planner_pb2_grpc
from llmgw.shape import ModelShape
from llmgw.testing.eventually import assert_eventually
from llmgw.tls import ClientTLS, ServerTLS, aio_channel
from planner_svc.server import PlannerServer, start_planner
from tests.integration.test_planner_tls import SIZE

CUT_S = 15
"""How long a test waits for a revocation to show (the planner looks every second): a bound
on a hang, not a timing assertion."""


class Local:
    """A CA with the planner's pair, callers admin, viewer, fleet and alice, and node gpu-1."""

    def __init__(self, folder: Path) -> None:
        self.tls = certs.make_local_tls(
            folder,
            servers=("planner",),
            nodes=("gpu-1",),
            clients=("admin", "viewer", "fleet", "alice"),
        )

    @property
    def server(self) -> ServerTLS:
        """The planner's pair, clients of the CA required."""
        cert, key = self.tls.servers["planner"]
        return ServerTLS(cert=cert, key=key, ca=self.tls.ca_cert)

    def client(self, user: str) -> ClientTLS:
        """Caller `user`'s pair (`node-NAME` for a node's)."""
        pairs = {**self.tls.clients, **{f"node-{n}": p for n, p in self.tls.nodes.items()}}
        cert, key = pairs[user]
        return ClientTLS(ca=self.tls.ca_cert, cert=cert, key=key)


@pytest.fixture
def local(tmp_path: Path) -> Local:
    """A fresh local CA."""
    return Local(tmp_path / "tls")


class StuckResolver:
    """A resolver whose every resolution waits until released: a fetch that takes long."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()

    async def resolve(self, source: str, files: Any = (), *, caller: Any = "") -> ModelShape:
        """Wait for `release` (never set here), as a slow Hub would."""
        self.started.set()
        await self.release.wait()
        raise AssertionError("never released")


@asynccontextmanager
async def planner(
    local: Local, settings: Path | None = None, resolver: Any = None
) -> AsyncIterator[PlannerServer]:
    """A planner on 127.0.0.1 over mutual TLS, with these settings."""
    server = await start_planner(
        "127.0.0.1:0",
        tls=local.server,
        settings_path=str(settings or ""),
        resolver=resolver,
    )
    try:
        yield server
    finally:
        await server.stop(grace_s=0.5)


async def size(port: int, tls: ClientTLS, request: Any = SIZE) -> grpc.StatusCode:
    """One SizeContext as `tls`'s caller: OK or the refusal's code."""
    channel = aio_channel(f"127.0.0.1:{port}", tls)
    try:
        await planner_pb2_grpc.PlannerServiceStub(channel).SizeContext(request, timeout=30)
        return grpc.StatusCode.OK
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    finally:
        await channel.close()


async def test_default_roles_admit_users_with_a_role_and_the_fleet(local: Local) -> None:
    """Without settings: admin, viewer and the fleet's client are served; a node's
    certificate and a user with no role are PERMISSION_DENIED (ROLE_REQUIRED)."""
    async with planner(local) as server:
        for user in ("admin", "viewer", "fleet"):
            assert await size(server.port, local.client(user)) is grpc.StatusCode.OK, user
        for user in ("node-gpu-1", "alice"):
            code = await size(server.port, local.client(user))
            assert code is grpc.StatusCode.PERMISSION_DENIED, user


async def test_a_revocation_in_the_settings_takes_effect_while_the_planner_runs(
    local: Local, tmp_path: Path
) -> None:
    """alice, a viewer by the settings, is served; `revoked: [user:alice]` written while the
    planner runs refuses her UNAUTHENTICATED naming the entry, and the fleet is still served."""
    settings = tmp_path / "settings.yaml"
    settings.write_text("roles:\n  viewer: [alice, fleet]\n")
    async with planner(local, settings) as server:
        assert await size(server.port, local.client("alice")) is grpc.StatusCode.OK
        settings.write_text("roles:\n  viewer: [alice, fleet]\n  revoked: [user:alice]\n")

        async def refused() -> bool:
            return await size(server.port, local.client("alice")) is grpc.StatusCode.UNAUTHENTICATED

        await assert_eventually(refused, timeout_s=CUT_S)
        assert await size(server.port, local.client("fleet")) is grpc.StatusCode.OK


async def test_a_malformed_settings_file_fails_closed(local: Local, tmp_path: Path) -> None:
    """An edit that breaks the settings refuses every caller (the message says why) until the
    file parses again; the last good roles are not kept."""
    settings = tmp_path / "settings.yaml"
    settings.write_text("roles:\n  viewer: [alice]\n")
    async with planner(local, settings) as server:
        settings.write_text("roles:\n  viewer: [alice\n")
        channel = aio_channel(f"127.0.0.1:{server.port}", local.client("admin"))
        stub = planner_pb2_grpc.PlannerServiceStub(channel)

        async def closed() -> grpc.aio.AioRpcError | None:
            try:
                await stub.SizeContext(SIZE, timeout=30)
            except grpc.aio.AioRpcError as exc:
                return exc if exc.code() is grpc.StatusCode.UNAUTHENTICATED else None
            return None

        try:
            err = await assert_eventually(closed, timeout_s=CUT_S)
            assert "settings" in (err.details() or "")
            settings.write_text("roles:\n  viewer: [alice]\n")

            async def open_again() -> bool:
                return await size(server.port, local.client("alice")) is grpc.StatusCode.OK

            await assert_eventually(open_again, timeout_s=CUT_S)
        finally:
            await channel.close()


async def test_a_running_call_of_a_revoked_caller_is_ended(local: Local, tmp_path: Path) -> None:
    """A SizeContext whose source takes long to fetch, run by alice, ends UNAUTHENTICATED
    (reason naming the revocation) once `revoked: [user:alice]` is written."""
    settings = tmp_path / "settings.yaml"
    settings.write_text("roles:\n  viewer: [alice]\n")
    resolver = StuckResolver()
    request = planner_pb2.SizeContextRequest()
    request.CopyFrom(SIZE)
    request.model.ClearField("shape")
    request.model.source = "hf://org/slow"
    async with planner(local, settings, resolver) as server:
        channel = aio_channel(f"127.0.0.1:{server.port}", local.client("alice"))
        try:
            call = planner_pb2_grpc.PlannerServiceStub(channel).SizeContext(request, timeout=60)
            await asyncio.wait_for(resolver.started.wait(), CUT_S)
            settings.write_text("roles:\n  viewer: [alice]\n  revoked: [user:alice]\n")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await asyncio.wait_for(call, CUT_S)
        finally:
            await channel.close()
    assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert "user:alice" in (caught.value.details() or "")
