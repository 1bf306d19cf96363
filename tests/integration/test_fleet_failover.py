"""Failover among fleet processes on one PostgreSQL: the leader killed with SIGKILL mid-rollout
(another leads, the rollout finishes, real agents reconnect, no replica lost, doubled or left
stuck), and the leader paused with SIGSTOP past its lease then resumed (it stops leading and
writes nothing: every row written is audited by a trigger naming the session's fleet)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc
import psycopg
import pytest

from llmgw.clients.errors import Unreachable, decode
from llmgw.clients.fleet import FleetClient
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.scripted_agent import ScriptedAgent
from tests.integration.test_rollouts import LLAMA_8B
from tests.support.fleet_procs import REPO_ROOT, FleetProc, fleet_processes, lease_of
from tests.support.planner import running_planner
from tests.support.postgres import fresh_database

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

READY = fleet_pb2.REPLICA_PHASE_READY
TERMINAL = {
    fleet_pb2.ROLLOUT_STATE_SUCCEEDED,
    fleet_pb2.ROLLOUT_STATE_FAILED,
    fleet_pb2.ROLLOUT_STATE_CANCELLED,
}


def standin_model(replicas: int) -> common_pb2.Model:
    """A vLLM model the stand-in serves, taking 2 s to load (a rollout's new replica is
    STARTING long enough to kill the leader under it)."""
    return common_pb2.Model(
        name="vmodel",
        source="hf://org/model",
        context_length=8192,
        shape=LLAMA_8B,
        profiles=[
            common_pb2.Profile(
                name="gpu",
                engine="vllm",
                args=["--max-model-len", "8192", "--kv-capacity-tokens", "40000", "--load-s", "2"],
                gpu_class="H100-80GB",
                gpus_per_node=1,
                replicas=replicas,
            )
        ],
    )


@contextmanager
def agent_processes(
    fleets: str | Sequence[str], folder: Path, nodes: int
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """`nodes` real agents (stand-in engines, two stand-in cards each) given every fleet (the
    same list for each, or agent i the i-th: an agent holds its stream on the first that
    answers)."""
    procs = []
    for i in range(nodes):
        given = fleets if isinstance(fleets, str) else fleets[i]
        state = folder / f"agent-{i}"
        state.mkdir()
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "fleet_svc.agent",
                    "--fleet",
                    given,
                    "--node",
                    f"node-{i}",
                    "--gpus",
                    "2xH100-80GB",
                    "--state-dir",
                    str(state),
                    "--demo",
                    "--log-format",
                    "json",
                ],
                stdout=(folder / f"agent-{i}.log").open("wb"),
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO_ROOT)},
            )
        )
    try:
        yield procs
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def leader_of(dsn: str, fleets: list[FleetProc], epoch_above: int = 0) -> FleetProc | None:
    """The fleet holding a live lease at an epoch above `epoch_above` (None when none)."""
    lease = lease_of(dsn)
    if lease is None or not lease.live or lease.epoch <= epoch_above:
        return None
    return next((f for f in fleets if f.address == lease.address), None)


async def test_kill_9_of_the_leader_mid_rollout_another_leads_and_the_rollout_finishes(
    tmp_path: Path,
) -> None:
    """Three fleets, two real agents given all three: SIGKILL the leader while the rollout's
    first new replica starts; a follower leads at the next epoch, both agents reconnect to it,
    the rollout succeeds, and exactly two replicas serve the new revision (each new replica id
    created once: none doubled, none lost, none left in another phase)."""
    with fresh_database() as (_name, dsn):
        async with running_planner() as (planner, _p, _c):
            with fleet_processes(dsn, tmp_path, 3, planner=f"127.0.0.1:{planner.port}") as fleets:
                everyone = ",".join(f.address for f in fleets)
                client = FleetClient(everyone, timeout_s=10)
                try:
                    with agent_processes(everyone, tmp_path, 2):
                        await _failover_mid_rollout(dsn, fleets, client)
                finally:
                    client.close()


async def _failover_mid_rollout(dsn: str, fleets: list[FleetProc], client: FleetClient) -> None:
    def nodes_ready() -> bool:
        nodes = client.list_nodes().nodes
        return sum(1 for n in nodes if n.phase == fleet_pb2.NODE_PHASE_READY) == 2

    def serving(revision: int) -> bool:
        rs = client.list_replicas().replicas
        return len(rs) == 2 and all(r.phase == READY and r.revision == revision for r in rs)

    await assert_eventually(
        lambda: asyncio.to_thread(nodes_ready), timeout_s=60, what="both agents"
    )
    await asyncio.to_thread(client.create_model, standin_model(2))
    await assert_eventually(
        lambda: asyncio.to_thread(serving, 1), timeout_s=60, what="two replicas"
    )
    answer = await asyncio.to_thread(client.set_context, "vmodel", 16384)
    assert answer.rollout_id

    def new_replica_starting() -> bool:
        rs = client.list_replicas().replicas
        return any(r.revision == 2 and r.phase == fleet_pb2.REPLICA_PHASE_STARTING for r in rs)

    await assert_eventually(
        lambda: asyncio.to_thread(new_replica_starting), timeout_s=30, what="a new replica"
    )
    old = leader_of(dsn, fleets)
    assert old is not None
    epoch = lease_of(dsn).epoch  # type: ignore[union-attr]
    old.kill()
    survivors = [f for f in fleets if f is not old]
    new = await assert_eventually(
        lambda: leader_of(dsn, survivors, epoch), timeout_s=30, what="a new leader"
    )
    assert new in survivors

    def ended() -> fleet_pb2.Rollout | None:
        ro = client.get_rollout(answer.rollout_id)
        return ro if ro.state in TERMINAL else None

    ro = await assert_eventually(
        lambda: asyncio.to_thread(ended), timeout_s=120, what="the rollout's end"
    )
    assert ro.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, ro.reason
    await assert_eventually(
        lambda: asyncio.to_thread(serving, 2), timeout_s=60, what="two new replicas"
    )
    await assert_eventually(
        lambda: asyncio.to_thread(nodes_ready), timeout_s=30, what="agents on the new leader"
    )
    assert client.address == new.address
    events = await asyncio.to_thread(lambda: list(client.watch_rollout(answer.rollout_id)))
    created = [
        e.replica_id for e in events if e.kind == fleet_pb2.ROLLOUT_EVENT_KIND_REPLICA_CREATED
    ]
    assert len(created) == len(set(created)) == 2, created
    final = {r.id for r in client.list_replicas().replicas}
    assert final == set(created), "the replicas serving are the ones the rollout created"


async def test_kill_9_of_the_leader_with_every_agent_on_a_follower(tmp_path: Path) -> None:
    """Three fleets, one real agent on each follower (the leader holds no stream): SIGKILL the
    leader while a rollout's new replica starts. A follower leads at the next epoch; neither
    agent reconnects (each was welcomed once, on its follower); the rollout finishes with
    each new replica created once and started once on its agent; and a change made on the new
    leader afterwards (the model deleted) reaches both agents through the store."""
    with fresh_database() as (_name, dsn):
        async with running_planner() as (planner, _p, _c):
            with fleet_processes(dsn, tmp_path, 3, planner=f"127.0.0.1:{planner.port}") as fleets:
                leader, one, two = (f.address for f in fleets)
                client = FleetClient(f"{leader},{one},{two}", timeout_s=10)
                try:
                    with agent_processes([f"{one},{leader}", f"{two},{leader}"], tmp_path, 2):
                        await _failover_with_agents_on_followers(dsn, fleets, client, tmp_path)
                finally:
                    client.close()


def _agent_log(folder: Path, i: int, event: str) -> list[dict[str, object]]:
    """The JSON lines of agent i's log naming `event`."""
    out = []
    for line in (folder / f"agent-{i}.log").read_text().splitlines():
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if isinstance(doc, dict) and doc.get("event") == event:
                out.append(doc)
    return out


