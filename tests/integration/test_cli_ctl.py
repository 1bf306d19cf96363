"""`llmgw ctl` as operators run it: the real command, as a child process, against a real fleet
in-process with a scripted agent; over mutual TLS with the flags, the environment, or the
pair of a local `llmgw up`."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleet_svc.domain.nodes import Liveness
from llmgw import certs
from llmgw.fleet.v1 import fleet_pb2
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.scripted_agent import ScriptedAgent
from llmgw.tls import ClientTLS, ServerTLS
from tests.support.fleet import running_fleet as _running_fleet
from tests.support.json_keys import camel_keys
from tests.support.planner import running_planner
from tests.support.shapes import LLAMA_31_8B, inline_data

# Heartbeats every 0.5 s, NOT_READY after 5 s of silence: each `llmgw ctl` run starts a Python
# process on the tests' 2 shared cores, which must not make the scripted node look silent.
PATIENT = Liveness(interval_s=0.5, grace_heartbeats=10, lost_after_s=30.0)


def running_fleet(data: Path, **kwargs: Any) -> Any:
    """A real fleet in-process, patient with heartbeats."""
    return _running_fleet(data, liveness=PATIENT, **kwargs)


EXIT_REFUSED = 2
EXIT_UNREACHABLE = 3
EXIT_USAGE = 64


@dataclass(frozen=True)
class Run:
    """What one `llmgw ctl` run printed and returned."""

    code: int
    out: str
    err: str

    def json(self) -> Any:
        """Its stdout parsed as JSON."""
        return json.loads(self.out)


CLIENT_ENV = ("LLMGW_FLEET", "LLMGW_TLS_CA", "LLMGW_TLS_CERT", "LLMGW_TLS_KEY", "LLMGW_TOKEN")


def _env(**extra: str) -> dict[str, str]:
    """The environment without a person's client settings, $LLMGW_DATA pointing where no
    `llmgw up` wrote certificates, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV}
    env["USER"] = "tester"
    env["LLMGW_DATA"] = "/nonexistent/llmgw-data"
    return env | extra


