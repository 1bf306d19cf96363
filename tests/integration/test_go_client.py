"""The Go stubs (gen/go) as a gateway team uses them: a Go client (tests/go/client), a module
of its own on the newest grpc-go requiring gen/go by replace, built in module mode from the
committed go.sum (modules from the Go module proxy's cache), calls every planner and fleet RPC
over mutual TLS,
follows rollouts with WatchRollout, routes from WatchReplicas, and decodes ErrorInfo from
every refusal reason of both services' tables that a caller can provoke; and, given two fleets
on one PostgreSQL with the follower first, finds the leader through NOT_LEADER's ErrorInfo."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from google.protobuf.message import Message

from bench.go_swarm import module_env
from fleet_svc.rpc import status as fleet_status
from fleet_svc.server import FleetOptions, FleetServer, start_fleet
from llmgw import certs
from llmgw.agent.v1 import agent_pb2
from llmgw.common.v1 import common_pb2
from llmgw.demo.tiny_gguf import write_tiny_gguf
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.planner.v1 import planner_pb2
from llmgw.testing.range_server import RangeServer
from llmgw.testing.scripted_agent import ScriptedAgent
from llmgw.tls import ClientTLS, ServerTLS, aio_channel
from planner_svc.rpc import status as planner_status
from planner_svc.server import PlannerServer, start_planner
from planner_svc.sources.policy import SourcePolicy
from tests.support.fleet import FAST
from tests.support.postgres import fresh_database
from tests.support.shapes import LLAMA_31_8B, inline

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "tests" / "go" / "client"
H100 = "H100-80GB"

# Reasons of the tables no caller can provoke against a healthy fleet, and why.
NOT_PROVOKED = {
    # The catch-all rows: every refusal either service raises has its own reason.
    "REFUSED": "the tables' catch-all for a refusal class without a row; none is raised",
    # The store failing under a call (tests/integration/test_store_outage.py,
    # test_store_damage.py and test_store_lease.py provoke them against the store itself).
    "STORE_UNAVAILABLE": "needs the store to go away under a running fleet",
    "STORE_DAMAGED": "needs a damaged store page under a running fleet",
    # tests/integration/test_error_model.py runs a planner that fails for this one.
    "PLANNER_FAILED": "needs a planner answering INTERNAL (failing, not refusing)",
    # The fleet's catalog refuses such a gang first (INVALID_MODEL, decoded); the planner's
    # table names the engines' refusal so it never falls to the catch-all.
    "ENGINE_SINGLE_NODE": "raised only when a gang is launched; the catalog refuses it before",
    # Caps on concurrent work: provoking them needs more calls held open at once than this
    # run makes (tests/integration/test_fairness.py holds streams past the fleet's cap;
    # tests/unit/test_fetch_budget.py holds resolutions past the planner's).
    "TOO_MANY_CALLS": "needs a caller holding more streams or calls open than its cap",
    "RESOLUTIONS_BUSY": "needs more source resolutions in flight at once than the planner's cap",
    # tests/integration/test_canary.py fails canaries and reads Rollout.failure.
    "CANARY_ANALYSIS_FAILED": "a failed canary's Rollout.failure, never the status of a call",
}
# Reasons the leader run (two fleets on one PostgreSQL) decodes, not the main run.
DECODED_BY_THE_LEADER_RUN = {"NOT_LEADER"}
# The planner's InvalidValue refusals take their reason from the error (planner_svc/domain).
PLANNER_VALUE_REASONS = {
    "CONTEXT_OVER_LIMIT",
    "GPU_COUNT_OUT_OF_RANGE",
    "INVALID_REQUEST",
    "NO_GPU_PROFILE",
    "PROFILE_ON_CPU",
}


def table_reasons() -> set[str]:
    """Every reason in the fleet's and the planner's status tables."""
    reasons = {reason for _, _, reason in fleet_status._TABLE}
    reasons |= {reason for _, _, reason in fleet_status._STORE_TABLE}
    reasons |= {reason for _, _, reason in planner_status._TABLE if reason is not None}
    return reasons | PLANNER_VALUE_REASONS


def as_json(msg: Message) -> dict[str, Any]:
    """A message in proto JSON (the field names), as the Go client decodes it."""
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def llama(name: str, gpu_class: str = H100, engine: str = "vllm", **profile: Any) -> Any:
    """Llama-3.1-8B (its shape inline, so no source is read) with one one-card profile."""
    return common_pb2.Model(
        name=name,
        source="hf://meta-llama/Llama-3.1-8B-Instruct",
        context_length=8192,
        max_output=1024,
        shape=inline(LLAMA_31_8B),
        profiles=[
            common_pb2.Profile(
                name="gpu",
                engine=engine,
                gpu_class=gpu_class,
                gpus_per_node=0 if profile.get("cpu_only") else 1,
                replicas=1,
                **profile,
            )
        ],
    )


INVENTORY = common_pb2.Inventory(
    nodes=[
        common_pb2.InventoryNode(
            name="n1",
            gpu_class=H100,
            gpus=4,
            free_gpus=4,
            gpu_memory_bytes=81559 << 20,
            memory_bytes=256 * 10**9,
        )
    ]
)
TINY_CARDS = common_pb2.Inventory(
    nodes=[common_pb2.InventoryNode(name="n1", gpu_class=H100, gpus=4, gpu_memory_bytes=4 << 30)]
)


def refusal(
    name: str,
    service: str,
    method: str,
    request: Message,
    code: str,
    reason: str,
    *,
    who: str = "admin",
    metadata: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One refusal for the Go client to provoke and decode."""
    return {
        "name": name,
        "service": service,
        "as": who,
        "method": method,
        "request": as_json(request),
        "metadata": metadata or {},
        "code": code,
        "reason": reason,
    }


