"""The fleet behind a real HTTP/2 proxy: nginx's `grpc_pass`, terminating the caller's mutual
TLS and dialling the fleet again over mutual TLS as the gateway. Unary calls and their error
details pass; a WatchReplicas stream stays open past nginx's 15 s `grpc_read_timeout` on the
fleet's heartbeats (and one behind a 1 s timeout is cut, so the timeout is real); a caller's
deadline reaches the fleet; a write retried on UNAVAILABLE with its request id is applied
once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from structlog.testing import capture_logs

from fleet_svc.domain.nodes import Liveness
from fleet_svc.server import FleetOptions, FleetServer, start_fleet
from llmgw import certs
from llmgw.agent.v1 import agent_pb2
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.scripted_agent import ScriptedAgent
from llmgw.tls import ClientTLS, aio_channel
from tests.integration.test_fleet_auth import error_info
from tests.integration.test_fleet_tls import Pki, make_pki, tls_agent
from tests.integration.test_watch_replicas import Reader
from tests.support.nginx import ProxyTLS, Route, running_nginx
from tests.support.planner import running_planner
from tests.support.shapes import LLAMA_31_8B, inline

pytestmark = pytest.mark.slow

W = fleet_pb2.WatchReplicasResponse
T = TypeVar("T")
PROXY_READ_TIMEOUT_S = 15
"""nginx's `grpc_read_timeout` in front of the fleet, as the issue sets it."""
SHORT_READ_TIMEOUT_S = 1
"""A second listener's timeout, below the heartbeat interval: its streams are cut."""
HEARTBEAT_S = 2.0
PATIENT = Liveness(interval_s=0.2, grace_heartbeats=25, lost_after_s=30.0)
"""The agent's liveness here: nothing in this file is about a silent node, and on a loaded
machine a stall of a second made the node flap NOT_READY, its endpoint went and came back, and
the quiet spell the heartbeat test needs was broken (seen 1 run in 5 at a load of 9)."""
ROLES = """\
roles:
  admin: [admin]
  operator: [gateway]
  viewer: [viewer]
"""


def llama(name: str = "llama", replicas: int = 1) -> common_pb2.Model:
    """Llama-3.1-8B on one H100 (vLLM), shape inline so the planner reads no source."""
    return common_pb2.Model(
        name=name,
        source="hf://meta-llama/Llama-3.1-8B-Instruct",
        context_length=8192,
        shape=inline(LLAMA_31_8B),
        profiles=[
            common_pb2.Profile(
                name="gpu",
                engine="vllm",
                args=["--max-model-len", "8192"],
                gpu_class="H100-80GB",
                gpus_per_node=1,
                replicas=replicas,
            )
        ],
    )


@dataclass
class Mesh:
    """A planner, a fleet on mutual TLS with one agent, nginx in front; stubs both ways."""

    pki: Pki
    data: Path
    planner: str
    fleet: FleetServer
    agent: ScriptedAgent
    routes: list[Route]
    channels: list[grpc.aio.Channel]

    def direct(self, user: str = "admin") -> fleet_pb2_grpc.FleetServiceAsyncStub:
        """A stub dialling the fleet itself as `user`."""
        return self._stub(f"127.0.0.1:{self.fleet.port}", self.pki.user(user))

    def proxied(self, route: int = 0) -> fleet_pb2_grpc.FleetServiceAsyncStub:
        """A stub dialling nginx's `route` (with a viewer's pair: nginx checks it; the
        fleet sees nginx's gateway identity)."""
        return self._stub(f"127.0.0.1:{self.routes[route].port}", self.pki.user("viewer"))

    def _stub(self, address: str, tls: ClientTLS) -> fleet_pb2_grpc.FleetServiceAsyncStub:
        channel = aio_channel(address, tls)
        self.channels.append(channel)
        return fleet_pb2_grpc.FleetServiceStub(channel)