async def ctl(port: int, *args: str, env: dict[str, str] | None = None) -> Run:
    """Run `llmgw ctl --fleet 127.0.0.1:PORT ARGS...` and wait for it."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "llmgw.cli.main",
        "ctl",
        "--fleet",
        f"127.0.0.1:{port}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env if env is not None else _env(),
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return Run(proc.returncode, out.decode(), err.decode())


def write_model(path: Path, name: str = "qwen", replicas: int = 1, gpus: int = 1) -> Path:
    """A catalog model file in YAML, as an operator writes one."""
    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "source": "hf://Qwen/Qwen3-8B",
                "context_length": 8192,
                "profiles": [
                    {
                        "name": "gpu",
                        "engine": "vllm",
                        "args": ["--max-model-len", "8192", "-tp", str(gpus)],
                        "gpu_class": "H100-80GB",
                        "gpus_per_node": gpus,
                        "replicas": replicas,
                    }
                ],
            }
        )
    )
    return path


async def test_model_create_list_show_and_history(tmp_path: Path) -> None:
    """A model created from YAML is listed with its profile, shown with its args, etag and
    author, and its history names who made each revision."""
    async with running_fleet(tmp_path) as (fleet, _stub):
        created = await ctl(
            fleet.port, "--as", "alice", "model", "create", str(write_model(tmp_path / "m.yaml"))
        )
        assert created.code == 0, created.err
        assert "created model qwen (revision 1)" in created.out

        listed = await ctl(fleet.port, "model", "list")
        assert listed.code == 0, listed.err
        header, row = listed.out.splitlines()
        assert header.split() == ["NAME", "SOURCE", "CONTEXT", "PROFILES", "REVISION", "DECLARED"]
        assert row.split() == ["qwen", "hf://Qwen/Qwen3-8B", "8192", "gpu=vllm×1", "1", "no"]

        shown = await ctl(fleet.port, "model", "show", "qwen")
        assert shown.code == 0, shown.err
        assert "revision:    1 (etag " in shown.out and "(etag 1)" not in shown.out
        assert "by alice" in shown.out
        assert "args: --max-model-len 8192 -tp 1" in shown.out
        assert "gpu: vllm, 1 replica(s) on 1×H100-80GB" in shown.out

        as_json = await ctl(fleet.port, "model", "list", "--json")
        data = as_json.json()
        assert isinstance(data, dict)
        assert [m["model"]["name"] for m in data["models"]] == ["qwen"]
        assert data["models"][0]["updated_by"] == "alice"
        assert camel_keys(data) == []
        shown_json = (await ctl(fleet.port, "model", "show", "qwen", "--json")).json()
        assert shown_json["model"]["model"]["context_length"] == "8192"
        assert camel_keys(shown_json) == []

        history = await ctl(fleet.port, "model", "history", "qwen")
        assert history.code == 0, history.err
        assert history.out.splitlines()[1].split()[:3][0] == "1"
        assert "alice" in history.out


async def test_caller_defaults_to_the_user(tmp_path: Path) -> None:
    """Without --as, the revision is written by $USER."""
    async with running_fleet(tmp_path) as (fleet, stub):
        run = await ctl(fleet.port, "model", "create", str(write_model(tmp_path / "m.yaml")))
        assert run.code == 0, run.err
        got = await stub.GetModel(fleet_pb2.GetModelRequest(name="qwen"))
        assert got.model.updated_by == "tester"


async def test_refusals_exit_2_with_reason_and_metadata(tmp_path: Path) -> None:
    """A missing model and a stale etag are refused with exit code 2, the reason and its
    metadata, on stderr for people and as JSON for scripts; nothing is deleted."""
    async with running_fleet(tmp_path) as (fleet, stub):
        missing = await ctl(fleet.port, "model", "show", "nope")
        assert missing.code == EXIT_REFUSED
        assert missing.err.startswith("refused (MODEL_NOT_FOUND): no model 'nope'")

        await ctl(fleet.port, "model", "create", str(write_model(tmp_path / "m.yaml")))
        stale = await ctl(fleet.port, "model", "delete", "qwen", "--etag", "7")
        assert stale.code == EXIT_REFUSED
        assert "refused (STALE_REVISION)" in stale.err
        assert "read it again and retry" in stale.err
        assert "etag: 7" in stale.err

        stale_json = await ctl(fleet.port, "--json", "model", "delete", "qwen", "--etag", "7")
        assert stale_json.code == EXIT_REFUSED
        error = stale_json.json()
        assert isinstance(error, dict)
        assert error["error"]["reason"] == "STALE_REVISION"
        assert error["error"]["code"] == "ABORTED"
        assert error["error"]["metadata"]["etag"] == "7"
        assert (await stub.GetModel(fleet_pb2.GetModelRequest(name="qwen"))).model.revision == 1

        again = await ctl(fleet.port, "model", "create", str(write_model(tmp_path / "m.yaml")))
        assert again.code == EXIT_REFUSED
        assert "MODEL_EXISTS" in again.err


async def test_delete_with_current_etag_removes_the_model(tmp_path: Path) -> None:
    """Deleting at the current etag (opaque: not the revision number) removes the model from
    the list; its history keeps the deletion's revision."""
    async with running_fleet(tmp_path) as (fleet, _stub):
        await ctl(fleet.port, "model", "create", str(write_model(tmp_path / "m.yaml")))
        stale = await ctl(fleet.port, "model", "delete", "qwen", "--etag", "1")
        assert stale.code == EXIT_REFUSED and "STALE_REVISION" in stale.err
        etag = (await ctl(fleet.port, "model", "show", "qwen", "--json")).json()["model"]["etag"]
        deleted = await ctl(fleet.port, "model", "delete", "qwen", "--etag", etag)
        assert deleted.code == 0, deleted.err
        assert "deleted model qwen (revision 2)" in deleted.out
        listed = await ctl(fleet.port, "model", "list", "--json")
        assert listed.json() == {"models": []}  # default-valued fields are printed
        history = await ctl(fleet.port, "model", "history", "qwen", "--json")
        data = history.json()
        assert isinstance(data, dict)
        assert [r["revision"] for r in data["revisions"]] == ["1", "2"]