def refusals(gguf_url: str) -> list[dict[str, Any]]:
    """The refusals a single request provokes (the Go client provokes the ones needing a
    state, such as a rollout in flight, itself)."""
    m = llama("m")
    no_shape = inline(LLAMA_31_8B)
    no_shape.layers = 0
    del no_shape.layer_shapes[:]
    ftp = llama("ftp-model")
    ftp.source = "ftp://example.invalid/x.gguf"
    sc = planner_pb2.SizeContextRequest
    pg = planner_pb2.PlanGPUsRequest
    p = "planner"
    bad = "INVALID_ARGUMENT"
    pre = "FAILED_PRECONDITION"
    many = llama("many")
    many.profiles.extend(
        common_pb2.Profile(name=f"gpu-{i}", engine="vllm", gpu_class=H100, gpus_per_node=1)
        for i in range(64)
    )
    return [
        refusal(
            "65 profiles",
            p,
            "SizeContext",
            sc(model=many, tokens=8192, inventory=INVENTORY),
            bad,
            "LIMIT_EXCEEDED",
        ),
        refusal(
            "16 tokens",
            p,
            "SizeContext",
            sc(model=m, tokens=16, inventory=INVENTORY),
            bad,
            "CONTEXT_TOO_SHORT",
        ),
        refusal(
            "2^24 + 1 tokens",
            p,
            "SizeContext",
            sc(model=m, tokens=(1 << 24) + 1, inventory=INVENTORY),
            bad,
            "CONTEXT_OVER_LIMIT",
        ),
        refusal(
            "100 slots",
            p,
            "SizeContext",
            sc(model=llama("m", engine="llamacpp"), tokens=8192, slots=100, inventory=INVENTORY),
            bad,
            "SLOTS_OUT_OF_RANGE",
        ),
        refusal(
            "twice the trained context",
            p,
            "SizeContext",
            sc(model=m, tokens=262144, inventory=INVENTORY),
            bad,
            "CONTEXT_OVER_TRAINED",
        ),
        refusal(
            "3 cards for 32 heads",
            p,
            "PlanGPUs",
            pg(model=m, gpus=3, inventory=INVENTORY),
            bad,
            "HEADS_NOT_DIVISIBLE",
        ),
        refusal(
            "an unknown engine",
            p,
            "SizeContext",
            sc(model=llama("m", engine="nosuch"), tokens=8192, inventory=INVENTORY),
            bad,
            "UNKNOWN_ENGINE",
        ),
        refusal(
            "an inline shape without layers",
            p,
            "SizeContext",
            sc(
                model=common_pb2.Model(
                    name="m", source=m.source, profiles=m.profiles, shape=no_shape
                ),
                tokens=8192,
                inventory=INVENTORY,
            ),
            bad,
            "INVALID_SHAPE",
        ),
        refusal(
            "0 cards",
            p,
            "PlanGPUs",
            pg(model=m, gpus=0, inventory=INVENTORY),
            bad,
            "GPU_COUNT_OUT_OF_RANGE",
        ),
        refusal(
            "no model named",
            p,
            "SizeContext",
            sc(tokens=8192, inventory=INVENTORY),
            bad,
            "INVALID_REQUEST",
        ),
        refusal(
            "a context for an embedding engine",
            p,
            "SizeContext",
            sc(model=llama("m", engine="tei"), tokens=8192, inventory=INVENTORY),
            pre,
            "ENGINE_NO_CONTEXT",
        ),
        refusal(
            "4 GiB cards",
            p,
            "SizeContext",
            sc(model=m, tokens=8192, inventory=TINY_CARDS),
            pre,
            "CARDS_TOO_SMALL",
        ),
        refusal(
            "8 cards where nodes have 4",
            p,
            "PlanGPUs",
            pg(model=m, gpus=8, inventory=INVENTORY),
            pre,
            "GPU_COUNT_UNAVAILABLE",
        ),
        refusal(
            "2 cards for a one-card engine",
            p,
            "PlanGPUs",
            pg(model=llama("m", engine="tei"), gpus=2, inventory=INVENTORY),
            pre,
            "ENGINE_SINGLE_CARD",
        ),
        refusal(
            "a utilisation of 2",
            p,
            "SizeContext",
            sc(
                model=llama("m", args=["--gpu-memory-utilization", "2"]),
                tokens=8192,
                inventory=INVENTORY,
            ),
            pre,
            "ENGINE_REFUSES",
        ),
        refusal(
            "a source nothing serves",
            p,
            "DescribeModel",
            planner_pb2.DescribeModelRequest(source=gguf_url.rsplit("/", 1)[0] + "/none.gguf"),
            pre,
            "SOURCE_UNREACHABLE",
        ),
        refusal(
            "an unknown profile",
            p,
            "PlanGPUs",
            pg(model=m, gpus=2, profile="nope", inventory=INVENTORY),
            "NOT_FOUND",
            "PROFILE_NOT_FOUND",
        ),
        refusal(
            "cards for a CPU-only model",
            p,
            "PlanGPUs",
            pg(
                model=llama("m", gpu_class="", cpu_only=True, min_memory_gb=32),
                gpus=2,
                inventory=INVENTORY,
            ),
            bad,
            "NO_GPU_PROFILE",
        ),
        refusal(
            "cards for a CPU profile",
            p,
            "PlanGPUs",
            pg(
                model=llama("m", gpu_class="", cpu_only=True, min_memory_gb=32),
                gpus=2,
                profile="gpu",
                inventory=INVENTORY,
            ),
            bad,
            "PROFILE_ON_CPU",
        ),
        # The fleet.
        refusal(
            "an unknown model",
            "fleet",
            "GetModel",
            fleet_pb2.GetModelRequest(name="nope"),
            "NOT_FOUND",
            "MODEL_NOT_FOUND",
        ),
        refusal(
            "deleting a declared model",
            "fleet",
            "DeleteModel",
            fleet_pb2.DeleteModelRequest(name="declared"),
            pre,
            "MODEL_DECLARED",
        ),
        refusal(
            "an ftp source",
            "fleet",
            "CreateModel",
            fleet_pb2.CreateModelRequest(model=ftp),
            bad,
            "INVALID_SOURCE",
        ),
        refusal(
            "a name with a space",
            "fleet",
            "CreateModel",
            fleet_pb2.CreateModelRequest(model=llama("Bad Name")),
            bad,
            "INVALID_MODEL",
        ),
        refusal(
            "an unknown rollout",
            "fleet",
            "GetRollout",
            fleet_pb2.GetRolloutRequest(id="nope"),
            "NOT_FOUND",
            "ROLLOUT_NOT_FOUND",
        ),
        refusal(
            "watching an unknown rollout",
            "fleet",
            "WatchRollout",
            fleet_pb2.WatchRolloutRequest(id="nope"),
            "NOT_FOUND",
            "ROLLOUT_NOT_FOUND",
        ),
        refusal(
            "a viewer creating a model",
            "fleet",
            "CreateModel",
            fleet_pb2.CreateModelRequest(model=llama("by-viewer")),
            "PERMISSION_DENIED",
            "ROLE_REQUIRED",
            who="viewer",
        ),
        refusal(
            "a gateway acting for a malformed name",
            "fleet",
            "ListModels",
            fleet_pb2.ListModelsRequest(),
            "UNAUTHENTICATED",
            "UNAUTHENTICATED",
            who="gateway",
            metadata={"x-llmgw-caller": "not a name!"},
        ),
        refusal(
            "a change whose plan the planner could not check",
            "fleet",
            "SetGPUs",
            fleet_pb2.SetGPUsRequest(name="go-unread", gpus=2),
            "FAILED_PRECONDITION",
            "PLAN_NOT_CHECKED",
        ),
        refusal(
            "a change while the planner is down",
            "dead_fleet",
            "SetGPUs",
            fleet_pb2.SetGPUsRequest(name="orphan", gpus=2, dry_run=True),
            "UNAVAILABLE",
            "PLANNER_UNAVAILABLE",
        ),
    ]


