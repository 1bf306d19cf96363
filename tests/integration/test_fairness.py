"""Fairness on a real fleet over mutual TLS: a viewer flooding WatchReplicas gets its share
and then RESOURCE_EXHAUSTED (TOO_MANY_CALLS, with RetryInfo); other viewers keep theirs until
the total; an admin's calls and streams keep their own share; a closed stream gives its place
back. And the share counter itself, for unary calls."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from fleet_svc.domain.errors import TooManyCalls
from fleet_svc.rpc.fairness import UNARY, Shares
from llmgw.fleet.v1 import fleet_pb2
from llmgw.limits import Limits
from llmgw.testing.eventually import assert_eventually
from tests.integration.test_fleet_auth import ROLES, error_info, settings
from tests.integration.test_fleet_tls import Pki, fleet_stub, make_pki, tls_fleet


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """A fresh local CA with user pairs admin, operator, viewer, alice, gateway."""
    return make_pki(tmp_path / "tls")


def _retry_info(err: grpc.aio.AioRpcError) -> error_details_pb2.RetryInfo | None:
    status = rpc_status.from_call(err)
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return info
    return None


async def _opened(stub: object) -> grpc.aio.UnaryStreamCall:  # type: ignore[type-arg]
    """A WatchReplicas stream, its first event read (so the fleet holds it)."""
    call = stub.WatchReplicas(fleet_pb2.WatchReplicasRequest())  # type: ignore[attr-defined]
    await call.read()
    return call  # type: ignore[no-any-return]


async def _refused(stub: object) -> grpc.aio.AioRpcError:
    call = stub.WatchReplicas(fleet_pb2.WatchReplicasRequest())  # type: ignore[attr-defined]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    return caught.value


async def test_a_flooding_viewer_gets_its_share_and_the_others_keep_theirs(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per identity 4, in all 6: the viewer's 5th stream is refused (scope identity, with
    RetryInfo); alice gets 2 more, then the total refuses her 3rd (scope total); the admin
    still opens a stream and lists models; closing a viewer stream lets the viewer in again."""
    monkeypatch.setenv("LLMGW_MAX_STREAMS_PER_IDENTITY", "4")
    monkeypatch.setenv("LLMGW_MAX_STREAMS", "6")
    text = ROLES.replace("viewer: [viewer]", "viewer: [viewer, alice]")
    async with (
        tls_fleet(tmp_path, pki.fleet, settings=settings(tmp_path, text)) as fleet,
        fleet_stub(fleet.port, pki.user("viewer")) as viewer,
        fleet_stub(fleet.port, pki.user("alice")) as alice,
        fleet_stub(fleet.port, pki.user("admin")) as admin,
    ):
        held = [await _opened(viewer) for _ in range(4)]
        err = await _refused(viewer)
        assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        info = error_info(err)
        assert (info.reason, info.metadata["scope"]) == ("TOO_MANY_CALLS", "identity")
        assert info.metadata["limit"] == "max_streams_per_identity"
        retry = _retry_info(err)
        assert retry is not None and retry.retry_delay.seconds >= 1

        held += [await _opened(alice) for _ in range(2)]
        err = await _refused(alice)
        assert error_info(err).metadata["scope"] == "total"

        held.append(await _opened(admin))
        await admin.ListModels(fleet_pb2.ListModelsRequest())

        held[0].cancel()

        async def back_in() -> bool:
            try:
                held.append(await _opened(viewer))
            except grpc.aio.AioRpcError:
                return False
            return True

        await assert_eventually(back_in, what="the viewer's closed stream's place given back")
        for call in held:
            call.cancel()


def test_unary_shares_per_identity_total_and_own() -> None:
    """In-flight unary calls: past the caller's share TooManyCalls (identity); past the total
    (identity "") everyone but an own-share caller is refused; a release gives one back."""
    shares = Shares(Limits(max_inflight_per_identity=2, max_inflight=3))
    first = shares.acquire(UNARY, "user:v", own_share=False)
    shares.acquire(UNARY, "user:v", own_share=False)
    with pytest.raises(TooManyCalls) as caught:
        shares.acquire(UNARY, "user:v", own_share=False)
    assert caught.value.metadata()["scope"] == "identity"
    shares.acquire(UNARY, "user:w", own_share=False)
    with pytest.raises(TooManyCalls) as caught:
        shares.acquire(UNARY, "user:x", own_share=False)
    dev = Shares(Limits(max_inflight_per_identity=1, max_inflight=3))
    for _ in range(3):  # nobody verified: no per-identity share, the total only
        dev.acquire(UNARY, "", own_share=False)
    with pytest.raises(TooManyCalls):
        dev.acquire(UNARY, "", own_share=False)
    assert caught.value.metadata()["scope"] == "total"
    shares.acquire(UNARY, "user:admin", own_share=True)
    first()
    first()
    assert shares.held(UNARY) == 2
    shares.acquire(UNARY, "user:x", own_share=False)
    dev = Shares(Limits(max_inflight_per_identity=1, max_inflight=3))
    for _ in range(3):  # nobody verified: no per-identity share, the total only
        dev.acquire(UNARY, "", own_share=False)
    with pytest.raises(TooManyCalls):
        dev.acquire(UNARY, "", own_share=False)