async def test_nodes_and_replicas_ready_and_pending_with_reason(tmp_path: Path) -> None:
    """With one 4-card node, two 2-card replicas are READY and a third PENDING one's reason
    says why, in the table and in JSON; the node shows its free cards."""
    async with running_fleet(tmp_path) as (fleet, stub):
        agent = ScriptedAgent(f"127.0.0.1:{fleet.port}", "node-a", gpus=4)
        agent.start()
        try:
            run = await ctl(
                fleet.port,
                "model",
                "create",
                str(write_model(tmp_path / "m.yaml", replicas=3, gpus=2)),
            )
            assert run.code == 0, run.err

            async def settled() -> bool:
                rs = (await stub.ListReplicas(fleet_pb2.ListReplicasRequest())).replicas
                phases = sorted(r.phase for r in rs)
                return phases == [
                    fleet_pb2.REPLICA_PHASE_PENDING,
                    fleet_pb2.REPLICA_PHASE_READY,
                    fleet_pb2.REPLICA_PHASE_READY,
                ]

            await assert_eventually(settled, what="two READY replicas and one PENDING")

            table = await ctl(fleet.port, "replica", "list")
            assert table.code == 0, table.err
            lines = table.out.splitlines()
            assert lines[0].split()[:9] == [
                "ID",
                "MODEL",
                "PROFILE",
                "NODE",
                "CARDS",
                "PHASE",
                "ADDRESS",
                "RESTARTS",
                "AGE",
            ]
            phases = [line.split()[5] for line in lines[1:]]
            assert sorted(phases) == ["PENDING", "READY", "READY"]
            pending = [line for line in lines[1:] if line.split()[5] == "PENDING"]
            assert "node-a: 0 free" in pending[0]

            as_json = await ctl(fleet.port, "replica", "list", "--model", "qwen", "--json")
            data = as_json.json()
            assert isinstance(data, dict)
            by_phase = {r["phase"]: r for r in data["replicas"]}
            assert by_phase["REPLICA_PHASE_READY"]["address"].startswith("127.0.0.1:")
            assert "node-a: 0 free" in by_phase["REPLICA_PHASE_PENDING"]["reason"]

            nodes = await ctl(fleet.port, "node", "list")
            assert nodes.code == 0, nodes.err
            header, row = nodes.out.splitlines()
            assert header.split()[:5] == ["NAME", "PHASE", "CLASS", "CARDS", "FREE"]
            assert row.split()[:4] == ["node-a", "READY", "H100-80GB", "0/4"]
            nodes_json = (await ctl(fleet.port, "node", "list", "--json")).json()
            assert isinstance(nodes_json, dict)
            assert nodes_json["nodes"][0]["phase"] == "NODE_PHASE_READY"
            assert len(nodes_json["nodes"][0]["cards"]) == 4

            shown = await ctl(fleet.port, "model", "show", "qwen")
            assert "PENDING" in shown.out and "READY" in shown.out
        finally:
            await agent.stop()


async def test_replica_watch_streams_one_json_object_per_line(tmp_path: Path) -> None:
    """`replica watch --json` prints the ready endpoints, then SYNCED, one object a line."""
    async with running_fleet(tmp_path) as (fleet, stub):
        agent = ScriptedAgent(f"127.0.0.1:{fleet.port}", "node-a", gpus=4)
        agent.start()
        try:
            await ctl(fleet.port, "model", "create", str(write_model(tmp_path / "m.yaml")))

            async def ready() -> bool:
                rs = (await stub.ListReplicas(fleet_pb2.ListReplicasRequest())).replicas
                return len(rs) == 1 and rs[0].phase == fleet_pb2.REPLICA_PHASE_READY

            await assert_eventually(ready, what="a READY replica")
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "llmgw.cli.main",
                "ctl",
                "--fleet",
                f"127.0.0.1:{fleet.port}",
                "replica",
                "watch",
                "--json",
                stdout=asyncio.subprocess.PIPE,
                env=_env(),
            )
            assert proc.stdout is not None
            events = []
            try:
                while True:
                    line = await asyncio.wait_for(proc.stdout.readline(), 30)
                    assert line, "the watch ended before SYNCED"
                    events.append(json.loads(line))
                    if events[-1]["kind"] == "KIND_SYNCED":
                        break
            finally:
                proc.terminate()
                await proc.wait()
            assert [e["kind"] for e in events] == ["KIND_ADDED", "KIND_SYNCED"]
            assert events[0]["endpoint"]["model"] == "qwen"
            assert events[0]["endpoint"]["node"] == "node-a"
        finally:
            await agent.stop()