async def _failover_with_agents_on_followers(
    dsn: str, fleets: list[FleetProc], client: FleetClient, folder: Path
) -> None:
    def nodes_ready() -> bool:
        nodes = client.list_nodes().nodes
        return sum(1 for n in nodes if n.phase == fleet_pb2.NODE_PHASE_READY) == 2

    def serving(revision: int) -> bool:
        rs = client.list_replicas().replicas
        return len(rs) == 2 and all(r.phase == READY and r.revision == revision for r in rs)

    await assert_eventually(
        lambda: asyncio.to_thread(nodes_ready), timeout_s=60, what="both agents, via followers"
    )
    old = leader_of(dsn, fleets)
    assert old is fleets[0]
    await asyncio.to_thread(client.create_model, standin_model(2))
    await assert_eventually(
        lambda: asyncio.to_thread(serving, 1), timeout_s=60, what="two replicas"
    )
    answer = await asyncio.to_thread(client.set_context, "vmodel", 16384)

    def new_replica_starting() -> bool:
        rs = client.list_replicas().replicas
        return any(r.revision == 2 and r.phase == fleet_pb2.REPLICA_PHASE_STARTING for r in rs)

    await assert_eventually(
        lambda: asyncio.to_thread(new_replica_starting), timeout_s=30, what="a new replica"
    )
    epoch = lease_of(dsn).epoch  # type: ignore[union-attr]
    old.kill()
    survivors = fleets[1:]
    await assert_eventually(
        lambda: leader_of(dsn, survivors, epoch), timeout_s=30, what="a new leader"
    )

    def ended() -> fleet_pb2.Rollout | None:
        ro = client.get_rollout(answer.rollout_id)
        return ro if ro.state in TERMINAL else None

    ro = await assert_eventually(
        lambda: asyncio.to_thread(ended), timeout_s=120, what="the rollout's end"
    )
    assert ro.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, ro.reason
    await assert_eventually(
        lambda: asyncio.to_thread(serving, 2), timeout_s=60, what="two new replicas"
    )
    events = await asyncio.to_thread(lambda: list(client.watch_rollout(answer.rollout_id)))
    created = [
        e.replica_id for e in events if e.kind == fleet_pb2.ROLLOUT_EVENT_KIND_REPLICA_CREATED
    ]
    assert len(created) == len(set(created)) == 2, created
    assert {r.id for r in client.list_replicas().replicas} == set(created)
    started = [d["replica_id"] for i in (0, 1) for d in _agent_log(folder, i, "replica_started")]
    assert len(started) == len(set(started)) == 4, f"each replica started once: {started}"
    assert set(created) <= set(started)
    for i in (0, 1):
        assert len(_agent_log(folder, i, "stream_welcomed")) == 1, f"agent {i} reconnected"
    await asyncio.to_thread(client.delete_model, "vmodel")

    def all_stopped() -> bool:
        stopped = {
            d["replica_id"] for i in (0, 1) for d in _agent_log(folder, i, "replica_stopped")
        }
        return set(started) <= stopped and not client.list_replicas().replicas

    await assert_eventually(
        lambda: asyncio.to_thread(all_stopped), timeout_s=60, what="every replica stopped"
    )
    for i in (0, 1):
        assert len(_agent_log(folder, i, "stream_welcomed")) == 1, f"agent {i} reconnected"


