"""A store the fleet cannot read: `python -m fleet_svc` exits 3 with one line naming the file or
the DSN (its password left out) and what is wrong; damage found at run time turns health
NOT_SERVING without stopping the fleet."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fleet_svc.__main__ import EXIT_STORE
from fleet_svc.server import FleetOptions, start_fleet
from fleet_svc.store.base import ModelRecord, RolloutRecord
from fleet_svc.store.migrations import latest_version
from fleet_svc.store.postgres import PostgresStore
from fleet_svc.store.sqlite import SQLiteStore
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from tests.support.postgres import dsn_of, fresh_database
from tests.support.store_records import garble_an_index_page

REPO_ROOT = Path(__file__).resolve().parents[2]
PAGE_BYTES = 4096
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def run_fleet(store: str) -> subprocess.CompletedProcess[str]:
    """`python -m fleet_svc --store STORE` on a free port, expected to stop by itself."""
    return subprocess.run(
        [sys.executable, "-m", "fleet_svc", "--listen", "127.0.0.1:0", "--store", store],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )


def said(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """What the fleet told its operator on stderr: every line that is not a JSON log event."""
    lines = []
    for line in proc.stderr.splitlines():
        try:
            json.loads(line)
        except ValueError:
            lines.append(line)
    return lines


def _filled(path: Path) -> int:
    """A closed store with models, replicas and a rollout (many pages); how many pages."""
    with SQLiteStore(path) as store:
        for i in range(70):
            spec = {"name": f"m{i}", "source": "hf://org/" + "x" * 400}
            store.put_model(ModelRecord(f"m{i}", 0, spec, "t", 1.0), expect_revision=0)
        store.put_rollout(RolloutRecord("ro-1", "m1", "SUCCEEDED", {"steps": []}, 1.0, 1.0))
    return path.stat().st_size // PAGE_BYTES


def _garbage_page(path: Path) -> None:
    _filled(path)
    garble_an_index_page(path, PAGE_BYTES)


def _broken_spec_row(path: Path) -> None:
    _filled(path)
    with closing(sqlite3.connect(path)) as raw, raw:
        raw.execute("UPDATE model_revisions SET spec = '{\"profiles\": 7}' WHERE name = 'm3'")


def _truncated(path: Path) -> None:
    pages = _filled(path)
    os.truncate(path, (pages // 3) * PAGE_BYTES + 100)


def _not_a_database(path: Path) -> None:
    path.write_text("models:\n  - name: llama\n" * 300)


def _newer_schema(path: Path) -> None:
    with closing(sqlite3.connect(path)) as raw:
        raw.execute(f"PRAGMA user_version = {latest_version() + 1}")


DAMAGE: list[tuple[str, Callable[[Path], None], str]] = [
    ("garbage-page", _garbage_page, "PRAGMA quick_check found damage"),
    ("broken-spec-row", _broken_spec_row, "model_revisions row 'm3@1' cannot be read"),
    ("truncated", _truncated, "malformed"),
    ("not-a-database", _not_a_database, "file is not a database"),
    ("newer-schema", _newer_schema, "newer than the"),
]


@pytest.mark.parametrize(("damage", "what"), [d[1:] for d in DAMAGE], ids=[d[0] for d in DAMAGE])
def test_a_store_file_it_cannot_read_exits_3_with_one_line_naming_it(
    tmp_path: Path, damage: Callable[[Path], None], what: str
) -> None:
    """Each damaged file stops the fleet before it serves: exit code 3 and one line naming the
    file and what is wrong, no traceback."""
    path = tmp_path / "fleet.db"
    damage(path)
    proc = run_fleet(str(path))
    assert proc.returncode == EXIT_STORE, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not proc.stdout.strip(), "it must not have started listening"
    [line] = said(proc)
    assert line.startswith(f"fleet: the fleet store {path}: "), line
    assert what in line


def test_a_folder_given_as_the_store_exits_3_saying_so(tmp_path: Path) -> None:
    """A folder where the store file should be stops the fleet with exit code 3 and one line
    naming it and what to give instead."""
    proc = run_fleet(str(tmp_path))
    assert proc.returncode == EXIT_STORE, proc.stderr
    [line] = said(proc)
    assert line.startswith(f"fleet: the fleet store {tmp_path}: it is a folder"), line


def test_a_missing_postgresql_database_exits_3_naming_it() -> None:
    """A DSN naming a database the server does not have stops the fleet with exit code 3 and
    the server's own words naming the database."""
    dsn = dsn_of("llmgw_test_no_such_database")
    proc = run_fleet(dsn)
    assert proc.returncode == EXIT_STORE, proc.stderr
    [line] = said(proc)
    assert line.startswith(f"fleet: the fleet store {dsn}: "), line
    assert 'database "llmgw_test_no_such_database" does not exist' in line