async def test_unreachable_fleet_exits_3(tmp_path: Path) -> None:
    """A fleet that does not answer is exit code 3 with a line saying what to do."""
    async with running_fleet(tmp_path) as (fleet, _stub):
        port = fleet.port
    run = await ctl(port, "model", "list")
    assert run.code == EXIT_UNREACHABLE
    assert f"the fleet at 127.0.0.1:{port} did not answer" in run.err
    assert "LLMGW_FLEET" in run.err


async def test_unreadable_model_file_is_usage_error(tmp_path: Path) -> None:
    """A model file that is not one mapping is refused before any call, exit code 64."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    async with running_fleet(tmp_path) as (fleet, stub):
        run = await ctl(fleet.port, "model", "create", str(bad))
        assert run.code == EXIT_USAGE
        assert "a model file holds one mapping" in run.err
        assert not (await stub.ListModels(fleet_pb2.ListModelsRequest())).models


async def test_bad_usage_exits_64(tmp_path: Path) -> None:
    """A missing command or argument is a usage error (64), never a refusal's 2."""
    for args in (("model",), ("model", "show"), ("--timeout", "soon", "model", "list")):
        run = await ctl(1, *args)
        assert run.code == EXIT_USAGE, (args, run.err)
        assert "error:" in run.err


async def test_apply_commands_are_under_ctl(tmp_path: Path) -> None:
    """`model gpus|context` and `rollout ...` (llmgw.cli.ctl_model, llmgw.cli.ctl_rollout) run
    under `llmgw ctl` with its --fleet, and their refusals exit 2 with the reason."""
    async with running_fleet(tmp_path) as (fleet, _stub):
        rollouts = await ctl(fleet.port, "rollout", "list", "--json")
        assert rollouts.code == 0, rollouts.err
        assert rollouts.json() == []
        missing = await ctl(fleet.port, "model", "context", "nope", "8192", "--dry-run")
        assert missing.code == EXIT_REFUSED, missing.err
        assert "MODEL_NOT_FOUND" in missing.err


# Llama-3.1-8B's shape (32 heads, 8 KV heads of 128; tests/fixtures/hf), given inline so the
# planner reads no source.
LLAMA_8B_SHAPE = inline_data(LLAMA_31_8B)


