"""Revocation that holds, against a real fleet over mutual TLS: a gateway cannot act for a
revoked person, certificates are revoked by serial and fingerprint, the roles and tokens
files are read again while the fleet runs and fail closed when malformed (naming the line),
and an open stream of a revoked token or identity is ended."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from fleet_svc.domain.access import token_hash
from llmgw.fleet.v1 import fleet_pb2
from llmgw.testing.eventually import assert_eventually
from tests.integration.test_fleet_auth import ROLES, error_info, refused, settings
from tests.integration.test_fleet_tls import Pki, fleet_stub, make_pki, tls_fleet

STREAM_END_S = 15
"""How long a test waits for a cut stream to end (the fleet checks every second): a bound
on a hang, not a timing assertion."""


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """A fresh local CA with user pairs admin, operator, viewer, alice, gateway."""
    return make_pki(tmp_path / "tls")


def _cert(pki: Pki, user: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pki.local.clients[user][0].read_bytes())


async def test_gateway_cannot_act_for_a_revoked_person(pki: Pki, tmp_path: Path) -> None:
    """`x-llmgw-caller: mallory` from the gateway's certificate is UNAUTHENTICATED when
    `revoked:` lists user:mallory (mallory holding a role), while acting for alice works."""
    text = ROLES.replace("operator: [operator, alice]", "operator: [operator, alice, gateway]")
    text = text.replace("viewer: [viewer]", "viewer: [viewer, mallory]")
    text += "  revoked: [user:mallory]\n"
    async with (
        tls_fleet(tmp_path, pki.fleet, settings=settings(tmp_path, text)) as fleet,
        fleet_stub(fleet.port, pki.user("gateway")) as gateway,
    ):
        await gateway.ListModels(
            fleet_pb2.ListModelsRequest(), metadata=(("x-llmgw-caller", "alice"),)
        )
        err = await refused(
            gateway.ListModels(
                fleet_pb2.ListModelsRequest(), metadata=(("x-llmgw-caller", "mallory"),)
            )
        )
        assert err.code() is grpc.StatusCode.UNAUTHENTICATED
        assert "user:mallory" in (err.details() or "")


@pytest.mark.parametrize("by", ["serial", "sha256"])
async def test_a_certificate_is_revoked_by_serial_or_fingerprint_while_running(
    pki: Pki, tmp_path: Path, by: str
) -> None:
    """Adding the viewer certificate's serial (or its SHA-256 fingerprint, as openssl prints
    it: capitals and colons) to `revoked:` in the running fleet's settings shuts that
    certificate out without a restart, while other viewers' calls go on."""
    path = settings(tmp_path, ROLES.replace("viewer: [viewer]", "viewer: [viewer, alice]"))
    cert = _cert(pki, "viewer")
    if by == "serial":
        entry = f"serial:{cert.serial_number:X}"
    else:
        digest = cert.fingerprint(hashes.SHA256())
        entry = "sha256:" + ":".join(f"{b:02X}" for b in digest)
    async with (
        tls_fleet(tmp_path, pki.fleet, settings=path) as fleet,
        fleet_stub(fleet.port, pki.user("viewer")) as viewer,
        fleet_stub(fleet.port, pki.user("alice")) as alice,
    ):
        await viewer.ListModels(fleet_pb2.ListModelsRequest())
        Path(path).write_text(Path(path).read_text() + f"  revoked: ['{entry}']\n")

        async def shut_out() -> bool:
            try:
                await viewer.ListModels(fleet_pb2.ListModelsRequest())
            except grpc.aio.AioRpcError as err:
                return err.code() is grpc.StatusCode.UNAUTHENTICATED
            return False

        await assert_eventually(shut_out, what=f"the viewer refused by {by}")
        await alice.ListModels(fleet_pb2.ListModelsRequest())


