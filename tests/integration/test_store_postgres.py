"""What only the PostgreSQL store has: migrations in schema_version, fleets migrating one
database together, a server it cannot reach, and connections the server cuts (its restart,
pg_terminate_backend) — against the real test server (tests/support/postgres.py), one fresh
database each."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from fleet_svc.store.base import ModelRecord, StoreUnavailable
from fleet_svc.store.migrations import Migration, SchemaTooNew, latest_version
from fleet_svc.store.postgres import PostgresStore, on_this_machine
from fleet_svc.store.postgres_link import FAIL_FAST_S
from fleet_svc.store.postgres_schema import MIGRATIONS, migrate, schema_version
from tests.support.postgres import allow_connections, dsn_of, fresh_database, terminate


@pytest.fixture
def db() -> Iterator[tuple[str, str]]:
    """A fresh database: (name, DSN)."""
    with fresh_database() as made:
        yield made


def _raw(dsn: str, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(statement.encode(), params)
        return cur.fetchall() if cur.description else []


def _model(name: str = "m") -> ModelRecord:
    return ModelRecord(name=name, revision=0, spec={"name": name}, updated_by="t", updated_at=1.0)


# Migrations -------------------------------------------------------------------------------------


def test_a_fresh_database_is_migrated_and_reopening_applies_nothing(db: tuple[str, str]) -> None:
    """Opening a fresh database records each step in schema_version and creates the tables;
    opening it again applies nothing and keeps the rows."""
    _name, dsn = db
    with PostgresStore(dsn) as store:
        store.put_model(_model(), expect_revision=0)
    rows = _raw(dsn, "SELECT version, summary FROM schema_version ORDER BY version")
    assert [(v, s) for v, s in rows] == [(m.version, m.summary) for m in MIGRATIONS]
    tables = {
        r[0] for r in _raw(dsn, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    }
    assert {"model_revisions", "answers", "replicas", "named_values", "rollouts"} <= tables
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert migrate(conn, dsn) == []
        assert schema_version(conn) == latest_version(MIGRATIONS)
    with PostgresStore(dsn) as store:
        assert [m.revision for m in store.list_models()] == [1]


def test_a_database_of_a_newer_schema_is_refused_untouched(db: tuple[str, str]) -> None:
    """A database a newer fleet migrated is refused naming both versions, and nothing in it
    changes (no table is created)."""
    _name, dsn = db
    future = latest_version(MIGRATIONS) + 1
    _raw(dsn, "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, summary TEXT NOT NULL)")
    _raw(dsn, "INSERT INTO schema_version VALUES (%s, 'from the future')", (future,))
    with pytest.raises(SchemaTooNew) as refused:
        PostgresStore(dsn)
    assert (refused.value.found_version, refused.value.known_version) == (
        future,
        latest_version(MIGRATIONS),
    )
    assert _raw(dsn, "SELECT to_regclass('model_revisions') IS NULL") == [(True,)]
    assert _raw(dsn, "SELECT version FROM schema_version") == [(future,)]


STEP_1 = Migration(1, "a table", ("CREATE TABLE t (a INTEGER)",))
STEP_2 = Migration(2, "a column", ("ALTER TABLE t ADD COLUMN b TEXT NOT NULL DEFAULT 'x'",))


def test_an_older_database_is_migrated_forward_and_a_failing_step_rolls_back(
    db: tuple[str, str],
) -> None:
    """A database at version 1 gets only the later steps and keeps its rows; a step failing
    part-way leaves no table and no version row behind."""
    _name, dsn = db
    broken = Migration(3, "broken", ("CREATE TABLE u (a INTEGER)", "THIS IS NOT SQL"))
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert migrate(conn, dsn, [STEP_1]) == [1]
        conn.execute("INSERT INTO t (a) VALUES (7)")
        assert migrate(conn, dsn, [STEP_1, STEP_2]) == [2]
        assert conn.execute("SELECT a, b FROM t").fetchall() == [(7, "x")]
        with pytest.raises(psycopg.errors.SyntaxError):
            migrate(conn, dsn, [STEP_1, STEP_2, broken])
        assert schema_version(conn) == 2
        assert conn.execute("SELECT to_regclass('u') IS NULL").fetchone() == (True,)


def test_fleets_opening_one_fresh_database_together_migrate_it_once(db: tuple[str, str]) -> None:
    """Four stores opening a fresh database at the same moment all open, and each step is
    applied once (the advisory lock serializes them)."""
    _name, dsn = db
    barrier = threading.Barrier(4)
    failures: list[BaseException] = []

    def opener() -> None:
        try:
            barrier.wait(timeout=10)
            PostgresStore(dsn).close()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures
    assert _raw(dsn, "SELECT version FROM schema_version") == [(m.version,) for m in MIGRATIONS]


# Connections ------------------------------------------------------------------------------------


def test_every_connection_commits_synchronously(db: tuple[str, str]) -> None:
    """The store's sessions run with synchronous_commit on whatever the server's default is:
    a write is on disk when it returns."""
    name, dsn = db
    _raw(dsn, f"ALTER DATABASE {name} SET synchronous_commit = off")
    with PostgresStore(dsn) as store:
        store.put_value("k", "v")
        seen = _raw(
            dsn,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
            " AND application_name = 'llmgw-fleet'",
            (name,),
        )
        assert seen[0][0] >= 1
        with store.link.connection() as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)


@pytest.mark.parametrize(
    ("dsn", "said"),
    [
        ("postgresql://postgres:s3cret@127.0.0.1:1/fleet", "postgresql://postgres:***@127.0.0.1:1"),
        ("host=127.0.0.1 port=1 user=postgres password=s3cret dbname=fleet", "password=***"),
        # The run's own server (its DSN is known only once it runs): see the test's first line.
        ("llmgw_test_no_such_db", "does not exist"),
    ],
    ids=["refused-url", "refused-keywords", "no-such-database"],
)
def test_a_server_it_cannot_use_is_unavailable_naming_the_dsn_without_its_password(
    dsn: str, said: str
) -> None:
    """A server that refuses or lacks the database is StoreUnavailable in one line naming the
    DSN, its password replaced by ***, and the server's reason."""
    if "=" not in dsn and "://" not in dsn:
        dsn = dsn_of(dsn)
    with pytest.raises(StoreUnavailable) as refused:
        PostgresStore(dsn)
    message = str(refused.value)
    assert said in message
    assert "s3cret" not in message and "\n" not in message


