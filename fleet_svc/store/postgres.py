"""The fleet's store in PostgreSQL (psycopg 3 and its pool): for fleets sharing one database.

(Past 500 lines because it is the whole Store interface, one short method of SQL per call, as
sqlite.py is; its connections are postgres_link.py, its schema postgres_schema.py.)

Isolation: READ COMMITTED (PostgreSQL's default), with each compare-and-swap made safe by a
constraint or an explicit row lock rather than by SERIALIZABLE:
- a catalog write inserts (name, revision + 1); the primary key lets one of two writers holding
  the same etag insert it, and the other's insert (ON CONFLICT DO NOTHING: it waits for the
  winner's commit, then does nothing) is turned into StaleRevision naming the winner's
  revision: the same answer SQLite's write lock gives;
- a request id's first answer is `INSERT … ON CONFLICT DO NOTHING`: the first commit wins;
- an event's seq is taken under `SELECT … FOR UPDATE` of its rollout's row, so two appends to
  one rollout queue on that row instead of racing for MAX(seq) + 1 (events are append-only);
- replica and rollout writes are upserts of whole rows; a tick's batch is one transaction.
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

import functools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

import psycopg
import psycopg_pool
import structlog

from fleet_svc.store import postgres_nodes
from fleet_svc.store.base import (
    AnswerRecord,
    DesiredRecord,
    EventRecord,
    ModelRecord,
    NodeReport,
    ReplicaRecord,
    RolloutRecord,
    RolloutRequest,
    StaleRevision,
    StoreDamaged,
    StoreUnavailable,
    TrafficRecord,
)
from fleet_svc.store.codec import (
    EVENT_COLUMNS,
    MODEL_COLUMNS,
    REPLICA_COLUMNS,
    ROLLOUT_COLUMNS,
    TRAFFIC_COLUMNS,
    dump_json,
    event_of_row,
    model_of_row,
    readable_rows,
    replica_of_row,
    request_of_row,
    rollout_filter,
    rollout_of_row,
    traffic_of_row,
    traffic_row,
)
from fleet_svc.store.migrations import SchemaTooNew, latest_version
from fleet_svc.store.postgres_lease import (
    FENCE_QUERY,
    IDLE_IN_TRANSACTION_MS,
    LEASE_NAME,
    Lease,
    acquire,
    check_fence,
    fenced,
)
from fleet_svc.store.postgres_lease import release as release_lease
from fleet_svc.store.postgres_link import (
    CONNECT_TIMEOUT_S,
    POOL_MAX,
    STATEMENT_TIMEOUT_MS,
    Link,
    NoConnection,
    first_line,
)
from fleet_svc.store.postgres_schema import MIGRATIONS, migrate, schema_version
from fleet_svc.store.urls import redact_dsn
from fleet_svc.store.verify import check_all

log = structlog.get_logger(__name__)
P = ParamSpec("P")

STATE_CHANNEL = "llmgw_fleet_state"
"""The channel every write of replicas and rollouts notifies (at its commit), and fleets that
follow listen on (`PostgresStore.listen`)."""
LISTEN_POLL_S = 1.0
"""How long a listener waits for a notification before it checks whether to stop."""
LISTEN_RETRY_S = 1.0
"""How long a listener whose connection broke waits before connecting again."""
R = TypeVar("R")


def _guarded(
    method: Callable[Concatenate[PostgresStore, P], R],
) -> Callable[Concatenate[PostgresStore, P], R]:
    """Raise a store error for what psycopg raises; fail fast while the server is down; tried
    again on a fresh connection when the one it used broke under it (the method must be
    safe to run twice: a read, an upsert, an insert that ignores a repeat, a delete)."""
    return _translating(method, fail_fast=True, again=True)


def _once(
    method: Callable[Concatenate[PostgresStore, P], R],
) -> Callable[Concatenate[PostgresStore, P], R]:
    """As _guarded, but never run twice: a broken connection may have committed the first try
    (a catalog revision, an event), so the caller is told StoreUnavailable and decides."""
    return _translating(method, fail_fast=True, again=False)


def _trying(
    method: Callable[Concatenate[PostgresStore, P], R],
) -> Callable[Concatenate[PostgresStore, P], R]:
    """As _guarded, but always trying the server (the health probe: it is what notices the
    server is back)."""
    return _translating(method, fail_fast=False, again=True)


def _translating(
    method: Callable[Concatenate[PostgresStore, P], R], *, fail_fast: bool, again: bool
) -> Callable[Concatenate[PostgresStore, P], R]:
    @functools.wraps(method)
    def call(self: PostgresStore, /, *args: P.args, **kwargs: P.kwargs) -> R:
        if fail_fast:
            self.link.fail_fast()
        # Every pooled connection may have been cut at once: one try more than the pool holds.
        # Never again inside an atomic block: its transaction is gone with its connection.
        tries = POOL_MAX + 1 if again and self.link.pinned() is None else 1
        for attempt in range(1, tries + 1):
            try:
                result = method(self, *args, **kwargs)
                self._settle_fence()
            except StoreDamaged as exc:
                self.damage = self.damage or exc
                raise
            except psycopg_pool.PoolClosed:
                raise  # the store was closed: the caller's mistake, as a closed SQLite store's
            except NoConnection as exc:
                # The server cannot be reached: fail fast until it can (see FAIL_FAST_S).
                raise self.link.down(exc.problem) from exc
            except psycopg.OperationalError as exc:
                # A connection broke under the call (the server ended it: a restart,
                # pg_terminate_backend, 57P01 admin_shutdown) or a statement timed out: the
                # server or the network, not the data. Once more on a fresh connection when
                # that is safe; the server itself may be fine, so no fail-fast.
                if attempt < tries:
                    log.info("store_call_retried", store=self.where, problem=first_line(exc))
                    continue
                raise StoreUnavailable(self.where, first_line(exc)) from exc
            except (psycopg.IntegrityError, psycopg.InterfaceError):
                raise  # a constraint the caller broke, or a closed store: the caller's mistake
            except psycopg.DatabaseError as exc:
                # A table or column gone, a row the server cannot return: the schema is damaged.
                damaged = StoreDamaged(self.where, f"PostgreSQL: {first_line(exc)}")
                self.damage = self.damage or damaged
                raise damaged from exc
            self.link.reached()
            return result
        raise AssertionError("unreachable: the last attempt returns or raises")

    return call


class PostgresStore:
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
        self.damage: StoreDamaged | None = None
        """The first damage a call found; `probe` reports it until the store is reopened."""
        self._fence: int | None = None
        """The leadership epoch every write is fenced with (None: writes are not fenced)."""
        self._unsettled = threading.local()
        """`fence`: the fence an `atomic` block of this thread sent and has not read yet."""
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
        """Whether statements sent together go in one round trip (psycopg's pipeline mode):
        not to a server on this machine, where a round trip costs less than the pipeline's
        own work (see on_this_machine)."""

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

    @_trying
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

    @_guarded
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

    @_guarded
    def acquire_lease(self, holder: str, address: str, lease_s: float) -> Lease:
        """Take or renew the fleets' lease for `lease_s` seconds; who holds it after."""
        with self.link.connection() as conn:
            return acquire(conn, holder, address, lease_s)

    @_guarded
    def release_lease(self, holder: str) -> None:
        """End `holder`'s lease now (a clean stop)."""
        with self.link.connection() as conn:
            release_lease(conn, holder)

    @_guarded
    def state_digest(self) -> str:
        """A digest of every replica and rollout row, computed by the server (no row leaves
        it): a fleet that follows reads those rows again only when this changed."""
        with self.link.connection() as conn:
            row = conn.execute(_STATE_DIGEST).fetchone()
        return "" if row is None else f"{row[0]}/{row[1]}"

    def listen(self, changed: Callable[[], None], stop: threading.Event) -> None:
        """Call `changed` whenever a write of replicas or rollouts commits (LISTEN on
        STATE_CHANNEL over a connection of its own), and once each time it (re)connects, since
        notifications sent while it was away are lost; until `stop` is set. Blocks: run it on a
        thread. A broken connection is logged and made again after LISTEN_RETRY_S."""
        failing = ""
        while not stop.is_set():
            try:
                with self.link.dedicated() as conn:
                    conn.execute(f"LISTEN {STATE_CHANNEL}")
                    changed()
                    if failing:
                        log.info("store_listen_recovered", store=self.where)
                        failing = ""
                    while not stop.is_set():
                        for _ in conn.notifies(timeout=LISTEN_POLL_S):
                            changed()
            except psycopg.Error as exc:
                if first_line(exc) != failing:
                    failing = first_line(exc)
                    log.warning("store_listen_failed", store=self.where, problem=failing)
                stop.wait(LISTEN_RETRY_S)

    def fence(self, epoch: int | None) -> None:
        """Fence every later write with `epoch` (None: stop fencing): each is made only while
        `epoch` is the lease's, else refused with NotLeader."""
        self._fence = epoch

    @contextmanager
    def _writing(
        self, conn: psycopg.Connection[tuple[Any, ...]], *, transaction: bool = False
    ) -> Iterator[None]:
        """The scope of one write: inside `atomic`, its transaction (fenced at its start, its
        share lock on the lease held until it ends: no savepoint, no second check); else a
        transaction checking the fence first when fenced (or when the write needs one anyway),
        pipelined when `pipelining` (BEGIN and the fence's read in one round trip, the writes
        and COMMIT in another); else the bare autocommit statement(s)."""
        if self.link.pinned() is not None:
            yield
            return
        epoch = self._fence
        if epoch is None and not transaction:
            yield
            return
        with self._pipelined(conn), conn.transaction():
            if epoch is not None:
                check_fence(conn, epoch, self.where)
            yield

    # The catalog.

    @_guarded
    def get_model(self, name: str) -> ModelRecord | None:
        """The model's latest revision, None when absent or deleted."""
        with self.link.connection() as conn:
            row = conn.execute(
                f"SELECT {MODEL_COLUMNS} FROM model_revisions WHERE name = %s"
                " ORDER BY revision DESC LIMIT 1",
                (name,),
            ).fetchone()
        if row is None:
            return None
        record = model_of_row(self.where, row)
        return None if record.deleted else record

    @_guarded
    def model_to_change(
        self, name: str, states: Sequence[str]
    ) -> tuple[ModelRecord | None, list[RolloutRecord]]:
        """The model's latest revision and its rollouts in `states` (Store.model_to_change):
        when `pipelining`, both statements are sent before either answer is read (one round
        trip)."""
        where, params = rollout_filter(name, states, "%s")
        with self.link.connection() as conn, self._pipelined(conn):
            model = conn.execute(
                f"SELECT {MODEL_COLUMNS} FROM model_revisions WHERE name = %s"
                " ORDER BY revision DESC LIMIT 1",
                (name,),
            )
            rollouts = conn.execute(
                f"SELECT {ROLLOUT_COLUMNS} FROM rollouts{where} ORDER BY created_at DESC, id DESC",
                params,
            )
            row = model.fetchone()
            rows = rollouts.fetchall()
        record = None if row is None else model_of_row(self.where, row)
        return (None if record is None or record.deleted else record), self._readable(
            rows, rollout_of_row
        )

    @contextmanager
    def _pipelined(self, conn: psycopg.Connection[tuple[Any, ...]]) -> Iterator[None]:
        """Statements sent together: a pipeline when `pipelining` (inside `atomic`, its
        own), else one statement at a time."""
        if not self.pipelining or self.link.pinned() is not None:
            yield
            return
        with conn.pipeline():
            yield

    @_guarded
    def list_models(self) -> list[ModelRecord]:
        """Every current (latest, not deleted) model, by name."""
        with self.link.connection() as conn:
            rows = conn.execute(
                f"SELECT {MODEL_COLUMNS} FROM (SELECT DISTINCT ON (name) {MODEL_COLUMNS}"
                " FROM model_revisions ORDER BY name, revision DESC) AS latest"
                " WHERE NOT deleted ORDER BY name"
            ).fetchall()
        return [model_of_row(self.where, row) for row in rows]

    @_once
    def put_model(self, record: ModelRecord, *, expect_revision: int) -> ModelRecord:
        """Write `record` as the model's next revision if its latest one is `expect_revision`
        (the rules of SQLiteStore.put_model; the primary key settles a race, see the module
        docstring).

        Raises:
            StaleRevision: the model's latest revision is not `expect_revision`.
            ValueError: a deletion of a model that is absent or deleted.
        """
        spec = dump_json(record.spec)
        with self.link.connection() as conn, self._writing(conn, transaction=True):
            # One statement in the common case: the revision after the last, inserted only
            # when the last is the one expected; a writer that read the same last revision
            # and inserted first wins (this insert waits for its commit, then does nothing:
            # no error, so an atomic block needs no savepoint around it).
            row = conn.execute(
                _PUT_MODEL,
                {
                    "name": record.name,
                    "spec": spec,
                    "by": record.updated_by,
                    "at": record.updated_at,
                    "deleted": record.deleted,
                    "declared_in": record.declared_in,
                    "expect": expect_revision,
                },
            ).fetchone()
            if row is not None:
                return replace(record, revision=int(row[0]))
            last, absent = _latest(conn, record.name)
            if record.deleted and absent and expect_revision in (0, last):
                raise ValueError(f"model {record.name!r} does not exist, so it cannot be deleted")
            raise StaleRevision(record.name, expect_revision, last)

    @_guarded
    def model_history(self, name: str) -> list[ModelRecord]:
        """Every revision of a model, oldest first (deletions included)."""
        with self.link.connection() as conn:
            rows = conn.execute(
                f"SELECT {MODEL_COLUMNS} FROM model_revisions WHERE name = %s ORDER BY revision",
                (name,),
            ).fetchall()
        return [model_of_row(self.where, row) for row in rows]

    # Idempotency.

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """One transaction for the block's writes (Store.atomic), on one pooled connection
        pinned to the calling thread until it ends (every store call of that thread uses it;
        psycopg makes an inner transaction a savepoint); fenced when the store is."""
        if self.link.pinned() is not None:
            with self.link.connection() as conn, conn.transaction():
                yield
            return
        try:
            self.link.fail_fast()
            # Pipelined (when `pipelining`): statements whose results the block does not read
            # wait to go with the next one it does (BEGIN with the fence and the first read;
            # the last writes with COMMIT).
            with (
                self.link.connection() as conn,
                self.link.pin(conn),
                self._pipelined(conn),
                conn.transaction(),
            ):
                if self._fence is not None:
                    # Sent now (its share lock is taken before any write of the block), read
                    # with the block's first answer (_settle_fence): pipelined, no round trip
                    # of its own.
                    self._unsettled.fence = (
                        conn.execute(FENCE_QUERY, (LEASE_NAME,)),
                        self._fence,
                    )
                try:
                    yield
                    self._settle_fence()
                finally:
                    self._unsettled.fence = None
        except NoConnection as exc:
            raise self.link.down(exc.problem) from exc
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(self.where, first_line(exc)) from exc

    def _settle_fence(self) -> None:
        """Inside `atomic`: refuse to go on unless the fence sent at its start holds (read once,
        after the first statement whose answer was read: pipelined, it came back in the same
        batch).

        Raises:
            NotLeader: the epoch is over; the block's transaction is rolled back.
        """
        unsettled: tuple[psycopg.Cursor[tuple[Any, ...]], int] | None = getattr(
            self._unsettled, "fence", None
        )
        if unsettled is None:
            return
        self._unsettled.fence = None
        cursor, epoch = unsettled
        fenced(cursor.fetchone(), epoch, self.where)

    @_guarded
    def get_answer(self, request_id: str) -> AnswerRecord | None:
        """The answer stored for a request id, None when there is none."""
        with self.link.connection() as conn:
            row = conn.execute(
                "SELECT method, answer, fingerprint, created_at FROM answers WHERE request_id = %s",
                (request_id,),
            ).fetchone()
        if row is None:
            return None
        return AnswerRecord(str(row[0]), bytes(row[1]), str(row[2]), float(row[3]))

    @_once
    def claim_answer(self, request_id: str, method: str, fingerprint: str) -> bool:
        """Reserve a request id (an empty answer until put_answer fills it); False when taken.
        A racing attempt's uncommitted claim makes this insert wait for it (the primary key),
        then find the id taken."""
        with self.link.connection() as conn, self._writing(conn):
            row = conn.execute(
                "INSERT INTO answers (request_id, method, answer, created_at, fingerprint)"
                " VALUES (%s, %s, '', %s, %s) ON CONFLICT (request_id) DO NOTHING RETURNING 1",
                (request_id, method, self._clock(), fingerprint),
            ).fetchone()
            return row is not None

    @_guarded
    def put_answer(
        self, request_id: str, method: str, answer: bytes, *, fingerprint: str = ""
    ) -> None:
        """Keep the answer to a request id: fill its claimed (empty) row of the same method and
        fingerprint; any other answer already there is kept."""
        with self.link.connection() as conn, self._writing(conn):
            conn.execute(
                "INSERT INTO answers (request_id, method, answer, created_at, fingerprint)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (request_id) DO UPDATE"
                " SET answer = excluded.answer WHERE length(answers.answer) = 0"
                " AND answers.method = excluded.method"
                " AND answers.fingerprint = excluded.fingerprint",
                (request_id, method, answer, self._clock(), fingerprint),
            )

    @_guarded
    def prune_answers(self, before: float) -> int:
        """Forget answers stored before `before`; how many were."""
        with self.link.connection() as conn, self._writing(conn):
            # Counted by the server: a pipelined statement's rowcount is not known until read.
            row = conn.execute(
                "WITH gone AS (DELETE FROM answers WHERE created_at < %s RETURNING 1)"
                " SELECT count(*) FROM gone",
                (before,),
            ).fetchone()
            return 0 if row is None else int(row[0])

    @_guarded
    def forget_answer(self, request_id: str) -> None:
        """Forget one request id's answer."""
        with self.link.connection() as conn, self._writing(conn):
            conn.execute("DELETE FROM answers WHERE request_id = %s", (request_id,))

    # Replicas.

    @_guarded
    def list_replicas(self) -> list[ReplicaRecord]:
        """Every replica record, by id."""
        with self.link.connection() as conn:
            rows = conn.execute(f"SELECT {REPLICA_COLUMNS} FROM replicas ORDER BY id").fetchall()
        return [replica_of_row(self.where, row) for row in rows]

    @_guarded
    def write_replicas(self, puts: Sequence[ReplicaRecord], deletes: Sequence[str]) -> None:
        """Insert or replace `puts` and forget `deletes` in one transaction."""
        if not puts and not deletes:
            return
        rows = [_replica_params(r) for r in puts]
        with self.link.connection() as conn, self._writing(conn, transaction=True):
            if rows:
                with conn.cursor() as cur:
                    cur.executemany(_UPSERT_REPLICA, rows)
            if deletes:
                conn.execute("DELETE FROM replicas WHERE id = ANY(%s)", (list(deletes),))
            _notify(conn)

    @_guarded
    def put_replica(self, record: ReplicaRecord) -> None:
        """Insert a replica record, or replace every field of the one with the same id."""
        params = _replica_params(record)
        with self.link.connection() as conn, self._writing(conn, transaction=True):
            conn.execute(_UPSERT_REPLICA, params)
            _notify(conn)

    @_guarded
    def delete_replica(self, replica_id: str) -> None:
        """Forget a replica (deleting an unknown id does nothing)."""
        with self.link.connection() as conn, self._writing(conn, transaction=True):
            conn.execute("DELETE FROM replicas WHERE id = %s", (replica_id,))
            _notify(conn)

    # Agents' streams (fleet_svc/store/postgres_nodes.py).

    @_guarded
    def put_node_reports(self, reports: Sequence[NodeReport]) -> None:
        """Upsert node reports at the next seqs, in one transaction (never fenced: a follower
        writes the reports of the agents it holds)."""
        if not reports:
            return
        with self.link.connection() as conn, conn.transaction():
            postgres_nodes.put_reports(conn, reports)

    @_guarded
    def list_node_reports(self, after_seq: int = 0) -> list[NodeReport]:
        """Node reports written after `after_seq`, by seq."""
        with self.link.connection() as conn:
            return postgres_nodes.list_reports(conn, after_seq, self._reports_read)

    @_guarded
    def put_desired(self, records: Sequence[DesiredRecord]) -> None:
        """Upsert desired sets at the next seqs in one fenced transaction; the fleets
        listening are notified at its commit."""
        if not records:
            return
        with self.link.connection() as conn, self._writing(conn, transaction=True):
            postgres_nodes.put_desired(conn, records)
            _notify(conn)

    @_guarded
    def list_desired(self, after_seq: int = 0) -> list[DesiredRecord]:
        """Desired sets written after `after_seq`, by seq."""
        with self.link.connection() as conn:
            return postgres_nodes.list_desired(conn, after_seq)

    # Named values.

    @_guarded
    def get_value(self, key: str) -> str | None:
        """A stored value, None when the key was never set."""
        with self.link.connection() as conn:
            row = conn.execute("SELECT value FROM named_values WHERE key = %s", (key,)).fetchone()
        return None if row is None else str(row[0])

    @_guarded
    def put_value(self, key: str, value: str) -> None:
        """Store a value, replacing the key's previous one."""
        with self.link.connection() as conn, self._writing(conn):
            conn.execute(
                "INSERT INTO named_values (key, value) VALUES (%s, %s)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    # Rollouts.

    @_guarded
    def put_rollout(self, record: RolloutRecord) -> None:
        """Insert a rollout, or replace its state (created_at is kept)."""
        spec = dump_json(record.spec)
        with self.link.connection() as conn, self._writing(conn, transaction=True):
            _notify(conn)
            conn.execute(
                "INSERT INTO rollouts (id, model, state, spec, created_at, updated_at)"
                " VALUES (%s, %s, %s, %s::json, %s, %s) ON CONFLICT (id) DO UPDATE SET"
                " state = excluded.state, spec = excluded.spec, updated_at = excluded.updated_at",
                (
                    record.id,
                    record.model,
                    record.state,
                    spec,
                    record.created_at,
                    record.updated_at,
                ),
            )

    @_guarded
    def get_rollout(self, rollout_id: str) -> RolloutRecord | None:
        """A rollout, None when unknown."""
        with self.link.connection() as conn:
            row = conn.execute(
                f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE id = %s", (rollout_id,)
            ).fetchone()
        return None if row is None else rollout_of_row(self.where, row)

    @_guarded
    def list_rollouts(self, model: str = "", *, states: Sequence[str] = ()) -> list[RolloutRecord]:
        """Rollouts of a model (every model when ""), newest first, only those in `states`
        when given; a row that does not decode is logged and left out (see
        SQLiteStore._readable)."""
        where, params = rollout_filter(model, states, "%s")
        with self.link.connection() as conn:
            rows = conn.execute(
                f"SELECT {ROLLOUT_COLUMNS} FROM rollouts{where} ORDER BY created_at DESC, id DESC",
                params,
            ).fetchall()
        return self._readable(rows, rollout_of_row)

    # Requests of rollouts.

    @_guarded
    def put_rollout_request(self, request: RolloutRequest) -> None:
        """Record a request (a repeated id is ignored)."""
        with self.link.connection() as conn, self._writing(conn):
            conn.execute(
                "INSERT INTO rollout_requests"
                " (id, rollout_id, kind, reason, requested_by, created_at)"
                " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING",
                (
                    request.id,
                    request.rollout_id,
                    request.kind,
                    request.reason,
                    request.by,
                    request.created_at,
                ),
            )

    @_guarded
    def list_rollout_requests(self) -> list[RolloutRequest]:
        """Every request not yet carried out, oldest first."""
        with self.link.connection() as conn:
            rows = conn.execute(
                "SELECT id, rollout_id, kind, reason, requested_by, created_at"
                " FROM rollout_requests ORDER BY created_at, id"
            ).fetchall()
        return [request_of_row(row) for row in rows]

    @_guarded
    def delete_rollout_requests(self, ids: Sequence[str]) -> None:
        """Forget requests the controller carried out."""
        if not ids:
            return
        with self.link.connection() as conn, self._writing(conn):
            conn.execute("DELETE FROM rollout_requests WHERE id = ANY(%s)", (list(ids),))

    # Traffic reports.

    @_guarded
    def put_traffic(self, records: Sequence[TrafficRecord], *, prune_before_ms: int) -> bool:
        """Keep one gateway's report of one interval once (False: it was kept before); the
        first row's key decides under the insert's own conflict check, so two fleets taking
        the same report at once keep it once."""
        if not records:
            return True
        first = records[0]
        with self.link.connection() as conn, self._writing(conn, transaction=True):
            conn.execute(
                "DELETE FROM traffic_reports WHERE interval_start_ms < %s", (prune_before_ms,)
            )
            # Serialize reports of one (gateway, interval): the second waits, then sees it.
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtext(%s))",
                (f"traffic/{first.gateway}/{first.interval_start_ms}",),
            )
            seen = conn.execute(
                "SELECT 1 FROM traffic_reports WHERE gateway = %s AND interval_start_ms = %s"
                " LIMIT 1",
                (first.gateway, first.interval_start_ms),
            ).fetchone()
            if seen is not None:
                return False
            with conn.cursor() as cur:
                cur.executemany(
                    f"INSERT INTO traffic_reports ({TRAFFIC_COLUMNS})"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s::json, %s)",
                    [traffic_row(r) for r in records],
                )
        return True

    @_guarded
    def list_traffic(self, model: str, since_ms: int) -> list[TrafficRecord]:
        """The model's traffic records of intervals that began at or after `since_ms`."""
        with self.link.connection() as conn:
            rows = conn.execute(
                f"SELECT {TRAFFIC_COLUMNS} FROM traffic_reports"
                " WHERE model = %s AND interval_start_ms >= %s"
                " ORDER BY interval_start_ms, gateway",
                (model, since_ms),
            ).fetchall()
        return self._readable(rows, traffic_of_row)

    @_once
    def append_event(self, rollout_id: str, at: float, event: dict[str, Any]) -> int:
        """Append an event; its seq is the rollout's last plus one, taken holding the rollout's
        row lock (an unknown rollout is refused by the foreign key)."""
        doc = dump_json(event)
        with self.link.connection() as conn, self._writing(conn, transaction=True):
            conn.execute("SELECT 1 FROM rollouts WHERE id = %s FOR UPDATE", (rollout_id,))
            row = conn.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM rollout_events WHERE rollout_id = %s",
                (rollout_id,),
            ).fetchone()
            seq = (0 if row is None else int(row[0])) + 1
            conn.execute(
                "INSERT INTO rollout_events (rollout_id, seq, at, event)"
                " VALUES (%s, %s, %s, %s::json)",
                (rollout_id, seq, at, doc),
            )
            _notify(conn)
        return seq

    @_guarded
    def list_events(self, rollout_id: str, after_seq: int = 0) -> list[EventRecord]:
        """A rollout's events after `after_seq`, in order (one that does not decode is logged
        and left out)."""
        with self.link.connection() as conn:
            rows = conn.execute(
                f"SELECT {EVENT_COLUMNS} FROM rollout_events"
                " WHERE rollout_id = %s AND seq > %s ORDER BY seq",
                (rollout_id, after_seq),
            ).fetchall()
        return self._readable(rows, event_of_row)

    def _readable(
        self, rows: Sequence[tuple[Any, ...]], decode: Callable[[str, tuple[Any, ...]], R]
    ) -> list[R]:
        """The rows that decode (codec.readable_rows); damage met is remembered."""
        out, damage = readable_rows(self.where, rows, decode)
        self.damage = self.damage or damage
        return out