def stuck_phase(spec: agent_pb2.ReplicaSpec) -> agent_pb2.ProcessPhase.ValueType:
    """go-stuck's new revisions never turn healthy (its rollout stays RUNNING); the rest do."""
    if spec.model == "go-stuck" and spec.revision > 1:
        return agent_pb2.PROCESS_PHASE_STARTING
    return agent_pb2.PROCESS_PHASE_HEALTHY


SETTINGS = """\
roles:
  admin: [admin]
  operator: [gateway]
  viewer: [viewer, fleet-caller]
  gateway: [gateway]
models:
  - name: declared
    source: hf://x/y
    profiles:
      - {name: gpu, engine: vllm, gpu_class: H100-80GB, gpus_per_node: 1, replicas: 0}
"""


class Pki:
    """The local CA and every pair the run needs."""

    def __init__(self, folder: Path) -> None:
        self.local = certs.make_local_tls(
            folder,
            servers=("planner", "fleet"),
            nodes=("a", "b", "c", "spare"),
            clients=("admin", "viewer", "gateway", "fleet-caller"),
        )

    def server(self, name: str) -> ServerTLS:
        cert, key = self.local.servers[name]
        return ServerTLS(cert=cert, key=key, ca=self.local.ca_cert)

    def client(self, name: str) -> ClientTLS:
        cert, key = self.local.clients[name]
        return ClientTLS(ca=self.local.ca_cert, cert=cert, key=key)

    def node(self, name: str) -> ClientTLS:
        cert, key = self.local.nodes[name]
        return ClientTLS(ca=self.local.ca_cert, cert=cert, key=key)

    def pairs(self) -> dict[str, dict[str, str]]:
        named = {n: self.local.clients[n] for n in ("admin", "viewer", "gateway")}
        named["node"] = self.local.nodes["spare"]
        return {n: {"cert": str(c), "key": str(k)} for n, (c, k) in named.items()}


