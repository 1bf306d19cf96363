"""The PostgreSQL store's schema: ordered migrations, each applied once, recorded in a
`schema_version` table (one row per applied step), under an advisory lock so fleets starting
together on a fresh database apply each step once."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from fleet_svc.store.migrations import Migration, SchemaTooNew, check_order, latest_version

MIGRATION_LOCK = 0x6C6C6D67_77000001
"""The advisory lock key migrations hold (any constant; "llmgw" in its high bytes, so it is
unlikely to be another application's on a shared server)."""

# Append only: a released migration is never edited, because databases already carry it. Each
# is applied in one transaction together with its schema_version row (PostgreSQL's DDL is
# transactional), so a crash mid-way leaves the previous version intact.
#
# JSON columns are `json`, not `jsonb`: json keeps the text as written, so a spec reads back
# exactly as the fleet wrote it (jsonb would turn 1e20 into 100000000000000000000), and the
# fleet never queries inside a document.
MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        version=1,
        summary="catalog revisions, idempotent answers, replicas, named values, rollouts",
        statements=(
            # Every catalog change is a row; the latest row per name is the model's state. The
            # primary key is what makes put_model a compare-and-swap (see PostgresStore).
            """
            CREATE TABLE model_revisions (
                name        TEXT             NOT NULL,
                revision    INTEGER          NOT NULL CHECK (revision >= 1),
                spec        JSON             NOT NULL,
                updated_by  TEXT             NOT NULL,
                updated_at  DOUBLE PRECISION NOT NULL,
                deleted     BOOLEAN          NOT NULL DEFAULT false,
                declared_in TEXT             NOT NULL DEFAULT '',
                PRIMARY KEY (name, revision)
            )
            """,
            """
            CREATE TABLE answers (
                request_id TEXT             PRIMARY KEY,
                method     TEXT             NOT NULL,
                answer     BYTEA            NOT NULL,
                created_at DOUBLE PRECISION NOT NULL
            )
            """,
            """
            CREATE TABLE replicas (
                id       TEXT             PRIMARY KEY,
                model    TEXT             NOT NULL,
                profile  TEXT             NOT NULL,
                revision INTEGER          NOT NULL,
                node     TEXT             NOT NULL DEFAULT '',
                gpus     INTEGER[]        NOT NULL DEFAULT '{}',
                phase    TEXT             NOT NULL,
                reason   TEXT             NOT NULL DEFAULT '',
                address  TEXT             NOT NULL DEFAULT '',
                restarts INTEGER          NOT NULL DEFAULT 0,
                since    DOUBLE PRECISION NOT NULL DEFAULT 0,
                spec     JSON             NOT NULL DEFAULT '{}'
            )
            """,
            """
            CREATE TABLE named_values (
                key   TEXT PRIMARY KEY,
                value TEXT NOT NULL
            )
            """,
            """
            CREATE TABLE rollouts (
                id         TEXT             PRIMARY KEY,
                model      TEXT             NOT NULL,
                state      TEXT             NOT NULL,
                spec       JSON             NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL
            )
            """,
            "CREATE INDEX rollouts_by_model ON rollouts (model, created_at)",
            """
            CREATE TABLE rollout_events (
                rollout_id TEXT             NOT NULL REFERENCES rollouts (id),
                seq        INTEGER          NOT NULL CHECK (seq >= 1),
                at         DOUBLE PRECISION NOT NULL,
                event      JSON             NOT NULL,
                PRIMARY KEY (rollout_id, seq)
            )
            """,
        ),
    ),
    Migration(
        version=2,
        summary="the leader's lease and its fencing epoch",
        statements=(
            # One row per lease (one today: "fleet"). `epoch` grows by one at every change of
            # holder; a write fenced with an epoch checks it under a share lock of this row
            # (fleet_svc/store/postgres_lease.py).
            """
            CREATE TABLE leases (
                name       TEXT        PRIMARY KEY,
                holder     TEXT        NOT NULL,
                address    TEXT        NOT NULL DEFAULT '',
                epoch      BIGINT      NOT NULL CHECK (epoch >= 1),
                expires_at TIMESTAMPTZ NOT NULL
            )
            """,
        ),
    ),
    Migration(
        version=3,
        summary="request ids bound to their request's fingerprint, pruned by age",
        statements=(
            # As the SQLite store's step 3: older rows keep '', which matches no request.
            "ALTER TABLE answers ADD COLUMN fingerprint TEXT NOT NULL DEFAULT ''",
            "CREATE INDEX answers_by_age ON answers (created_at)",
        ),
    ),
    Migration(
        version=4,
        summary="gang membership of replicas spanning several nodes",
        statements=(
            # A gang's members by rank; '[]' for a replica on one node (older rows read so).
            "ALTER TABLE replicas ADD COLUMN members JSON NOT NULL DEFAULT '[]'",
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
                created_at DOUBLE PRECISION NOT NULL
            )
            """,
        ),
    ),
    Migration(
        version=6,
        summary="a starting replica's download and load progress",
        statements=(
            # As the SQLite store's step 6: '{}' (none) for the rows of older fleets.
            "ALTER TABLE replicas ADD COLUMN progress JSON NOT NULL DEFAULT '{}'",
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
                figures           JSON    NOT NULL,
                received_at       DOUBLE PRECISION NOT NULL,
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
            # One row per node, written by the fleet holding its stream (not fenced); `seq`
            # is taken under NODE_REPORTS_LOCK, so seqs commit in order (postgres_nodes.py).
            """
            CREATE TABLE node_reports (
                node      TEXT             PRIMARY KEY,
                holder    TEXT             NOT NULL,
                stream    TEXT             NOT NULL,
                connected BOOLEAN          NOT NULL,
                heard_at  DOUBLE PRECISION NOT NULL,
                report    JSON             NOT NULL,
                seq       BIGINT           NOT NULL
            )
            """,
            "CREATE INDEX node_reports_by_seq ON node_reports (seq)",
            # One row per node, written by the leader's controller (fenced).
            """
            CREATE TABLE desired_sets (
                node    TEXT   PRIMARY KEY,
                version BIGINT NOT NULL,
                body    BYTEA  NOT NULL,
                seq     BIGINT NOT NULL
            )
            """,
            "CREATE INDEX desired_sets_by_seq ON desired_sets (seq)",
        ),
    ),
    Migration(
        version=9,
        summary="holders' beats: when each agent a fleet holds was last heard, one row a fleet",
        statements=(
            # One row per fleet holding streams, written every heartbeat interval in place of
            # every node's row; `seq` is taken under NODE_REPORTS_LOCK too.
            """
            CREATE TABLE node_beats (
                holder TEXT             PRIMARY KEY,
                heard  JSON             NOT NULL,
                at     DOUBLE PRECISION NOT NULL,
                seq    BIGINT           NOT NULL
            )
            """,
        ),
    ),
)

_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS schema_version (
    version    INTEGER     PRIMARY KEY,
    summary    TEXT        NOT NULL,
    applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
"""


def schema_version(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    """The database's schema version: the highest applied step (0 when none is, or when the
    schema_version table does not exist yet)."""
    exists = conn.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchone()
    if exists is None or not exists[0]:
        return 0
    row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()
    return 0 if row is None else int(str(row[0]))


def migrate(
    conn: psycopg.Connection[tuple[object, ...]],
    where: str,
    migrations: Sequence[Migration] = MIGRATIONS,
) -> list[int]:
    """Bring the database up to the last of `migrations`, each step once, in its own
    transaction; a newer database is refused before anything is written.

    `conn` must be in autocommit mode: this function opens and commits its own transactions.
    Each holds MIGRATION_LOCK (pg_advisory_xact_lock, released at commit) and reads the
    version again under it, so fleets migrating one fresh database together apply each step
    once.

    Args:
        conn: an autocommit connection.
        where: the database as messages name it (a DSN without its password).
        migrations: the schema's steps, numbered 1, 2, 3 … in order.

    Returns:
        The versions this call applied, in order.

    Raises:
        MigrationOrderError: `migrations` are not numbered 1..N in order.
        SchemaTooNew: the database is newer than the last of `migrations`.
        psycopg.Error: a step failed; the database stays at the version before it.
    """
    check_order(migrations)
    known = latest_version(migrations)
    found = schema_version(conn)
    if found > known:
        raise SchemaTooNew(where, found, known)
    applied: list[int] = []
    for migration in migrations:
        if migration.version <= found:
            continue
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute(_VERSION_TABLE)
            current = schema_version(conn)
            if current > known:
                raise SchemaTooNew(where, current, known)
            if current >= migration.version:
                continue
            for statement in migration.statements:
                conn.execute(statement.encode())
            conn.execute(
                "INSERT INTO schema_version (version, summary) VALUES (%s, %s)",
                (migration.version, migration.summary),
            )
        applied.append(migration.version)
    return applied