def test_connections_the_server_ends_are_replaced_without_an_error(db: tuple[str, str]) -> None:
    """After pg_terminate_backend ends every connection of the store (as a server restart
    does), the next calls succeed on new connections and see everything written before."""
    name, dsn = db
    with PostgresStore(dsn) as store:
        store.put_model(_model(), expect_revision=0)
        for round_ in range(3):
            assert terminate(name) >= 1
            store.put_value("round", str(round_))
            assert store.get_value("round") == str(round_)
            store.probe()
        assert [m.name for m in store.list_models()] == ["m"]


def test_an_outage_is_unavailable_fast_and_the_store_comes_back_on_its_own(
    db: tuple[str, str],
) -> None:
    """While the database refuses connections every call and the probe raise StoreUnavailable
    (after the first attempt, at once rather than after a connect timeout); once it accepts
    them again the probe passes within seconds and nothing written before is lost."""
    name, dsn = db
    with PostgresStore(dsn) as store:
        store.put_model(_model(), expect_revision=0)
        allow_connections(name, False)
        terminate(name)
        try:
            with pytest.raises(StoreUnavailable, match="not currently accepting connections"):
                store.get_value("k")
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                store.put_value("k", "v")
            assert time.monotonic() - started < FAIL_FAST_S / 2
            with pytest.raises(StoreUnavailable):
                store.probe()
        finally:
            allow_connections(name, True)
        deadline = time.monotonic() + 15
        while True:
            try:
                store.probe()
                break
            except StoreUnavailable:
                assert time.monotonic() < deadline, "the store did not come back"
                time.sleep(0.2)
        assert store.get_model("m") is not None
        store.put_value("k", "v")
        assert store.get_value("k") == "v"


def test_answers_of_a_version_2_database_read_back_without_a_fingerprint(
    db: tuple[str, str],
) -> None:
    """A database an older fleet wrote (schema 2) opens migrated: its answers read back with
    an empty fingerprint (matched by method alone)."""
    _name, dsn = db
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert migrate(conn, dsn, MIGRATIONS[:2]) == [1, 2]
        conn.execute(
            "INSERT INTO answers (request_id, method, answer, created_at) VALUES (%s, %s, %s, %s)",
            ("req-old", "SetGPUs", b"old", 1.0),
        )
    with PostgresStore(dsn) as store:
        old = store.get_answer("req-old")
        assert old is not None and (old.method, old.answer, old.fingerprint) == (
            "SetGPUs",
            b"old",
            "",
        )


@pytest.mark.parametrize(
    ("host", "here"),
    [
        ("127.0.0.1", True),
        ("127.0.1.1", True),
        ("localhost", True),
        ("::1", True),
        ("/var/run/postgresql", True),
        ("db.internal", False),
        ("10.0.0.7", False),
        ("fd00::7", False),
    ],
)
def test_statements_are_pipelined_only_to_a_server_on_another_host(host: str, here: bool) -> None:
    """A server on this machine (loopback, or a Unix socket's folder) is sent one statement at
    a time; any other host's gets statements sent together."""
    assert on_this_machine(host) is here


def test_a_store_on_this_machines_server_does_not_pipeline(db: tuple[str, str]) -> None:
    """The test server listens on 127.0.0.1: the store opened on it does not pipeline."""
    with PostgresStore(db[1]) as store:
        assert store.pipelining is False
