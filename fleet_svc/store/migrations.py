"""The SQLite store's schema, as ordered migrations recorded in `PRAGMA user_version` (and the
steps' shape and checks, which the PostgreSQL store's own migrations share)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from fleet_svc.store.base import StoreError


@dataclass(frozen=True)
class Migration:
    """One step of the schema: the version it brings the database to and the statements."""

    version: int
    summary: str
    statements: tuple[str, ...]


class SchemaTooNew(StoreError):
    """The database was written by a newer fleet whose schema this code does not know."""

    def __init__(self, path: str, found_version: int, known_version: int) -> None:
        super().__init__(
            path,
            f"schema version {found_version} is newer than the {known_version} this fleet"
            " knows; run the fleet version that wrote it (or a newer one)",
        )
        self.path = path
        self.found_version = found_version
        self.known_version = known_version


class MigrationOrderError(Exception):
    """The migration list is not numbered 1, 2, 3 … in order (a programming error)."""


# Append only: a released migration is never edited, because databases already carry it.
# Each is applied in its own transaction together with the version bump, so a crash mid-way
# leaves the previous version intact (SQLite's DDL is transactional).
MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        version=1,
        summary="catalog revisions, idempotent answers, replicas, named values",
        statements=(
            # Every catalog change is a row; the latest row per name is the model's state.
            """
            CREATE TABLE model_revisions (
                name        TEXT    NOT NULL,
                revision    INTEGER NOT NULL CHECK (revision >= 1),
                spec        TEXT    NOT NULL,
                updated_by  TEXT    NOT NULL,
                updated_at  REAL    NOT NULL,
                deleted     INTEGER NOT NULL DEFAULT 0 CHECK (deleted IN (0, 1)),
                declared_in TEXT    NOT NULL DEFAULT '',
                PRIMARY KEY (name, revision)
            ) WITHOUT ROWID
            """,
            """
            CREATE TABLE answers (
                request_id TEXT PRIMARY KEY,
                method     TEXT NOT NULL,
                answer     BLOB NOT NULL,
                created_at REAL NOT NULL
            )
            """,
            """
            CREATE TABLE replicas (
                id       TEXT PRIMARY KEY,
                model    TEXT    NOT NULL,
                profile  TEXT    NOT NULL,
                revision INTEGER NOT NULL,
                node     TEXT    NOT NULL DEFAULT '',
                gpus     TEXT    NOT NULL DEFAULT '[]',
                phase    TEXT    NOT NULL,
                reason   TEXT    NOT NULL DEFAULT '',
                address  TEXT    NOT NULL DEFAULT '',
                restarts INTEGER NOT NULL DEFAULT 0,
                since    REAL    NOT NULL DEFAULT 0,
                spec     TEXT    NOT NULL DEFAULT '{}'
            )
            """,
            # Not named `values`: that is an SQL keyword and would need quoting everywhere.
            """
            CREATE TABLE named_values (
                key   TEXT PRIMARY KEY,
                value TEXT NOT NULL
            )
            """,
        ),
    ),
    Migration(
        version=2,
        summary="rollouts and their events",
        statements=(
            # A rollout is a persisted state machine: its whole state is one JSON document,
            # rewritten at every step, so a restarted fleet resumes it where it stood.
            """
            CREATE TABLE rollouts (
                id         TEXT PRIMARY KEY,
                model      TEXT NOT NULL,
                state      TEXT NOT NULL,
                spec       TEXT NOT NULL,
                created_at REAL NOT NULL,
                updated_at REAL NOT NULL
            )
            """,
            "CREATE INDEX rollouts_by_model ON rollouts (model, created_at)",
            # Events are appended, never changed: a watcher resumes after the last seq it saw.
            """
            CREATE TABLE rollout_events (
                rollout_id TEXT    NOT NULL REFERENCES rollouts (id),
                seq        INTEGER NOT NULL CHECK (seq >= 1),
                at         REAL    NOT NULL,
                event      TEXT    NOT NULL,
                PRIMARY KEY (rollout_id, seq)
            ) WITHOUT ROWID
            """,
        ),
    ),
    Migration(
        version=3,
        summary="request ids bound to their request's fingerprint, pruned by age",
        statements=(
            # Rows from before this step keep '' (no fingerprint known), which matches no
            # request: their ids are refused until they age out of the request-id window.
            "ALTER TABLE answers ADD COLUMN fingerprint TEXT NOT NULL DEFAULT ''",
            "CREATE INDEX answers_by_age ON answers (created_at)",
        ),
    ),
    Migration(
        version=4,
        summary="gang membership of replicas spanning several nodes",
        statements=(
            # A gang's members by rank as one JSON list; '[]' for a replica on one node, so
            # the rows of older fleets read as they were.
            "ALTER TABLE replicas ADD COLUMN members TEXT NOT NULL DEFAULT '[]'",
        ),
    ),
    Migration(
        version=5,
        summary="rollouts waiting for the controller, and requests to cancel them",
        statements=(
            # A change commits its rollout PENDING; the controller adopts it by state.
            "CREATE INDEX rollouts_by_state ON rollouts (state)",
            # A cancel the API side recorded, until the controller carries it out.
            """
            CREATE TABLE rollout_requests (
                id         TEXT PRIMARY KEY,
                rollout_id TEXT NOT NULL,
                kind       TEXT NOT NULL,
                reason     TEXT NOT NULL,
                requested_by TEXT NOT NULL,
                created_at REAL NOT NULL
            )
            """,
        ),
    ),
    Migration(
        version=6,
        summary="a starting replica's download and load progress",
        statements=(
            # Its agent's last progress report as one JSON object; '{}' for none, so the rows
            # of older fleets read as they were.
            "ALTER TABLE replicas ADD COLUMN progress TEXT NOT NULL DEFAULT '{}'",
        ),
    ),
    Migration(
        version=7,
        summary="the gateways' traffic reports, for canary analysis",
        statements=(
            # One row per endpoint of one gateway's report of one interval; the key makes a
            # repeated report (a retry) count once. Kept a day (pruned as reports arrive).
            """
            CREATE TABLE traffic_reports (
                gateway           TEXT    NOT NULL,
                interval_start_ms BIGINT  NOT NULL,
                replica_id        TEXT    NOT NULL,
                model             TEXT    NOT NULL,
                revision          BIGINT  NOT NULL,
                interval_s        INTEGER NOT NULL,
                figures           TEXT    NOT NULL,
                received_at       REAL NOT NULL,
                PRIMARY KEY (gateway, interval_start_ms, replica_id)
            )
            """,
            "CREATE INDEX traffic_by_model ON traffic_reports (model, interval_start_ms)",
            "CREATE INDEX traffic_by_age ON traffic_reports (interval_start_ms)",
        ),
    ),
    Migration(
        version=8,
        summary="agents' streams on any fleet: node reports in, desired sets out",
        statements=(
            # One row per node, written by the fleet holding its stream (not fenced).
            """
            CREATE TABLE node_reports (
                node      TEXT    PRIMARY KEY,
                holder    TEXT    NOT NULL,
                stream    TEXT    NOT NULL,
                connected INTEGER NOT NULL CHECK (connected IN (0, 1)),
                heard_at  REAL    NOT NULL,
                report    TEXT    NOT NULL,
                seq       INTEGER NOT NULL
            )
            """,
            "CREATE INDEX node_reports_by_seq ON node_reports (seq)",
            # One row per node, written by the leader's controller (fenced).
            """
            CREATE TABLE desired_sets (
                node    TEXT    PRIMARY KEY,
                version INTEGER NOT NULL,
                body    BLOB    NOT NULL,
                seq     INTEGER NOT NULL
            )
            """,
            "CREATE INDEX desired_sets_by_seq ON desired_sets (seq)",
        ),
    ),
    Migration(
        version=9,
        summary="holders' beats: when each agent a fleet holds was last heard, one row a fleet",
        statements=(
            """
            CREATE TABLE node_beats (
                holder TEXT    PRIMARY KEY,
                heard  TEXT    NOT NULL,
                at     REAL    NOT NULL,
                seq    INTEGER NOT NULL
            )
            """,
        ),
    ),
)


def latest_version(migrations: Sequence[Migration] = MIGRATIONS) -> int:
    """The schema version a database has once every migration in `migrations` is applied."""
    return migrations[-1].version if migrations else 0


def schema_version(conn: sqlite3.Connection) -> int:
    """The schema version recorded in the database (0 for a fresh file)."""
    row = conn.execute("PRAGMA user_version").fetchone()
    return int(row[0])


def check_not_newer(
    conn: sqlite3.Connection, path: str, migrations: Sequence[Migration] = MIGRATIONS
) -> None:
    """Refuse a database whose schema is newer than `migrations` know.

    Raises:
        SchemaTooNew: the recorded version is past the last known migration.
    """
    found = schema_version(conn)
    known = latest_version(migrations)
    if found > known:
        raise SchemaTooNew(path, found, known)


def migrate(
    conn: sqlite3.Connection, path: str, migrations: Sequence[Migration] = MIGRATIONS
) -> list[int]:
    """Bring the database up to the last of `migrations`, each one once, in its own transaction.

    `conn` must be in autocommit mode (`isolation_level=None`): this function opens and commits
    its own transactions. Several processes may open the same fresh file at once: the version is
    read again under the write lock, so each migration is still applied once.

    Args:
        conn: an open connection in autocommit mode.
        path: the database's path, for error messages.
        migrations: the schema's steps, numbered 1, 2, 3 … in order.

    Returns:
        The versions applied by this call, in order (empty when already up to date).

    Raises:
        MigrationOrderError: `migrations` are not numbered 1..N in order.
        SchemaTooNew: the database is newer than the last of `migrations`.
        sqlite3.Error: a migration failed; the database stays at the version before it.
    """
    check_order(migrations)
    applied: list[int] = []
    for migration in migrations:
        with immediate(conn):
            current = schema_version(conn)
            if current > latest_version(migrations):
                raise SchemaTooNew(path, current, latest_version(migrations))
            if current >= migration.version:
                continue
            for statement in migration.statements:
                conn.execute(statement)
            # PRAGMA takes no parameters; the value is an int from our own table.
            conn.execute(f"PRAGMA user_version = {int(migration.version)}")
        applied.append(migration.version)
    return applied


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """Run the block in a `BEGIN IMMEDIATE` transaction: committed on exit, rolled back on error.

    IMMEDIATE takes the write lock before the first read, so a read-check-write inside the block
    cannot interleave with another writer's (the busy timeout makes the second one wait). Inside
    a transaction already (the store's `atomic` block), the block is a savepoint instead: its
    writes are undone on error and committed with the outer transaction.
    """
    if conn.in_transaction:
        conn.execute("SAVEPOINT nested")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK TO nested")
            conn.execute("RELEASE nested")
            raise
        conn.execute("RELEASE nested")
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    try:
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def check_order(migrations: Sequence[Migration]) -> None:
    """Refuse migrations not numbered 1, 2, 3 … in order.

    Raises:
        MigrationOrderError.
    """
    for position, migration in enumerate(migrations, start=1):
        if migration.version != position:
            raise MigrationOrderError(
                f"migration {migration.summary!r} has version {migration.version},"
                f" expected {position}: versions must run 1, 2, 3 … in order"
            )
