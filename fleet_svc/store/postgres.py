"""The fleet's store in PostgreSQL (psycopg 3 and its pool): for fleets sharing one database.

Its calls are grouped by the rows they touch, each group a class PostgresStore is made of
(postgres_catalog.py, postgres_answers.py, postgres_state.py, postgres_traffic.py; the agents'
streams and named values are here); postgres_calls.py turns psycopg's errors into store errors
and scopes each write; its connections are postgres_link.py (each batching statements,
postgres_batch.py), its schema postgres_schema.py, its lease postgres_lease.py, its agents'
stream rows postgres_nodes.py.

Isolation: READ COMMITTED (PostgreSQL's default), with each compare-and-swap made safe by a
constraint or an explicit row lock rather than by SERIALIZABLE:
- a catalog write inserts (name, revision + 1); the primary key lets one of two writers holding
  the same etag insert it, and the other's insert (ON CONFLICT DO NOTHING: it waits for the
  winner's commit, then does nothing) is turned into StaleRevision naming the winner's
  revision: the same answer SQLite's write lock gives;
- a request id's first answer is `INSERT … ON CONFLICT DO NOTHING`: the first commit wins;
- an event's seq is taken under `SELECT … FOR UPDATE` of its rollout's row, so two appends to
  one rollout queue on that row instead of racing for MAX(seq) + 1 (events are append-only);
- replica and rollout writes are upserts of whole rows; a tick's batch is one transaction;
- a change's transaction may send the fence, the request id's claim and the revision's insert
  with its COMMIT, each as a statement that raises when its condition does not hold
  (postgres_batch.CHECKED): the same locks and constraints decide, and a check that fails
  rolls the whole transaction back before its COMMIT runs (ChecksFailed; the caller runs it
  again with each check answered at once).
SERIALIZABLE would give the same guarantees only with a retry loop around every transaction
(serialization failures, SQLSTATE 40001, are expected under it, even for writers of different
models sharing an index page), and each of these invariants is about one key, which a key or a
row lock guards exactly.

Durability: every connection runs with `synchronous_commit = on` (a commit returns after its WAL
record is flushed; https://www.postgresql.org/docs/15/runtime-config-wal.html), whatever the
server's default, because the fleet answers "accepted" only once a write returns.

Connections: from a pool (psycopg_pool), each checked before use, so one the server closed (a
restart, pg_terminate_backend) is replaced, not used; while the server cannot be
reached, calls fail fast with StoreUnavailable for FAIL_FAST_S after each failed attempt, so
the fleet's event loop is not held waiting for connect timeouts one call after another.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import psycopg

from fleet_svc.store import postgres_nodes
from fleet_svc.store.base import (
    DESIRED,
    DesiredRecord,
    NodeBeat,
    NodeReport,
    StoreDamaged,
    StoreUnavailable,
)
from fleet_svc.store.codec import (
    EVENT_COLUMNS,
    MODEL_COLUMNS,
    REPLICA_COLUMNS,
    ROLLOUT_COLUMNS,
    event_of_row,
    model_of_row,
    replica_of_row,
    rollout_of_row,
)
from fleet_svc.store.migrations import SchemaTooNew, latest_version
from fleet_svc.store.postgres_answers import AnswerCalls
from fleet_svc.store.postgres_calls import guarded, trying
from fleet_svc.store.postgres_catalog import CatalogCalls
from fleet_svc.store.postgres_lease import IDLE_IN_TRANSACTION_MS, Lease, acquire
from fleet_svc.store.postgres_lease import release as release_lease
from fleet_svc.store.postgres_link import CONNECT_TIMEOUT_S, STATEMENT_TIMEOUT_MS, Link, first_line
from fleet_svc.store.postgres_schema import MIGRATIONS, migrate, schema_version
from fleet_svc.store.postgres_state import StateCalls, notify
from fleet_svc.store.postgres_traffic import TrafficCalls
from fleet_svc.store.urls import redact_dsn
from fleet_svc.store.verify import check_all


class PostgresStore(CatalogCalls, AnswerCalls, StateCalls, TrafficCalls):
    """The Store in a PostgreSQL database (migrated on open); safe to call from any thread.

    Several fleets may share one database: writes that must not interleave are guarded as the
    module docstring says. Revisions follow the SQLite store's rules exactly (the shared test
    suite runs against both).
    """

    thread_safe = True

    def __init__(self, dsn: str, *, clock: Callable[[], float] = time.time) -> None:
        """Connect, migrate, and open the pool.

        Args:
            dsn: a libpq connection string or `postgresql://` URL.
            clock: seconds since the epoch, stamped on stored answers.

        Raises:
            StoreUnavailable: the server cannot be reached, or refuses the connection (naming
                the DSN, its password left out, and the server's reason).
            SchemaTooNew: the database was migrated by a newer fleet; it is left untouched.
            StoreDamaged: a migration failed.
            ValueError: `dsn` is not a connection string libpq reads.
        """
        self.where = redact_dsn(dsn)
        self._clock = clock
        self._reports_read = postgres_nodes.ReportsRead()
        self.damage = None
        self._fence = None
        self._unsettled = threading.local()
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": CONNECT_TIMEOUT_S,
            "options": f"-c synchronous_commit=on -c statement_timeout={STATEMENT_TIMEOUT_MS}"
            f" -c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}",
        }
        # Named in pg_stat_activity as the DSN says (`?application_name=fleet-a`: one name per
        # fleet sharing the database), else as a fleet.
        try:
            named = "application_name" in psycopg.conninfo.conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as exc:
            raise ValueError(f"the fleet store {self.where}: {first_line(exc)}") from exc
        if not named:
            kwargs["application_name"] = "llmgw-fleet"
        # One direct connection first: its failure carries the server's reason ("connection
        # refused", "database … does not exist"), where the pool would only time out.
        try:
            with psycopg.connect(dsn, **kwargs) as conn:
                migrate(conn, self.where, MIGRATIONS)
                host = conn.info.host
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(self.where, first_line(exc)) from exc
        except SchemaTooNew:
            raise
        except psycopg.Error as exc:
            raise StoreDamaged(self.where, f"migration failed: {first_line(exc)}") from exc
        self.link = Link(dsn, self.where, kwargs)
        self.pipelining = not on_this_machine(host)

    def close(self) -> None:
        """Close the pool (a second call does nothing)."""
        self.link.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # Health.

    @trying
    def probe(self) -> None:
        """Raise the damage a call found since opening; else read the schema version over a
        pooled connection (reaching the server, and noticing a newer fleet's migration).

        Raises:
            StoreDamaged, StoreUnavailable, SchemaTooNew.
        """
        if self.damage is not None:
            raise self.damage
        with self.link.connection() as conn:
            found = schema_version(conn)
        if found > latest_version(MIGRATIONS):
            raise SchemaTooNew(self.where, found, latest_version(MIGRATIONS))

    @guarded
    def verify(self) -> None:
        """Every row decoded as the fleet reads it (PostgreSQL checks its own pages: checksums
        when the cluster has them; there is no quick_check to run).

        Raises:
            StoreDamaged: naming the first row that does not decode.
        """
        with self.link.connection() as conn:
            models = [
                model_of_row(self.where, row)
                for row in conn.execute(f"SELECT {MODEL_COLUMNS} FROM model_revisions")
            ]
            replicas = [
                replica_of_row(self.where, row)
                for row in conn.execute(f"SELECT {REPLICA_COLUMNS} FROM replicas")
            ]
            rollouts = [
                rollout_of_row(self.where, row)
                for row in conn.execute(f"SELECT {ROLLOUT_COLUMNS} FROM rollouts")
            ]
            for row in conn.execute(f"SELECT {EVENT_COLUMNS} FROM rollout_events"):
                event_of_row(self.where, row)
        check_all(self.where, models, replicas, rollouts)

    # Leadership (fleet_svc/store/postgres_lease.py).

    @guarded
    def acquire_lease(self, holder: str, address: str, lease_s: float) -> Lease:
        """Take or renew the fleets' lease for `lease_s` seconds; who holds it after."""
        with self.link.connection() as conn:
            return acquire(conn, holder, address, lease_s)

    @guarded
    def release_lease(self, holder: str) -> None:
        """End `holder`'s lease now (a clean stop)."""
        with self.link.connection() as conn:
            release_lease(conn, holder)

    # Agents' streams (fleet_svc/store/postgres_nodes.py).

    @guarded
    def put_node_reports(self, reports: Sequence[NodeReport], beat: NodeBeat | None = None) -> None:
        """Upsert node reports at the next seqs and the holder's beat, in one transaction
        (never fenced: a follower writes the reports of the agents it holds)."""
        if not reports and beat is None:
            return
        with self.link.connection() as conn, conn.transaction():
            postgres_nodes.put_reports(conn, reports, beat)

    @guarded
    def list_node_beats(self, after_seq: int = 0) -> list[NodeBeat]:
        """Holders' beats written after `after_seq`, by seq."""
        with self.link.connection() as conn:
            return postgres_nodes.list_beats(conn, after_seq)

    @guarded
    def list_node_reports(self, after_seq: int = 0) -> list[NodeReport]:
        """Node reports written after `after_seq`, by seq."""
        with self.link.connection() as conn:
            return postgres_nodes.list_reports(conn, after_seq, self._reports_read)

    @guarded
    def put_desired(self, records: Sequence[DesiredRecord]) -> None:
        """Upsert desired sets at the next seqs in one fenced transaction; the fleets
        listening are notified at its commit."""
        if not records:
            return
        with self.link.connection() as conn, self._writing(conn, transaction=True):
            postgres_nodes.put_desired(conn, records)
            notify(conn, DESIRED)

    @guarded
    def list_desired(self, after_seq: int = 0) -> list[DesiredRecord]:
        """Desired sets written after `after_seq`, by seq."""
        with self.link.connection() as conn:
            return postgres_nodes.list_desired(conn, after_seq)

    # Named values.

    @guarded
    def get_value(self, key: str) -> str | None:
        """A stored value, None when the key was never set."""
        with self.link.connection() as conn:
            row = conn.execute("SELECT value FROM named_values WHERE key = %s", (key,)).fetchone()
        return None if row is None else str(row[0])

    @guarded
    def put_value(self, key: str, value: str) -> None:
        """Store a value, replacing the key's previous one."""
        with self.link.connection() as conn, self._writing(conn):
            conn.execute(
                "INSERT INTO named_values (key, value) VALUES (%s, %s)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )


def on_this_machine(host: str) -> bool:
    """Whether a connection's host (psycopg's ConnectionInfo.host: a name, an address, or a
    Unix socket's folder) is this machine, where a write outside an atomic block is batched
    (postgres_batch) rather than pipelined."""
    # Measured on 2 shared cores, PostgreSQL 15 on 127.0.0.1, psycopg 3.3.9 (binary),
    # 2026-12-02: a SetContext's store calls in one process took 405-419 us (294-299 us of
    # CPU) pipelined, in 4 round trips, and 340-342 us (213-217 us of CPU) a statement at a
    # time, in 8; through fleets (bench.store_pg's calls, 3 pairs) a SetContext's median was
    # 3.34-3.42 ms pipelined and 2.78-3.08 ms not. A round trip to another host (hundreds of
    # us) costs more than the pipeline's work, so there statements go together.
    return host.startswith("/") or host in ("localhost", "::1") or host.startswith("127.")