async def test_model_gpus_is_followed_to_the_end_of_its_rollout(tmp_path: Path) -> None:
    """`model gpus` prints the planner's change, follows the rollout it started to its end
    (exit 0, the last line its state), and `rollout list|status|watch` show that rollout."""
    path = write_model(tmp_path / "m.yaml")
    data = yaml.safe_load(path.read_text())
    data["shape"] = LLAMA_8B_SHAPE
    path.write_text(yaml.safe_dump(data))
    async with (
        running_planner() as (planner, _p, _c),
        _running_fleet(tmp_path, liveness=PATIENT, planner=f"127.0.0.1:{planner.port}") as (
            fleet,
            stub,
        ),
    ):
        agent = ScriptedAgent(f"127.0.0.1:{fleet.port}", "node-a", gpus=4)
        agent.start()
        try:
            assert (await ctl(fleet.port, "model", "create", str(path))).code == 0

            async def ready() -> bool:
                rs = (await stub.ListReplicas(fleet_pb2.ListReplicasRequest())).replicas
                return len(rs) == 1 and rs[0].phase == fleet_pb2.REPLICA_PHASE_READY

            await assert_eventually(ready, timeout_s=30, what="a READY replica")
            dry = await ctl(fleet.port, "model", "gpus", "qwen", "2", "--dry-run", "--json")
            assert dry.code == 0, dry.err
            assert camel_keys(dry.json()) == []
            run = await ctl(fleet.port, "model", "gpus", "qwen", "2")
            assert run.code == 0, run.err
            lines = run.out.splitlines()
            assert lines[0] == "qwen: 2 cards a replica"
            started = next(line for line in lines if line.startswith("rollout ro"))
            rollout_id = started.split()[1]
            assert started.endswith("started (1 replica)")
            assert f"rollout {rollout_id} of qwen (gpus, beside): succeeded" in run.out

            listed = (await ctl(fleet.port, "rollout", "list", "--json")).json()
            assert isinstance(listed, list)
            assert [(r["id"], r["state"]) for r in listed] == [
                (rollout_id, "ROLLOUT_STATE_SUCCEEDED")
            ]
            assert listed[0]["to_revision"] == "2" and camel_keys(listed) == []
            status_json = (await ctl(fleet.port, "rollout", "status", rollout_id, "--json")).json()
            assert status_json["from_revision"] == "1" and camel_keys(status_json) == []
            status = await ctl(fleet.port, "rollout", "status", rollout_id)
            assert status.code == 0 and "succeeded" in status.out.splitlines()[0]
            watched = await ctl(fleet.port, "rollout", "watch", rollout_id, "--json")
            assert watched.code == 0, watched.err
            events = [json.loads(line) for line in watched.out.splitlines()]
            assert events[-1]["state"] == "ROLLOUT_STATE_SUCCEEDED"
            assert [e["seq"] for e in events[:-1]] == sorted(e["seq"] for e in events[:-1])
            assert camel_keys(events) == [] and events[0]["rollout_id"] == rollout_id
        finally:
            await agent.stop()


async def test_a_change_while_the_planner_is_down_says_so(tmp_path: Path) -> None:
    """With the fleet up and its planner not answering, `model gpus` exits 3 and names the
    planner, not the fleet, as what did not answer."""
    async with running_fleet(tmp_path) as (fleet, _stub):
        await ctl(fleet.port, "model", "create", str(write_model(tmp_path / "m.yaml")))
        run = await ctl(fleet.port, "model", "gpus", "qwen", "2", "--dry-run")
    assert run.code == EXIT_UNREACHABLE, run.err
    assert run.err.startswith("llmgw: the fleet says (PLANNER_UNAVAILABLE): the planner at")
    assert "did not answer" in run.err


@pytest.fixture
def pki(tmp_path: Path) -> certs.LocalTLS:
    """The DATA/tls a `llmgw up --data TMP/data` writes."""
    return certs.make_local_tls(tmp_path / "data" / "tls")


def mutual(pki: certs.LocalTLS) -> dict[str, Any]:
    """running_fleet's arguments for mutual TLS with the local CA (its stub as admin)."""
    cert, key = pki.servers["fleet"]
    admin_cert, admin_key = pki.clients["admin"]
    return {
        "tls": ServerTLS(cert=cert, key=key, ca=pki.ca_cert),
        "client_tls": ClientTLS(ca=pki.ca_cert, cert=admin_cert, key=admin_key),
    }