async def start(data: Path, planner: str, settings: Path, pki: Pki, port: int = 0) -> FleetServer:
    """A fleet on mutual TLS with the given roles, heartbeats every HEARTBEAT_S."""
    return await start_fleet(
        FleetOptions(
            listen=f"127.0.0.1:{port}",
            store_url=str(data / "fleet.db"),
            settings_path=str(settings),
            liveness=PATIENT,
            drain_s=0.2,
            tick_s=0.05,
            planner=planner,
            tls=pki.fleet,
            watch_heartbeat_s=HEARTBEAT_S,
        )
    )


@asynccontextmanager
async def mesh(tmp_path: Path) -> AsyncIterator[Mesh]:
    """The whole arrangement, stopped after."""
    pki = make_pki(tmp_path / "tls")
    nginx_cert, nginx_key = certs.write_pair(
        pki.folder, "nginx", certs.issue_server(certs.load_ca(pki.folder), "nginx")
    )
    gateway_cert, gateway_key = pki.local.clients["gateway"]
    proxy_tls = ProxyTLS(pki.local.ca_cert, nginx_cert, nginx_key, gateway_cert, gateway_key)
    settings = tmp_path / "settings.yaml"
    settings.write_text(ROLES)
    data = tmp_path / "data"
    data.mkdir()
    async with running_planner() as (planner, _stub, _channel):
        address = f"127.0.0.1:{planner.port}"
        fleet = await start(data, address, settings, pki)
        agent = tls_agent(fleet.port, "a", pki.node("a"))
        agent.start()
        timeouts = [PROXY_READ_TIMEOUT_S, SHORT_READ_TIMEOUT_S]
        m: Mesh | None = None
        try:
            with running_nginx(
                tmp_path / "nginx", f"127.0.0.1:{fleet.port}", timeouts, proxy_tls
            ) as routes:
                m = Mesh(pki, data, address, fleet, agent, routes, [])
                yield m
        finally:
            await step(agent.stop(), "the agent's stop")
            for channel in m.channels if m is not None else []:
                await step(channel.close(), "a channel's close")
            await step((m.fleet if m is not None else fleet).stop(grace_s=0.5), "the fleet's stop")


async def test_unary_calls_and_their_error_details_pass_through(tmp_path: Path) -> None:
    """Reads answer through nginx as the fleet gave them, and a refusal keeps its code and
    ErrorInfo (nginx passes the status trailers)."""
    async with mesh(tmp_path) as m:
        await m.direct().CreateModel(fleet_pb2.CreateModelRequest(model=llama(replicas=0)))
        listed = await m.proxied().ListModels(fleet_pb2.ListModelsRequest(), timeout=10)
        assert [c.model.name for c in listed.models] == ["llama"]
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await m.proxied().GetModel(fleet_pb2.GetModelRequest(name="nope"), timeout=10)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert error_info(caught.value).reason == "MODEL_NOT_FOUND"
        # The fleet sees the proxy's identity: a viewer's pair at nginx acts as the gateway.
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await m.proxied().CreateModel(
                fleet_pb2.CreateModelRequest(model=llama("other")), timeout=10
            )
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "user:gateway" in error_info(denied.value).metadata["identity"]