_STATE_DIGEST = (
    "SELECT (SELECT md5(coalesce(string_agg(concat_ws('|', "
    + REPLICA_COLUMNS.replace(", gpus,", ", gpus::text,").replace(", spec", ", spec::text")
    + "), ',' ORDER BY id), '')) FROM replicas),"
    " (SELECT md5(coalesce(string_agg(concat_ws('|', id, state, updated_at), ','"
    " ORDER BY id), '')) FROM rollouts)"
)

_PUT_MODEL = f"""
WITH last AS (
    SELECT revision, deleted FROM model_revisions WHERE name = %(name)s
    ORDER BY revision DESC LIMIT 1
)
INSERT INTO model_revisions ({MODEL_COLUMNS})
SELECT %(name)s, COALESCE((SELECT revision FROM last), 0) + 1, %(spec)s::json, %(by)s, %(at)s,
       %(deleted)s, %(declared_in)s
WHERE (COALESCE((SELECT revision FROM last), 0) = %(expect)s
       OR (%(expect)s = 0 AND COALESCE((SELECT deleted FROM last), true)))
  AND NOT (%(deleted)s AND COALESCE((SELECT deleted FROM last), true))
ON CONFLICT (name, revision) DO NOTHING
RETURNING revision
"""
"""A model's next revision, written only when its last one is %(expect)s (or it is absent and
%(expect)s is 0), and never a deletion of a model that is absent: see PostgresStore.put_model."""

