"""Who may do what on the fleet: roles from the settings file, certificates and bearer
tokens, the gateway acting for people, the audit trail, and sources refused where models are
accepted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2
from grpc_status import rpc_status
from structlog.testing import capture_logs

from fleet_svc.domain.access import token_hash
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2
from llmgw.testing.eventually import assert_eventually
from llmgw.tls import ServerTLS
from planner_svc.server import PlannerServer, start_planner
from tests.integration.test_fleet_tls import (
    Pki,
    fleet_stub,
    health,
    make_pki,
    tls_agent,
    tls_fleet,
)
from tests.support.shapes import LLAMA_31_8B, inline

ROLES = """\
roles:
  admin: [admin]
  operator: [operator, alice]
  viewer: [viewer]
  gateway: [gateway]
"""
"""The gateway is listed under no role but acts for others: it gets what its person has,
never more than it has itself, so it needs a role too (given per test)."""

LLAMA_8B = inline(LLAMA_31_8B)


def llama(
    name: str = "llama", source: str = "hf://meta-llama/Llama-3.1-8B-Instruct"
) -> common_pb2.Model:
    """Llama-3.1-8B on one H100 (vLLM), shape inline, no replicas wanted."""
    return common_pb2.Model(
        name=name,
        source=source,
        context_length=8192,
        shape=LLAMA_8B,
        profiles=[
            common_pb2.Profile(
                name="gpu",
                engine="vllm",
                args=["--max-model-len", "8192"],
                gpu_class="H100-80GB",
                gpus_per_node=1,
                replicas=0,
            )
        ],
    )


def error_info(err: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo:
    """The ErrorInfo of a refusal."""
    status = rpc_status.from_call(err)
    assert status is not None, err
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    raise AssertionError(f"no ErrorInfo in {status}")


def bad_request_fields(err: grpc.aio.AioRpcError) -> list[str]:
    """The fields a refusal's BadRequest names."""
    status = rpc_status.from_call(err)
    assert status is not None
    out = []
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            detail.Unpack(br)
            out += [v.field for v in br.field_violations]
    return out


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """A fresh local CA with user pairs admin, operator, viewer, alice, gateway, fleet-caller."""
    return make_pki(tmp_path / "tls")


@pytest.fixture
async def planner(pki: Pki, tmp_path: Path) -> AsyncIterator[PlannerServer]:
    """A planner over mutual TLS (the fleet dials it with its own client pair, fleet-caller,
    a viewer of the planner by its settings)."""
    cert, key = pki.local.servers["planner"]
    roles = tmp_path / "planner-settings.yaml"
    roles.write_text("roles:\n  viewer: [fleet-caller]\n")
    server = await start_planner(
        "127.0.0.1:0",
        tls=ServerTLS(cert=cert, key=key, ca=pki.local.ca_cert),
        settings_path=str(roles),
    )
    yield server
    await server.stop(grace_s=0.5)


def settings(tmp_path: Path, text: str = ROLES) -> str:
    """A settings file holding `text`."""
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return str(path)