async def test_a_malformed_roles_file_fails_closed(pki: Pki, tmp_path: Path) -> None:
    """An edit that breaks the settings' YAML refuses every call (health aside) saying why,
    naming the line; fixing it lets calls in again."""
    path = settings(tmp_path)
    async with (
        tls_fleet(tmp_path, pki.fleet, settings=path) as fleet,
        fleet_stub(fleet.port, pki.user("admin")) as admin,
    ):
        await admin.ListModels(fleet_pb2.ListModelsRequest())
        Path(path).write_text(ROLES + "  revoked: [user:mallory\n")

        async def closed() -> grpc.aio.AioRpcError | None:
            try:
                await admin.ListModels(fleet_pb2.ListModelsRequest())
            except grpc.aio.AioRpcError as err:
                return err if err.code() is grpc.StatusCode.UNAUTHENTICATED else None
            return None

        err = await assert_eventually(closed, what="every call refused")
        assert "line" in (err.details() or ""), err.details()
        Path(path).write_text(ROLES)

        async def open_again() -> bool:
            try:
                await admin.ListModels(fleet_pb2.ListModelsRequest())
            except grpc.aio.AioRpcError:
                return False
            return True

        await assert_eventually(open_again, what="calls allowed once the file parses")


async def test_a_malformed_tokens_file_accepts_no_token(tmp_path: Path) -> None:
    """A tokens file edited into something that is neither lines nor YAML accepts no token,
    not even one whose line is still there, and the refusal names the bad line."""
    tokens = tmp_path / "tokens"
    good = f"alice {token_hash('alice-token-0123456789')}\n"
    tokens.write_text(good)
    text = ROLES.replace("viewer: [viewer]", "viewer: [viewer, alice]")
    async with (
        tls_fleet(tmp_path, None, settings=settings(tmp_path, text), tokens=str(tokens)) as fleet,
        fleet_stub(fleet.port, None) as stub,
    ):
        bearer = (("authorization", "Bearer alice-token-0123456789"),)
        await stub.ListModels(fleet_pb2.ListModelsRequest(), metadata=bearer)
        tokens.write_text(good + "bob not-a-hash: [\n")
        err = await refused(stub.ListModels(fleet_pb2.ListModelsRequest(), metadata=bearer))
        assert err.code() is grpc.StatusCode.UNAUTHENTICATED
        assert "line 2" in (err.details() or ""), err.details()
        assert error_info(err).reason == "UNAUTHENTICATED"


async def test_deleting_a_token_ends_its_open_watch(tmp_path: Path) -> None:
    """A WatchReplicas stream opened with alice's token ends UNAUTHENTICATED soon after her
    line is deleted from the tokens file; bob's stream, opened the same way, goes on."""
    tokens = tmp_path / "tokens"
    bob = f"bob {token_hash('bob-token-0123456789')}\n"
    tokens.write_text(f"alice {token_hash('alice-token-0123456789')}\n" + bob)
    text = ROLES.replace("viewer: [viewer]", "viewer: [viewer, alice, bob]")
    async with (
        tls_fleet(tmp_path, None, settings=settings(tmp_path, text), tokens=str(tokens)) as fleet,
        fleet_stub(fleet.port, None) as stub,
    ):
        alice_watch = stub.WatchReplicas(
            fleet_pb2.WatchReplicasRequest(),
            metadata=(("authorization", "Bearer alice-token-0123456789"),),
        )
        bob_watch = stub.WatchReplicas(
            fleet_pb2.WatchReplicasRequest(),
            metadata=(("authorization", "Bearer bob-token-0123456789"),),
        )
        await alice_watch.read()
        await bob_watch.read()
        tokens.write_text(bob)

        async def drain() -> grpc.StatusCode:
            try:
                while True:
                    if await alice_watch.read() is grpc.aio.EOF:
                        return grpc.StatusCode.OK
            except grpc.aio.AioRpcError as err:
                return err.code()

        code = await asyncio.wait_for(drain(), STREAM_END_S)
        assert code is grpc.StatusCode.UNAUTHENTICATED
        assert not bob_watch.done()
        bob_watch.cancel()