_UPSERT_REPLICA = (
    f"INSERT INTO replicas ({REPLICA_COLUMNS})"
    " VALUES (%s, %s, %s, %s, %s, %s::integer[], %s, %s, %s, %s, %s, %s::json, %s::json,"
    " %s::json)"
    " ON CONFLICT (id) DO UPDATE SET model = excluded.model, profile = excluded.profile,"
    " revision = excluded.revision, node = excluded.node, gpus = excluded.gpus,"
    " phase = excluded.phase, reason = excluded.reason, address = excluded.address,"
    " restarts = excluded.restarts, since = excluded.since, spec = excluded.spec,"
    " members = excluded.members, progress = excluded.progress"
)


def _replica_params(r: ReplicaRecord) -> tuple[Any, ...]:
    return (
        r.id,
        r.model,
        r.profile,
        r.revision,
        r.node,
        list(r.gpus),
        r.phase,
        r.reason,
        r.address,
        r.restarts,
        r.since,
        dump_json(r.spec),
        dump_json(list(r.members)),
        dump_json(r.progress),
    )


def _notify(conn: psycopg.Connection[tuple[Any, ...]]) -> None:
    """Tell the fleets listening that replicas or rollouts changed: PostgreSQL delivers it when
    the transaction commits, and not at all when it rolls back (one per transaction however
    many are sent: identical notifications are folded)."""
    conn.execute("SELECT pg_notify(%s, '')", (STATE_CHANNEL,))