def fleet_options(data: Path, pki: Pki, planner: str, settings: Path) -> FleetOptions:
    """A fleet over mutual TLS, fast liveness and ticks, dialling `planner` as user fleet-caller."""
    return FleetOptions(
        listen="127.0.0.1:0",
        store_url=str(data / "fleet.db"),
        settings_path=str(settings),
        liveness=FAST,
        drain_s=0.2,
        tick_s=0.05,
        planner=planner,
        start_timeout_s=120.0,
        tls=pki.server("fleet"),
        planner_tls=pki.client("fleet-caller"),
    )


@asynccontextmanager
async def services(tmp: Path, pki: Pki, gguf_root: Path) -> AsyncIterator[dict[str, Any]]:
    """A planner, a fleet with three scripted agents (a and b: 4 H100s; c: 2 L4s), and a
    second fleet whose planner is unreachable; what the Go client's config needs."""
    settings = tmp / "settings.yaml"
    settings.write_text(SETTINGS)
    async with AsyncExitStack() as stack:
        policy = SourcePolicy.from_settings(allow_hosts=["127.0.0.1:*"])
        planner: PlannerServer = await start_planner(
            "127.0.0.1:0", tls=pki.server("planner"), policy=policy, settings_path=str(settings)
        )
        stack.push_async_callback(planner.stop, 0.5)
        planner_at = f"127.0.0.1:{planner.port}"
        (tmp / "live").mkdir()
        (tmp / "dead").mkdir()
        fleet: FleetServer = await start_fleet(
            fleet_options(tmp / "live", pki, planner_at, settings)
        )
        stack.push_async_callback(fleet.stop, 0.5)
        dead: FleetServer = await start_fleet(
            fleet_options(tmp / "dead", pki, "127.0.0.1:1", settings)
        )
        stack.push_async_callback(dead.stop, 0.5)
        fleet_at = f"127.0.0.1:{fleet.port}"
        for node, gpu_class, gpus in (("a", H100, 4), ("b", H100, 4), ("c", "L4", 2)):
            agent = ScriptedAgent(
                fleet_at,
                node,
                gpu_class=gpu_class,
                gpus=gpus,
                phase_for=stuck_phase,
                tls=pki.node(node),
            )
            agent.start()
            stack.push_async_callback(agent.stop)
        channel = aio_channel(f"127.0.0.1:{dead.port}", pki.client("admin"))
        stack.push_async_callback(channel.close)
        await fleet_pb2_grpc.FleetServiceStub(channel).CreateModel(
            fleet_pb2.CreateModelRequest(model=llama("orphan")), timeout=30
        )
        # A model whose shape the planner cannot read (no inline shape, a source nothing
        # serves): a change to it is an unchecked plan.
        unread = llama("go-unread")
        unread.ClearField("shape")
        unread.profiles[0].replicas = 0
        unread.source = "http://127.0.0.1:1/unreachable.gguf"
        live = aio_channel(fleet_at, pki.client("admin"))
        stack.push_async_callback(live.close)
        await fleet_pb2_grpc.FleetServiceStub(live).CreateModel(
            fleet_pb2.CreateModelRequest(model=unread), timeout=30
        )
        with RangeServer(gguf_root) as files:
            yield {
                "planner": planner_at,
                "fleet": fleet_at,
                "dead_fleet": f"127.0.0.1:{dead.port}",
                "gguf_url": files.url("tiny.gguf"),
            }