AUDITED = ("model_revisions", "replicas", "rollouts", "rollout_events", "named_values", "answers")


def install_audit(dsn: str) -> None:
    """Record every row written to the fleet's tables with the writing session's name."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE write_audit (seq bigserial PRIMARY KEY, app text, tbl text, op text,"
            " at timestamptz DEFAULT clock_timestamp())"
        )
        conn.execute(
            "CREATE FUNCTION audit_write() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            " INSERT INTO write_audit (app, tbl, op)"
            " VALUES (current_setting('application_name'), TG_TABLE_NAME, TG_OP);"
            " RETURN NULL; END $$"
        )
        for table in (*AUDITED, "leases"):
            conn.execute(
                f"CREATE TRIGGER audit_{table} AFTER INSERT OR UPDATE OR DELETE ON {table}"
                " FOR EACH ROW EXECUTE FUNCTION audit_write()"
            )


def audit(dsn: str) -> list[tuple[int, str, str, str]]:
    """Every audited write so far: (seq, fleet, table, operation)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT seq, app, tbl, op FROM write_audit ORDER BY seq").fetchall()
    return [(int(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in rows]


async def test_a_leader_paused_past_its_lease_stops_leading_and_writes_nothing(
    tmp_path: Path,
) -> None:
    """SIGSTOP the leader (an agent connected to it, its replica READY) for longer than its
    lease, its agent leaving meanwhile; the other fleet takes over at the next epoch; SIGCONT:
    the old leader's log says it was deposed, it refuses a change with NOT_LEADER naming the
    new leader, and the audit holds no row of its written after the takeover — though,
    resumed, it found its agent gone and the node silent past the time to mark it lost."""
    with fresh_database() as (_name, dsn):
        extra = ("--lost-after-s", "3", "--grace-heartbeats", "2")
        with fleet_processes(dsn, tmp_path, 2, extra=extra) as (first, second):
            install_audit(dsn)
            agent = ScriptedAgent(first.address, "node-0")
            agent.start()
            try:
                with FleetClient(first.address, timeout_s=10) as client:
                    await asyncio.to_thread(client.create_model, standin_model(1))

                    def ready() -> bool:
                        return [r.phase for r in client.list_replicas().replicas] == [READY]

                    await assert_eventually(
                        lambda: asyncio.to_thread(ready), timeout_s=30, what="a READY replica"
                    )
                epoch = lease_of(dsn).epoch  # type: ignore[union-attr]
                first.proc.send_signal(signal.SIGSTOP)
                # Its agent goes away meanwhile: resumed, the old leader finds the stream gone and
                # the node silent past --lost-after-s, which a leader marks LOST (a write).
                await agent.stop()
                taker = await assert_eventually(
                    lambda: leader_of(dsn, [second], epoch), timeout_s=30, what="the takeover"
                )
                assert taker is second
                taken_at = max(
                    seq
                    for seq, app, tbl, op in audit(dsn)
                    if app == second.name and tbl == "leases"
                )
                # Past the time the paused leader would mark its agent's node lost.
                await asyncio.sleep(4)
                first.proc.send_signal(signal.SIGCONT)
                await assert_eventually(
                    lambda: "leader_deposed" in first.log.read_text(),
                    timeout_s=15,
                    what="the old leader's deposition",
                )
                refused = await asyncio.to_thread(_refusal_of, first.address)
                assert refused == ("NOT_LEADER", second.address)
                await asyncio.sleep(2)
                late = [row for row in audit(dsn) if row[1] == first.name and row[0] > taken_at]
                assert late == [], f"the paused leader wrote after the takeover: {late}"
                assert any(app == first.name for _s, app, _t, _o in audit(dsn)), (
                    "the audit saw the first leader's writes before the pause"
                )
            finally:
                await agent.stop()


def _refusal_of(address: str) -> tuple[str, str]:
    """The reason and leader address a fleet refuses a change with (one raw attempt: the
    typed client would follow the refusal to the leader)."""
    with grpc.insecure_channel(address) as channel:
        try:
            fleet_pb2_grpc.FleetServiceStub(channel).CreateModel(
                fleet_pb2.CreateModelRequest(model=standin_model(0)), timeout=10
            )
        except grpc.RpcError as err:
            failure = decode(err, "fleet", address)
            assert isinstance(failure, Unreachable), failure
            return str(failure.reason), (failure.metadata or {}).get("leader_address", "")
    raise AssertionError("the old leader accepted a change")