async def test_over_mutual_tls_by_flags_environment_or_beside_llmgw_up(
    tmp_path: Path, pki: certs.LocalTLS
) -> None:
    """Against a fleet that requires a client certificate, `ctl` works with the pair given as
    flags (before or after the command), as LLMGW_TLS_*, or found under $LLMGW_DATA/tls; with
    none, or with a certificate of another CA, it exits 3 saying what to check."""
    ca, (cert, key) = str(pki.ca_cert), map(str, pki.clients["admin"])
    flags = ("--tls-ca", ca, "--tls-cert", cert, "--tls-key", key)
    other = certs.make_local_tls(tmp_path / "other")
    async with running_fleet(tmp_path, **mutual(pki)) as (fleet, _stub):
        created = await ctl(
            fleet.port, *flags, "model", "create", str(write_model(tmp_path / "m.yaml"))
        )
        assert created.code == 0, created.err
        runs = [
            await ctl(fleet.port, "model", "list", *flags),
            await ctl(
                fleet.port,
                "model",
                "list",
                env=_env(LLMGW_TLS_CA=ca, LLMGW_TLS_CERT=cert, LLMGW_TLS_KEY=key),
            ),
            await ctl(fleet.port, "model", "list", env=_env(LLMGW_DATA=str(tmp_path / "data"))),
        ]
        plaintext = await ctl(fleet.port, "model", "list")
        stranger = await ctl(
            fleet.port,
            "model",
            "list",
            "--tls-ca",
            ca,
            "--tls-cert",
            str(other.clients["admin"][0]),
            "--tls-key",
            str(other.clients["admin"][1]),
        )
    for run in runs:
        assert run.code == 0, run.err
        assert run.out.splitlines()[1].split()[0] == "qwen"
    assert plaintext.code == EXIT_UNREACHABLE
    assert "may require TLS" in plaintext.err and "LLMGW_DATA" in plaintext.err
    assert stranger.code == EXIT_UNREACHABLE
    assert "did not accept this client's certificate" in stranger.err
    for run in (plaintext, stranger):
        assert "Traceback" not in run.err and "ssl_transport_security" not in run.err


async def test_half_a_pair_or_a_missing_file_is_bad_usage(tmp_path: Path) -> None:
    """A certificate without its key, or a CA file that is not there, exits 64 naming it,
    before anything is dialled."""
    half = await ctl(1, "--tls-cert", str(tmp_path / "c.crt"), "model", "list")
    assert half.code == EXIT_USAGE and "go together" in half.err
    missing = await ctl(1, "--tls-ca", str(tmp_path / "nope.crt"), "model", "list")
    assert missing.code == EXIT_USAGE and "nope.crt" in missing.err


def pair_flags(pki: certs.LocalTLS, user: str) -> tuple[str, ...]:
    """`--tls-ca/--tls-cert/--tls-key` for `user`'s pair of the local CA."""
    cert, key = pki.clients[user]
    return ("--tls-ca", str(pki.ca_cert), "--tls-cert", str(cert), "--tls-key", str(key))


async def test_the_viewer_lists_but_may_not_change_and_the_author_is_the_certificate(
    tmp_path: Path, pki: certs.LocalTLS
) -> None:
    """With the fleet's default roles (admin, viewer: the pairs `llmgw up` makes), the viewer
    lists the catalog but its create and delete exit 2 naming the role they need; the admin's
    create is recorded as `admin` whatever --as says."""
    model = str(write_model(tmp_path / "m.yaml"))
    async with running_fleet(tmp_path, **mutual(pki)) as (fleet, stub):
        refused = await ctl(fleet.port, *pair_flags(pki, "viewer"), "model", "create", model)
        created = await ctl(
            fleet.port, *pair_flags(pki, "admin"), "--as", "mallory", "model", "create", model
        )
        listed = await ctl(fleet.port, *pair_flags(pki, "viewer"), "model", "list", "--json")
        deleting = await ctl(
            fleet.port, *pair_flags(pki, "viewer"), "--json", "model", "delete", "qwen"
        )
        got = await stub.GetModel(fleet_pb2.GetModelRequest(name="qwen"))
    assert refused.code == EXIT_REFUSED
    assert refused.err.startswith("refused (ROLE_REQUIRED): ")
    assert "required_role: admin" in refused.err and "identity: user:viewer" in refused.err
    assert created.code == 0, created.err
    assert got.model.updated_by == "admin"
    assert listed.code == 0, listed.err
    data = listed.json()
    assert isinstance(data, dict) and [m["model"]["name"] for m in data["models"]] == ["qwen"]
    assert deleting.code == EXIT_REFUSED
    error = deleting.json()
    assert isinstance(error, dict)
    assert error["error"]["code"] == "PERMISSION_DENIED"
    assert error["error"]["metadata"]["required_role"] == "admin"