async def run(
    argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float
) -> tuple[int, str, str]:
    """A child process's exit code, stdout and stderr (the servers in this loop answer it)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def go_tool() -> str | None:
    """The machine's go: PATH's, else /usr/local/go/bin/go (where the Makefile finds it)."""
    found = shutil.which("go")
    if found is None and Path("/usr/local/go/bin/go").is_file():
        found = "/usr/local/go/bin/go"
    return found


@pytest.fixture(scope="module")
def go() -> str:
    """The machine's go; the test is skipped, saying so, only where it is not installed."""
    found = go_tool()
    if found is None:
        pytest.skip("go is not installed: `make go-tools` says which Go gen/go needs")
    return found


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_go_client_calls_every_rpc_routes_and_decodes_every_refusal(
    go: str, tmp_path: Path
) -> None:
    """Built in module mode on the newest grpc-go, the Go client calls every RPC of both
    services (and the agents' Connect), follows three rollouts to SUCCEEDED and one to
    CANCELLED (resuming each watch from the last seq), reports traffic as the gateway, routes
    to the new revision from WatchReplicas with never fewer endpoints than before a beside
    rollout, and decodes ErrorInfo with the reason, domain and metadata of every reason in the
    tables a caller can provoke."""
    pki = Pki(tmp_path / "tls")
    models = tmp_path / "models"
    models.mkdir()
    write_tiny_gguf(models / "tiny.gguf")
    env = module_env()
    code, _, err = await run([go, "build", "-o", str(tmp_path / "client"), "."], CLIENT, env, 240)
    assert code == 0, err
    async with services(tmp_path, pki, models) as at:
        config = at | {
            "ca": str(pki.local.ca_cert),
            "pairs": pki.pairs(),
            "node": "spare",
            "model": as_json(llama("go-llama")),
            "stuck_model": as_json(llama("go-stuck")),
            "small_model": as_json(llama("go-small", gpu_class="L4")),
            # A second one-card model on node c (2 L4 cards): go-small can then never get both.
            "neighbour_model": as_json(llama("go-neighbour", gpu_class="L4")),
            "inventory": as_json(INVENTORY),
            "refusals": refusals(at["gguf_url"]),
        }
        path = tmp_path / "config.json"
        path.write_text(json.dumps(config))
        code, out, err = await run(
            [str(tmp_path / "client"), "-config", str(path)], tmp_path, env, 240
        )
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    failures = [x["message"] for x in lines if x["kind"] == "failure"]
    assert code == 0 and not failures, (failures, err[:4000])
    assert lines[-1] == {"kind": "done"}

    rpcs = {(x["service"], x["method"]) for x in lines if x["kind"] == "rpc"}
    want = {
        ("planner", m.name)
        for m in planner_pb2.DESCRIPTOR.services_by_name["PlannerService"].methods
    }
    want |= {
        ("fleet", m.name) for m in fleet_pb2.DESCRIPTOR.services_by_name["FleetService"].methods
    }
    assert want - rpcs == set(), "RPCs the Go client did not call"

    rollouts = {x["what"]: x for x in lines if x["kind"] == "rollout"}
    for what in ("gpus", "context", "undo"):
        assert rollouts[what]["state"] == "ROLLOUT_STATE_SUCCEEDED", rollouts[what]
        assert rollouts[what]["events"][-1] == "rollout_succeeded"
        assert "replica_ready" in rollouts[what]["events"]
    assert rollouts["cancelled"]["state"] == "ROLLOUT_STATE_CANCELLED"
    routes = [x for x in lines if x["kind"] == "route"]
    assert routes[-1]["revision"] == rollouts["gpus"]["to_revision"]
    assert routes[-1]["fewest_during_rollout"] >= 1
    assert routes[-1]["addresses"] and routes[-1]["addresses"][0].startswith("127.0.0.1:")

    decoded = {x["reason"]: x for x in lines if x["kind"] == "refusal"}
    missing = table_reasons() - set(NOT_PROVOKED) - DECODED_BY_THE_LEADER_RUN - set(decoded)
    assert not missing, (
        "reasons in the status tables the Go client never decoded: add a case to refusals() "
        f"or the Go client, or say in NOT_PROVOKED why none can be: {sorted(missing)}"
    )
    assert not set(NOT_PROVOKED) & set(decoded), "a reason listed as not provoked was decoded"
    planner_cases = {c["name"] for c in config["refusals"] if c["service"] == "planner"}
    for x in decoded.values():
        domain = "planner.llmgw.dev" if x["case"] in planner_cases else "fleet.llmgw.dev"
        assert x["domain"] == domain, x
    assert decoded["CONTEXT_TOO_SHORT"]["metadata"] == {"tokens": "16", "minimum": "256"}
    assert decoded["GPU_COUNT_UNAVAILABLE"]["metadata"]["largest"] == "4"
    assert str(tmp_path / "settings.yaml") in decoded["MODEL_DECLARED"]["message"]