async def test_watch_stays_open_past_the_proxy_read_timeout_on_heartbeats(
    tmp_path: Path,
) -> None:
    """A WatchReplicas stream with nothing to say for longer than nginx's 15 s read timeout
    is kept open by the fleet's heartbeats and still delivers the next change; behind a
    timeout shorter than the heartbeat interval the same stream is cut."""
    async with mesh(tmp_path) as m:
        await m.direct().CreateModel(fleet_pb2.CreateModelRequest(model=llama(replicas=1)))
        held = Reader(m.proxied(0), model="llama")
        cut = Reader(m.proxied(1), model="llama")
        await assert_eventually(lambda: held.of(W.KIND_ADDED), what="ADDED", timeout_s=20)
        added = held.of(W.KIND_ADDED)[0]
        await asyncio.wait_for(asyncio.gather(cut.task, return_exceptions=True), 30)
        assert isinstance(cut.task.exception(), grpc.aio.AioRpcError), "nginx cut it"
        # Idle for longer than the proxy's read timeout: only heartbeats cross it.
        quiet = PROXY_READ_TIMEOUT_S + 2 * HEARTBEAT_S
        await assert_eventually(
            lambda: (
                sum(e.seq == added.seq for e in held.of(W.KIND_HEARTBEAT)) >= quiet / HEARTBEAT_S
            ),
            what="heartbeats through a quiet spell longer than the read timeout",
            timeout_s=quiet * 3,
        )
        assert not held.task.done(), "the stream outlived nginx's read timeout"
        spec = m.agent.running[added.endpoint.replica_id]
        m.agent.report(spec, agent_pb2.PROCESS_PHASE_CRASHED, "exit 139")
        await assert_eventually(lambda: held.of(W.KIND_REMOVED), what="REMOVED after the spell")
        assert held.of(W.KIND_REMOVED)[0].reason == fleet_pb2.ENDPOINT_REASON_FAILED
        held.stop()


async def test_deadline_reaches_the_fleet_through_the_proxy(tmp_path: Path) -> None:
    """A caller's deadline crosses nginx (grpc-timeout): the fleet's handler sees it, the
    stream ends DEADLINE_EXCEEDED and the fleet lets the watcher go."""
    async with mesh(tmp_path) as m:
        await m.direct().CreateModel(fleet_pb2.CreateModelRequest(model=llama(replicas=0)))
        with capture_logs() as logs:
            call = m.proxied().WatchReplicas(
                fleet_pb2.WatchReplicasRequest(model="llama"), timeout=3.0
            )
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in call:
                    pass
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        opened = [e for e in logs if e["event"] == "watch_opened"]
        assert len(opened) == 1 and 0 < opened[0]["deadline_s"] <= 3.0
        await assert_eventually(lambda: m.fleet.controller.hub.watchers == 0, what="released")


async def test_write_retried_on_unavailable_with_its_request_id_applies_once(
    tmp_path: Path,
) -> None:
    """With the fleet down nginx answers UNAVAILABLE and nothing is written; the gateway's
    retries with the same request id succeed once the fleet is back, and a further retry
    (an answer lost on the way) returns the first answer, not a second revision."""
    async with mesh(tmp_path) as m:
        await m.direct().CreateModel(
            fleet_pb2.CreateModelRequest(model=llama(replicas=0)), timeout=10
        )
        port = m.fleet.port
        await step(m.fleet.stop(grace_s=0.5), "the fleet's stop")
        request = fleet_pb2.SetContextRequest(name="llama", tokens=16384, request_id="gw-42")
        proxied = m.proxied()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await proxied.SetContext(request, timeout=10)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        settings = m.data.parent / "settings.yaml"
        m.fleet = await step(
            start(m.data, m.planner, settings, m.pki, port=port), "the fleet's start again"
        )
        before = await m.direct().GetModel(fleet_pb2.GetModelRequest(name="llama"), timeout=10)
        assert before.model.revision == 1, "the refused try wrote nothing"

        async def retried() -> fleet_pb2.SetContextResponse | None:
            try:
                return await proxied.SetContext(request, timeout=10)
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.UNAVAILABLE, err
                return None

        first = await assert_eventually(retried, what="the retry answered", timeout_s=20)
        again = await proxied.SetContext(request, timeout=10)
        assert again == first and first.change.after == 16384
        after = await m.direct().GetModel(fleet_pb2.GetModelRequest(name="llama"), timeout=10)
        assert after.model.revision == 2, "applied once"


async def step(work: Awaitable[T], what: str, within_s: float = 30.0) -> T:
    """`work`, or a failure naming `what` when it takes longer than `within_s` (a stop or a
    start on the same port that never returns is a defect to be seen, not a test that hangs)."""
    try:
        return await asyncio.wait_for(work, within_s)
    except TimeoutError:
        pytest.fail(f"{what} did not finish within {within_s:g} s")