async def test_a_bearer_token_is_a_caller_too(tmp_path: Path, pki: certs.LocalTLS) -> None:
    """Against a fleet serving TLS with a tokens file, `--token` (or LLMGW_TOKEN) with the CA
    is the token's user, in its role and in the audit trail; a wrong token is refused
    UNAUTHENTICATED (exit 2)."""
    token = "tok-" + "7" * 40
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {hashlib.sha256(token.encode()).hexdigest()}\n")
    settings = tmp_path / "settings.yaml"
    settings.write_text("roles:\n  admin: [alice]\n")
    cert, key = pki.servers["fleet"]
    ca = str(pki.ca_cert)
    async with running_fleet(
        tmp_path,
        tls=ServerTLS(cert=cert, key=key),
        client_tls=ClientTLS(ca=pki.ca_cert),
        tokens_path=str(tokens),
        settings=str(settings),
    ) as (fleet, stub):
        model = str(write_model(tmp_path / "m.yaml"))
        created = await ctl(fleet.port, "--tls-ca", ca, "--token", token, "model", "create", model)
        listed = await ctl(
            fleet.port, "model", "list", env=_env(LLMGW_TLS_CA=ca, LLMGW_TOKEN=token)
        )
        wrong = await ctl(fleet.port, "--tls-ca", ca, "--token", "nope", "model", "list")
        got = await stub.GetModel(
            fleet_pb2.GetModelRequest(name="qwen"),
            metadata=(("authorization", f"Bearer {token}"),),
        )
    assert created.code == 0, created.err
    assert got.model.updated_by == "alice"
    assert listed.code == 0, listed.err
    assert "qwen" in listed.out
    assert wrong.code == EXIT_REFUSED
    assert wrong.err.startswith("refused (UNAUTHENTICATED)")


async def test_beside_llmgw_up_a_plaintext_fleet_needs_plaintext(
    tmp_path: Path, pki: certs.LocalTLS
) -> None:
    """Where a local `llmgw up`'s pair is found but the fleet serves plaintext, `ctl` exits 3
    saying the server does not speak TLS and naming the files and --plaintext; with
    --plaintext it answers."""
    beside = _env(LLMGW_DATA=str(tmp_path / "data"))
    async with running_fleet(tmp_path) as (fleet, _stub):
        found = await ctl(fleet.port, "model", "list", env=beside)
        plain = await ctl(fleet.port, "model", "list", "--plaintext", "--json", env=beside)
    assert found.code == EXIT_UNREACHABLE
    assert "does not speak TLS" in found.err
    assert str(tmp_path / "data" / "tls") in found.err and "--plaintext" in found.err
    assert plain.code == 0, plain.err
    assert plain.json() == {"models": []}


async def test_model_update_rolls_out_and_says_when_nothing_changes(tmp_path: Path) -> None:
    """`model update` with the file as stored says the model is already as asked (no
    revision); with new args it starts a rollout and follows it to success; --json prints
    the answer with the proto's field names."""
    path = write_model(tmp_path / "m.yaml", replicas=1)
    async with _running_fleet(tmp_path, liveness=PATIENT) as (fleet, stub):
        agent = ScriptedAgent(f"127.0.0.1:{fleet.port}", "node-a", gpus=4)
        agent.start()
        try:
            assert (await ctl(fleet.port, "model", "create", str(path))).code == 0

            async def ready() -> bool:
                rs = (await stub.ListReplicas(fleet_pb2.ListReplicasRequest())).replicas
                return len(rs) == 1 and rs[0].phase == fleet_pb2.REPLICA_PHASE_READY

            await assert_eventually(ready, timeout_s=30, what="a READY replica")
            same = await ctl(fleet.port, "model", "update", str(path))
            assert same.code == 0, same.err
            assert same.out.strip() == "model qwen is already as asked (revision 1)"
            data = yaml.safe_load(path.read_text())
            data["profiles"][0]["args"] += ["--max-num-seqs", "32"]
            path.write_text(yaml.safe_dump(data))
            dry = await ctl(fleet.port, "model", "update", str(path), "--dry-run", "--json")
            assert dry.code == 0, dry.err
            answer = dry.json()
            assert answer["restarted"] == 1 and answer["model"]["etag"] == ""
            assert camel_keys(answer) == []
            run = await ctl(fleet.port, "model", "update", str(path))
            assert run.code == 0, run.err
            first = run.out.splitlines()[0]
            assert first.startswith("updated model qwen (revision 2); rollout ro")
            assert "(update, beside): succeeded" in run.out
            assert "replica stopped" in run.out
            rs = (await stub.ListReplicas(fleet_pb2.ListReplicasRequest())).replicas
            assert [list(r.args)[-2:] for r in rs] == [["--max-num-seqs", "32"]]
        finally:
            await agent.stop()