def on_this_machine(host: str) -> bool:
    """Whether a connection's host (psycopg's ConnectionInfo.host: a name, an address, or a
    Unix socket's folder) is this machine, where the store does not pipeline."""
    # Measured on 2 shared cores, PostgreSQL 15 on 127.0.0.1, psycopg 3.3.9 (binary),
    # 2026-12-02: a SetContext's store calls in one process took 405-419 us (294-299 us of
    # CPU) pipelined, in 4 round trips, and 340-342 us (213-217 us of CPU) a statement at a
    # time, in 8; through fleets (bench.store_pg's calls, 3 pairs) a SetContext's median was
    # 3.34-3.42 ms pipelined and 2.78-3.08 ms not. A round trip to another host (hundreds of
    # us) costs more than the pipeline's work, so there statements go together.
    return host.startswith("/") or host in ("localhost", "::1") or host.startswith("127.")


def _latest(conn: psycopg.Connection[tuple[Any, ...]], name: str) -> tuple[int, bool]:
    """A model's last revision (0 when it never existed) and whether it is absent now."""
    row = conn.execute(
        "SELECT revision, deleted FROM model_revisions WHERE name = %s"
        " ORDER BY revision DESC LIMIT 1",
        (name,),
    ).fetchone()
    return (0, True) if row is None else (int(row[0]), bool(row[1]))