async def refused(call: object) -> grpc.aio.AioRpcError:
    """The error an awaited call ends with."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    return caught.value


async def test_viewer_reads_and_watches_operator_sets_gpus_only_admin_deletes(
    pki: Pki, planner: PlannerServer, tmp_path: Path
) -> None:
    """The viewer lists, gets and watches but SetGPUs is PERMISSION_DENIED naming operator;
    the operator's SetGPUs reaches the planner (over mutual TLS) and is applied, but its
    DeleteModel is PERMISSION_DENIED naming admin; the admin deletes."""
    async with tls_fleet(
        tmp_path,
        pki.fleet,
        settings=settings(tmp_path),
        planner=f"127.0.0.1:{planner.port}",
        planner_tls=pki.user("fleet-caller"),
    ) as fleet:
        node = tls_agent(fleet.port, "a", pki.node("a"), gpus=8)
        node.start()
        async with (
            fleet_stub(fleet.port, pki.user("admin")) as admin,
            fleet_stub(fleet.port, pki.user("operator")) as operator,
            fleet_stub(fleet.port, pki.user("viewer")) as viewer,
        ):
            await admin.CreateModel(fleet_pb2.CreateModelRequest(model=llama()))
            assert [
                m.model.name
                for m in (await viewer.ListModels(fleet_pb2.ListModelsRequest())).models
            ] == ["llama"]
            assert (
                await viewer.GetModel(fleet_pb2.GetModelRequest(name="llama"))
            ).model.revision == 1
            await viewer.ListReplicas(fleet_pb2.ListReplicasRequest())
            await viewer.ListNodes(fleet_pb2.ListNodesRequest())
            watch = viewer.WatchReplicas(fleet_pb2.WatchReplicasRequest(), timeout=10)
            first = await watch.read()
            assert isinstance(first, fleet_pb2.WatchReplicasResponse)
            assert first.kind == fleet_pb2.WatchReplicasResponse.KIND_SYNCED
            watch.cancel()

            err = await refused(viewer.SetGPUs(fleet_pb2.SetGPUsRequest(name="llama", gpus=2)))
            assert err.code() is grpc.StatusCode.PERMISSION_DENIED
            info = error_info(err)
            assert info.reason == "ROLE_REQUIRED"
            assert info.metadata["required_role"] == "operator"
            assert info.metadata["identity"] == "user:viewer"
            assert "operator" in (err.details() or "")

            async def inventory() -> bool:
                nodes = (await viewer.ListNodes(fleet_pb2.ListNodesRequest())).nodes
                return [n.name for n in nodes] == ["a"]

            await assert_eventually(inventory, what="node a in the inventory")
            changed = await operator.SetGPUs(fleet_pb2.SetGPUsRequest(name="llama", gpus=2))
            assert changed.model.model.profiles[0].gpus_per_node == 2
            assert changed.model.updated_by == "operator"

            err = await refused(operator.DeleteModel(fleet_pb2.DeleteModelRequest(name="llama")))
            assert err.code() is grpc.StatusCode.PERMISSION_DENIED
            assert error_info(err).metadata["required_role"] == "admin"
            err = await refused(
                operator.CreateModel(fleet_pb2.CreateModelRequest(model=llama("x")))
            )
            assert err.code() is grpc.StatusCode.PERMISSION_DENIED
            deleted = await admin.DeleteModel(fleet_pb2.DeleteModelRequest(name="llama"))
            assert deleted.model.updated_by == "admin"
        await node.stop()


async def test_updated_by_is_the_certificate_whatever_the_caller_metadata_says(
    pki: Pki, tmp_path: Path
) -> None:
    """The admin claiming to be mallory is recorded as admin; the gateway acting for alice is
    recorded as `gateway for alice`, allowed only as far as both their roles go."""
    text = ROLES.replace("admin: [admin]", "admin: [admin, gateway]")
    async with (
        tls_fleet(tmp_path, pki.fleet, settings=settings(tmp_path, text)) as fleet,
        fleet_stub(fleet.port, pki.user("admin")) as admin,
        fleet_stub(fleet.port, pki.user("gateway")) as gateway,
    ):
        mallory = (("x-llmgw-caller", "mallory"),)
        made = await admin.CreateModel(
            fleet_pb2.CreateModelRequest(model=llama()), metadata=mallory
        )
        assert made.model.updated_by == "admin"
        revs = await admin.ListModelRevisions(fleet_pb2.ListModelRevisionsRequest(name="llama"))
        assert [r.updated_by for r in revs.revisions] == ["admin"]

        # alice is an operator: through the gateway (an admin) she may not create.
        err = await refused(
            gateway.CreateModel(
                fleet_pb2.CreateModelRequest(model=llama("x")),
                metadata=(("x-llmgw-caller", "alice"),),
            )
        )
        assert err.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "gateway" in error_info(err).metadata["identity"]
        assert "alice" in error_info(err).metadata["identity"]
        # Acting for the admin, the gateway may; it is recorded as both.
        updated = await gateway.UpdateModel(
            fleet_pb2.UpdateModelRequest(model=llama(source="hf://meta-llama/Llama-3.1-8B")),
            metadata=(("x-llmgw-caller", "admin"),),
        )
        assert updated.model.updated_by == "gateway for admin"
        # A claim naming nobody valid is refused, not recorded.
        err = await refused(
            gateway.UpdateModel(
                fleet_pb2.UpdateModelRequest(model=llama()),
                metadata=(("x-llmgw-caller", "settings:/etc/llmgw/cluster.yaml"),),
            )
        )
        assert err.code() is grpc.StatusCode.UNAUTHENTICATED
        # The gateway alone acts as itself.
        own = await gateway.UpdateModel(fleet_pb2.UpdateModelRequest(model=llama()))
        assert own.model.updated_by == "gateway"


async def test_every_mutation_allowed_or_refused_is_one_audit_event(
    pki: Pki, tmp_path: Path
) -> None:
    """A refused DeleteModel and an allowed CreateModel each log one `audit` event with the
    identity, the RPC, the model and the outcome; reads are `audit_read` events, the first of
    each kind at once (repeats are counted, not logged)."""
    async with (
        tls_fleet(tmp_path, pki.fleet, settings=settings(tmp_path)) as fleet,
        fleet_stub(fleet.port, pki.user("admin")) as admin,
        fleet_stub(fleet.port, pki.user("viewer")) as viewer,
    ):
        with capture_logs() as logs:
            await admin.CreateModel(fleet_pb2.CreateModelRequest(model=llama()))
            await refused(viewer.DeleteModel(fleet_pb2.DeleteModelRequest(name="llama")))
            await viewer.ListModels(fleet_pb2.ListModelsRequest())
            await refused(admin.CreateModel(fleet_pb2.CreateModelRequest(model=llama())))  # exists
            for _ in range(3):
                await viewer.GetModel(fleet_pb2.GetModelRequest(name="llama"))
            await refused(viewer.GetModel(fleet_pb2.GetModelRequest(name="nope")))
    reads = [e for e in logs if e["event"] == "audit_read"]
    assert [(e["identity"], e["rpc"], e["model"], e["outcome"]) for e in reads] == [
        ("user:viewer", "ListModels", "", "OK"),
        ("user:viewer", "GetModel", "llama", "OK"),
        ("user:viewer", "GetModel", "nope", "NOT_FOUND"),
    ]
    audits = [e for e in logs if e["event"] == "audit"]
    assert [(e["identity"], e["rpc"], e["model"], e["outcome"]) for e in audits] == [
        ("user:admin", "CreateModel", "llama", "OK"),
        ("user:viewer", "DeleteModel", "llama", "refused"),
        ("user:admin", "CreateModel", "llama", "ALREADY_EXISTS"),
    ]


async def test_bearer_tokens_from_a_tokens_file(tmp_path: Path) -> None:
    """A fleet with a tokens file (plaintext on loopback): a known token is its user (and
    recorded so), a wrong one and none are UNAUTHENTICATED, health needs nothing."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# who\nalice {token_hash('s3cret-alice-token')}\n")
    text = "roles:\n  admin: [alice]\n"
    async with tls_fleet(
        tmp_path, None, settings=settings(tmp_path, text), tokens=str(tokens)
    ) as fleet:
        assert await health(fleet.port, None) == health_pb2.HealthCheckResponse.SERVING
        async with fleet_stub(fleet.port, None) as stub:
            good = (("authorization", "Bearer s3cret-alice-token"), ("x-llmgw-caller", "bob"))
            made = await stub.CreateModel(
                fleet_pb2.CreateModelRequest(model=llama()), metadata=good
            )
            assert made.model.updated_by == "alice"
            for metadata in (
                (("authorization", "Bearer s3cret-alice-tokem"),),
                (("authorization", "Basic YWxpY2U6eA=="),),
                (("x-llmgw-caller", "alice"),),
                (),
            ):
                err = await refused(
                    stub.ListModels(fleet_pb2.ListModelsRequest(), metadata=metadata)
                )
                assert err.code() is grpc.StatusCode.UNAUTHENTICATED, metadata
                assert error_info(err).reason == "UNAUTHENTICATED"
            # Revoking is deleting the line: the file is read again when it changes.
            tokens.write_text(f"bob {token_hash('another-token-for-bob')}\n")
            err = await refused(stub.ListModels(fleet_pb2.ListModelsRequest(), metadata=good))
            assert err.code() is grpc.StatusCode.UNAUTHENTICATED