async def test_an_unchecked_plan_is_refused_unless_allow_unchecked(tmp_path: Path) -> None:
    """`model gpus` of a model the planner cannot read exits 2 naming PLAN_NOT_CHECKED and
    writes nothing; with --allow-unchecked it is applied (revision 2)."""
    path = write_model(tmp_path / "m.yaml", replicas=0)
    data = yaml.safe_load(path.read_text())
    data["source"] = "http://127.0.0.1:1/unreachable.gguf"
    path.write_text(yaml.safe_dump(data))
    async with (
        running_planner() as (planner, _p, _c),
        _running_fleet(tmp_path, liveness=PATIENT, planner=f"127.0.0.1:{planner.port}") as (
            fleet,
            stub,
        ),
    ):
        assert (await ctl(fleet.port, "model", "create", str(path))).code == 0
        refused = await ctl(fleet.port, "model", "gpus", "qwen", "2")
        assert refused.code == 2 and "PLAN_NOT_CHECKED" in refused.err, refused.err
        got = await stub.GetModel(fleet_pb2.GetModelRequest(name="qwen"))
        assert got.model.revision == 1
        run = await ctl(fleet.port, "model", "gpus", "qwen", "2", "--allow-unchecked")
        assert run.code == 0, run.err
        got = await stub.GetModel(fleet_pb2.GetModelRequest(name="qwen"))
        assert (got.model.revision, got.model.model.profiles[0].gpus_per_node) == (2, 2)


async def test_model_context_and_gpus_carry_a_batch_and_print_whether_it_fits(
    tmp_path: Path,
) -> None:
    """`model context ... --sequences N` and `model gpus ... --sequences N` ask the fleet for
    that batch: the planner writes it to vLLM's --max-num-seqs and each prints the batch's
    verdict after the change (and `--json` carries it); a negative count is bad usage."""
    path = write_model(tmp_path / "m.yaml")
    data = yaml.safe_load(path.read_text())
    data["shape"] = LLAMA_8B_SHAPE
    path.write_text(yaml.safe_dump(data))
    async with (
        running_planner() as (planner, _p, _c),
        _running_fleet(tmp_path, liveness=PATIENT, planner=f"127.0.0.1:{planner.port}") as (
            fleet,
            _stub,
        ),
    ):
        agent = ScriptedAgent(f"127.0.0.1:{fleet.port}", "node-a", gpus=4)
        agent.start()
        try:
            assert (await ctl(fleet.port, "model", "create", str(path))).code == 0
            run = await ctl(
                fleet.port, "model", "context", "qwen", "8192", "--sequences", "16", "--dry-run"
            )
            assert run.code == 0, run.err
            assert "batch of 16 x 8192 tokens on gpu (vllm, --max-num-seqs): fits" in run.out
            gpus = await ctl(
                fleet.port, "model", "gpus", "qwen", "1", "--sequences", "16", "--dry-run", "--json"
            )
            assert gpus.code == 0, gpus.err
            answer = gpus.json()
            assert [(b["sequences"], b["fits"]) for b in answer["batches"]] == [(16, True)]
            args = answer["model"]["model"]["profiles"][0]["args"]
            assert args[args.index("--max-num-seqs") + 1] == "16"
            bad = await ctl(fleet.port, "model", "context", "qwen", "8192", "--sequences", "-1")
            assert bad.code == EXIT_USAGE and "--sequences" in bad.err
        finally:
            await agent.stop()