LEASE_S, RENEW_S = 1.5, 0.3
"""The leader run's lease (as tests/integration/test_fleet_leader.py's)."""


@asynccontextmanager
async def two_fleets(tmp: Path, pki: Pki) -> AsyncIterator[tuple[str, str]]:
    """A planner and two fleets on a fresh PostgreSQL database over mutual TLS, with a
    scripted agent (node a, 4 H100s) on the leader: (the leader's, the follower's address)."""
    settings = tmp / "settings.yaml"
    settings.write_text(SETTINGS)
    with fresh_database() as (_name, dsn):
        async with AsyncExitStack() as stack:
            planner: PlannerServer = await start_planner(
                "127.0.0.1:0", tls=pki.server("planner"), settings_path=str(settings)
            )
            stack.push_async_callback(planner.stop, 0.5)
            fleets: list[FleetServer] = []
            for _ in range(2):
                opts = fleet_options(tmp, pki, f"127.0.0.1:{planner.port}", settings)
                opts.store_url, opts.lease_s, opts.renew_s = dsn, LEASE_S, RENEW_S
                fleets.append(await start_fleet(opts))
                stack.push_async_callback(fleets[-1].stop, 0.5)
            leader, follower = fleets
            assert (leader.is_leader, follower.is_leader) == (True, False)
            at = f"127.0.0.1:{leader.port}"
            agent = ScriptedAgent(at, "a", gpu_class=H100, gpus=4, tls=pki.node("a"))
            agent.start()
            stack.push_async_callback(agent.stop)
            yield at, f"127.0.0.1:{follower.port}"


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_go_client_given_the_follower_first_finds_the_leader(go: str, tmp_path: Path) -> None:
    """Given a dead address, the follower and the leader (two fleets on one PostgreSQL), the
    Go client decodes the follower's NOT_LEADER (a change, ListNodes) naming the leader, sees
    an agent's Connect welcomed there (every fleet serves agents), creates a model and changes
    its context through the follower's redirect (a retry with the request id answers the same
    rollout), and routes from the
    follower's WatchReplicas and follows the rollout on the follower to the new revision (the
    redirect is gen/go/client's Leader; its own tests, how a --fleet value is read among them,
    are `make go-test`'s and tests/integration/test_go_client_pkg.py's)."""
    pki = Pki(tmp_path / "tls")
    env = module_env()
    code, _, err = await run([go, "build", "-o", str(tmp_path / "client"), "."], CLIENT, env, 240)
    assert code == 0, err
    async with two_fleets(tmp_path, pki) as (leader, follower):
        config = {
            "scenario": "leader",
            "fleets": f"127.0.0.1:1,{follower},{leader}",
            "follower": follower,
            "leader": leader,
            "ca": str(pki.local.ca_cert),
            "pairs": pki.pairs(),
            "node": "spare",
            "model": as_json(llama("go-led")),
        }
        path = tmp_path / "config.json"
        path.write_text(json.dumps(config))
        code, out, err = await run(
            [str(tmp_path / "client"), "-config", str(path)], tmp_path, env, 240
        )
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    failures = [x["message"] for x in lines if x["kind"] == "failure"]
    assert code == 0 and not failures, (failures, err[:4000])
    assert lines[-1] == {"kind": "done"}

    refusals_seen = [x for x in lines if x["kind"] == "refusal"]
    assert {x["case"] for x in refusals_seen} == {
        "CreateModel on a follower",
        "ListNodes on a follower",
    }
    assert [x["case"] for x in lines if x["kind"] == "served"] == ["Connect on a follower"]
    assert {x["reason"] for x in refusals_seen} == DECODED_BY_THE_LEADER_RUN
    assert table_reasons() >= DECODED_BY_THE_LEADER_RUN, "a reason the tables no longer name"
    for x in refusals_seen:
        assert (x["code"], x["domain"]) == ("Unavailable", "fleet.llmgw.dev"), x
        assert x["metadata"]["leader_address"] == leader, x
        assert x["metadata"]["leader"], x
    redirects = {x["gateway"]: x for x in lines if x["kind"] == "redirects"}
    for gateway, method in (("first", "CreateModel"), ("second", "SetContext")):
        assert redirects[gateway]["current"] == leader
        assert redirects[gateway]["redirects"] == [
            {"method": f"/llmgw.fleet.v1.FleetService/{method}", "from": follower, "to": leader}
        ], redirects[gateway]
    (rollout,) = [x for x in lines if x["kind"] == "rollout"]
    assert rollout["state"] == "ROLLOUT_STATE_SUCCEEDED" and rollout["to_revision"] == 2
    assert rollout["events"][-1] == "rollout_succeeded"
    routes = [x for x in lines if x["kind"] == "route"]
    assert [r["revision"] for r in routes] == [1, 2]
    assert routes[-1]["context_tokens"] == 16384
