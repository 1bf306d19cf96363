"""llmgw.clients over TLS: the typed clients dial through llmgw.tls with the pair they are
given, send a bearer token when told, and a connection refused in or around its handshake is
`Unreachable` with a sentence saying what went wrong, not gRPC's "failed to connect to all
addresses". Against the real planner with certificates the tests make."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from llmgw import certs
from llmgw.clients import FleetClient, PlannerClient, Unreachable
from llmgw.clients.auth import bearer_metadata
from llmgw.clients.errors import tls_problem
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.planner.v1 import planner_pb2, planner_pb2_grpc
from llmgw.tls import ClientTLS, ServerTLS, TLSConfigError
from planner_svc.server import PlannerServer
from tests.support.planner import running_planner
from tests.unit.test_clients import EIGHT_H100, LLAMA_8B

# gRPC's details for each way a handshake went wrong, as grpcio 1.85 words them (captured
# from the real cases the tests below make).
VERIFY_FAILED = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:45887: Tls "
    "handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL routines:"
    "OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate: OK"
)
NOT_TLS = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:39883: Tls "
    "handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:100000f7:SSL routines:"
    "OPENSSL_internal:WRONG_VERSION_NUMBER: Invalid certificate verification context: OK"
)
CLOSED = (
    "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:1: Socket closed"
)
REFUSED = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to "
    "connect to remote host: Connection refused"
)


def test_tls_problems_are_said_for_people() -> None:
    """Each handshake failure becomes one sentence; a closed socket is read by whether this
    side spoke TLS; a refused connection is not a TLS problem."""
    assert tls_problem(VERIFY_FAILED) == (
        "TLS handshake failed: the server's certificate is not signed by the CA this client "
        "trusts (CERTIFICATE_VERIFY_FAILED)"
    )
    assert tls_problem(NOT_TLS) == (
        "TLS handshake failed: the server does not speak TLS (it serves plaintext) "
        "(WRONG_VERSION_NUMBER)"
    )
    assert "may require TLS" in tls_problem(CLOSED, secure=False)
    assert "did not accept this client's certificate" in tls_problem(CLOSED, secure=True)
    assert tls_problem(CLOSED) == ""
    assert tls_problem(REFUSED, secure=True) == ""
    assert tls_problem("Deadline Exceeded", secure=True) == ""


@pytest.fixture
def pki(tmp_path: Path) -> certs.LocalTLS:
    """A local CA with its pairs (certs.make_local_tls)."""
    return certs.make_local_tls(tmp_path / "tls")


def server_tls(pki: certs.LocalTLS) -> ServerTLS:
    """The planner's pair, clients signed by the local CA required."""
    cert, key = pki.servers["planner"]
    return ServerTLS(cert=cert, key=key, ca=pki.ca_cert)


def client_tls(pki: certs.LocalTLS, user: str = "admin") -> ClientTLS:
    """A caller of the local CA."""
    cert, key = pki.clients[user]
    return ClientTLS(ca=pki.ca_cert, cert=cert, key=key)


@asynccontextmanager
async def mtls_planner(pki: certs.LocalTLS) -> AsyncIterator[PlannerServer]:
    """A real planner serving mutual TLS."""
    async with running_planner(tls=server_tls(pki), client_tls=client_tls(pki)) as (s, _, _c):
        yield s


def size(planner: PlannerClient) -> int:
    """SizeContext of Llama-8B to 32k through `planner`; the context after."""
    answer = planner.size_context(LLAMA_8B, 32768, inventory=EIGHT_H100)
    return int(answer.change.after)


async def test_the_planner_client_answers_over_mutual_tls(pki: certs.LocalTLS) -> None:
    """With the CA and a client pair it signed, the blocking client gets the planner's
    answer."""
    async with mtls_planner(pki) as server:
        with PlannerClient(f"127.0.0.1:{server.port}", tls=client_tls(pki)) as planner:
            assert await asyncio.to_thread(size, planner) == 32768


def unreachable(address: str, tls: ClientTLS | None) -> Unreachable:
    """The failure of a SizeContext through a client with `tls`."""
    with (
        PlannerClient(address, timeout_s=10, tls=tls) as planner,
        pytest.raises(Unreachable) as caught,
    ):
        size(planner)
    return caught.value