async def test_dev_mode_allows_everything_and_says_so(tmp_path: Path) -> None:
    """Plaintext on loopback with no tokens: every call is allowed, recorded under the
    caller's own claim as before, and the start-up log says auth is off."""
    with capture_logs() as logs:
        async with tls_fleet(tmp_path, None) as fleet, fleet_stub(fleet.port, None) as stub:
            made = await stub.CreateModel(
                fleet_pb2.CreateModelRequest(model=llama()),
                metadata=(("x-llmgw-caller", "dev"),),
            )
            assert made.model.updated_by == "dev"
    assert any(e["event"] == "auth_disabled" for e in logs)


HOSTILE_SOURCES = (
    "--trust-remote-code",
    "--worker-cls=evilpkg.Worker",
    "-m",
    "hf://org/name@main/../../../../tmp/x",
    "hf://org/name@main//x",
    "hf://../../etc",
    "/models/../etc/shadow",
    "relative/path.gguf",
    "file:///etc/passwd",
    "http://user:pw@host/x.gguf",
    "hf://org/name\n--trust-remote-code",
    "",
)


async def test_hostile_sources_are_refused_and_nothing_is_written(pki: Pki, tmp_path: Path) -> None:
    """Each hostile source is INVALID_ARGUMENT (INVALID_SOURCE, BadRequest field
    model.source) for CreateModel and UpdateModel; the catalog is unchanged."""
    async with (
        tls_fleet(tmp_path, pki.fleet) as fleet,
        fleet_stub(fleet.port, pki.user("admin")) as admin,
    ):
        for source in HOSTILE_SOURCES:
            err = await refused(
                admin.CreateModel(fleet_pb2.CreateModelRequest(model=llama("evil", source=source)))
            )
            assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, source
            assert error_info(err).reason == "INVALID_SOURCE", source
            assert bad_request_fields(err) == ["model.source"], source
        assert list((await admin.ListModels(fleet_pb2.ListModelsRequest())).models) == []
        err = await refused(
            admin.ListModelRevisions(fleet_pb2.ListModelRevisionsRequest(name="evil"))
        )
        assert err.code() is grpc.StatusCode.NOT_FOUND
        await admin.CreateModel(fleet_pb2.CreateModelRequest(model=llama()))
        for source in HOSTILE_SOURCES[:3]:
            err = await refused(
                admin.UpdateModel(fleet_pb2.UpdateModelRequest(model=llama(source=source)))
            )
            assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, source
        revs = await admin.ListModelRevisions(fleet_pb2.ListModelRevisionsRequest(name="llama"))
        assert len(revs.revisions) == 1
        assert fleet.controller.state.replicas == {}