def test_a_dsn_libpq_cannot_read_exits_1_naming_it() -> None:
    """A connection string libpq cannot parse is a configuration error: exit code 1, one line
    naming it and what is wrong."""
    dsn = dsn_of("db") + "?no_such_option=1"
    proc = run_fleet(dsn)
    assert proc.returncode == 1, proc.stderr
    [line] = said(proc)
    assert line.startswith(f"fleet: the fleet store {dsn_of('db')}"), line
    assert "no_such_option" in line


def test_an_unreachable_postgresql_exits_3_naming_the_dsn_without_its_password() -> None:
    """A PostgreSQL that refuses the connection stops the fleet with exit code 3 and one line
    naming the DSN with its password replaced and the server's reason."""
    proc = run_fleet("postgresql://fleet:s3cret@127.0.0.1:1/fleet")
    assert proc.returncode == EXIT_STORE, proc.stderr
    [line] = said(proc)
    assert line.startswith("fleet: the fleet store postgresql://fleet:***@127.0.0.1:1/fleet: ")
    assert "s3cret" not in proc.stderr
    assert "refused" in line.lower() or "connect" in line.lower()


def test_a_postgresql_database_with_a_broken_row_exits_3_naming_the_row() -> None:
    """A row the fleet cannot read in PostgreSQL is refused as on SQLite, naming the row."""
    with fresh_database() as (_name, dsn):
        with PostgresStore(dsn) as store:
            store.put_model(ModelRecord("m1", 0, {"name": "m1"}, "t", 1.0), expect_revision=0)
            store.put_rollout(RolloutRecord("ro-1", "m1", "RUNNING", {"steps": []}, 1.0, 1.0))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("UPDATE rollouts SET state = 'HALF_DONE'")
        proc = run_fleet(dsn)
    assert proc.returncode == EXIT_STORE, proc.stderr
    [line] = said(proc)
    assert line.startswith(f"fleet: the fleet store {dsn}: rollouts row 'ro-1' cannot be read")


async def _health(port: int) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        answer = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
    return int(answer.status)


async def test_a_row_broken_under_a_running_fleet_turns_health_not_serving(tmp_path: Path) -> None:
    """Damage found while serving (a rollout row broken under the fleet, read by ListRollouts)
    turns health NOT_SERVING within a probe or two, the listing still answers without that row,
    and the fleet keeps running."""
    path = tmp_path / "fleet.db"
    with SQLiteStore(path) as store:
        store.put_rollout(RolloutRecord("ro-ok", "m1", "SUCCEEDED", {"steps": []}, 2.0, 2.0))
        store.put_rollout(RolloutRecord("ro-bad", "m1", "SUCCEEDED", {"steps": []}, 1.0, 1.0))
    fleet = await start_fleet(
        FleetOptions(listen="127.0.0.1:0", store_url=str(path), tick_s=0.05, planner="127.0.0.1:1")
    )
    try:
        assert await _health(fleet.port) == SERVING
        with closing(sqlite3.connect(path)) as raw, raw:
            raw.execute("UPDATE rollouts SET spec = 'not json' WHERE id = 'ro-bad'")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{fleet.port}") as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            listed = await stub.ListRollouts(fleet_pb2.ListRolloutsRequest(), timeout=5)
        assert [r.id for r in listed.rollouts] == ["ro-ok"]
        for _ in range(50):
            if await _health(fleet.port) == NOT_SERVING:
                break
            await asyncio.sleep(0.1)
        assert await _health(fleet.port) == NOT_SERVING
        assert fleet.store_health is not None and fleet.store_health.problem
        assert "rollouts row 'ro-bad' cannot be read" in fleet.store_health.problem
        assert not fleet.loop_task.done()
    finally:
        await fleet.stop(grace_s=0.5)