async def test_each_refused_handshake_is_unreachable_with_its_reason(
    pki: certs.LocalTLS, tmp_path: Path
) -> None:
    """Another CA's server, plaintext to TLS, no client certificate, one from another CA and an
    expired one: each is `Unreachable` naming the planner, with what went wrong in `tls`."""
    other = certs.make_local_tls(tmp_path / "other")
    ca = certs.load_ca(pki.folder)
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=2)
    expired = certs.write_pair(
        tmp_path,
        "expired",
        certs.issue(
            ca,
            "old",
            uris=["spiffe://llmgw/user/old"],
            client=True,
            not_before=past,
            not_after=past + datetime.timedelta(days=1),
        ),
    )
    async with mtls_planner(pki) as server:
        address = f"127.0.0.1:{server.port}"
        cases = {
            "other CA": ClientTLS(
                ca=other.ca_cert, cert=pki.clients["admin"][0], key=pki.clients["admin"][1]
            ),
            "plaintext": None,
            "no client cert": ClientTLS(ca=pki.ca_cert),
            "client of another CA": ClientTLS(
                ca=pki.ca_cert, cert=other.clients["admin"][0], key=other.clients["admin"][1]
            ),
            "expired client": ClientTLS(ca=pki.ca_cert, cert=expired[0], key=expired[1]),
        }
        got = {
            name: await asyncio.to_thread(unreachable, address, tls) for name, tls in cases.items()
        }
    for failure in got.values():
        assert failure.address == address and failure.service == "planner"
        assert failure.code == "UNAVAILABLE" and failure.reason is None
        assert str(failure).startswith(f"the planner at {address}: ")
    assert "CERTIFICATE_VERIFY_FAILED" in got["other CA"].tls
    assert "may require TLS" in got["plaintext"].tls
    for name in ("no client cert", "client of another CA", "expired client"):
        assert "did not accept this client's certificate" in got[name].tls, name


async def test_tls_to_a_plaintext_server_says_it_serves_plaintext(pki: certs.LocalTLS) -> None:
    """A TLS client dialling a plaintext planner is told the server does not speak TLS."""
    async with running_planner() as (server, _stub, _ch):
        failure = await asyncio.to_thread(unreachable, f"127.0.0.1:{server.port}", client_tls(pki))
    assert "does not speak TLS" in failure.tls


def test_nothing_listening_is_not_a_tls_problem(pki: certs.LocalTLS) -> None:
    """A refused connection stays the plain `did not answer`, with no TLS sentence."""
    with (
        PlannerClient("127.0.0.1:1", tls=client_tls(pki)) as planner,
        pytest.raises(Unreachable) as caught,
    ):
        planner.describe_model("hf://a/b")
    assert caught.value.tls == ""
    assert str(caught.value) == "the planner at 127.0.0.1:1 did not answer (UNAVAILABLE)"


def test_a_missing_tls_file_is_said_when_the_client_is_made(tmp_path: Path) -> None:
    """A CA file that is not there fails at construction, naming it."""
    with pytest.raises(TLSConfigError, match=r"nope\.crt"):
        FleetClient("127.0.0.1:1", tls=ClientTLS(ca=tmp_path / "nope.crt"))


class MetadataFleet(fleet_pb2_grpc.FleetServiceServicer):
    """A fleet that remembers the metadata of each ListModels call."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    def ListModels(self, request: fleet_pb2.ListModelsRequest, context: Any) -> Any:
        """Answer an empty catalog."""
        self.seen.append(dict(context.invocation_metadata()))
        return fleet_pb2.ListModelsResponse()


class MetadataPlanner(planner_pb2_grpc.PlannerServiceServicer):
    """A planner that remembers the metadata of each DescribeModel call."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    def DescribeModel(self, request: planner_pb2.DescribeModelRequest, context: Any) -> Any:
        """Answer a fixed version."""
        self.seen.append(dict(context.invocation_metadata()))
        return planner_pb2.DescribeModelResponse(llamacpp_version="b1")


@contextmanager
def serving(add: Any, servicer: Any) -> Iterator[str]:
    """`servicer` on a plaintext loopback port; its address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    add(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)


def test_a_token_travels_as_a_bearer_authorization() -> None:
    """Both clients send `authorization: Bearer TOKEN` with every call when given one, and no
    authorization without."""
    fleet = MetadataFleet()  # type: ignore[abstract]
    with serving(fleet_pb2_grpc.add_FleetServiceServicer_to_server, fleet) as address:
        with FleetClient(address, caller="alice", token="s3cret") as client:
            client.list_models()
        with FleetClient(address) as client:
            client.list_models()
    assert fleet.seen[0]["authorization"] == "Bearer s3cret"
    assert fleet.seen[0]["x-llmgw-caller"] == "alice"
    assert "authorization" not in fleet.seen[1]
    planner = MetadataPlanner()  # type: ignore[abstract]
    with (
        serving(planner_pb2_grpc.add_PlannerServiceServicer_to_server, planner) as address,
        PlannerClient(address, token="t0ken") as client,
    ):
        client.describe_model("hf://a/b")
    assert planner.seen[0]["authorization"] == "Bearer t0ken"


@pytest.mark.parametrize("token", ["two words", "line\nbreak", "tab\there", "\x7f"])
def test_a_token_that_cannot_be_one_header_value_is_refused(token: str) -> None:
    """Whitespace or control characters in a token are refused before anything is sent."""
    with pytest.raises(ValueError, match="one word"):
        bearer_metadata(token)
