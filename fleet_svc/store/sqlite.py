"""The fleet's store in one SQLite file: the default, so one machine needs no database server.

(Past 500 lines because it is the whole Store interface, one short method of SQL per call, and
the checks a file needs when it opens; rows are decoded in codec.py, the schema is migrations.py.)
"""

from __future__ import annotations

import functools
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

from fleet_svc.store import sqlite_nodes
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
    StoreError,
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
from fleet_svc.store.migrations import check_not_newer, immediate, migrate
from fleet_svc.store.verify import check_all

P = ParamSpec("P")
R = TypeVar("R")

# How long a write waits for another connection's write lock before giving up with
# "database is locked". Writes are single short statements, so waiting seconds means trouble.
BUSY_TIMEOUT_MS = 10_000

_MODEL_COLUMNS = MODEL_COLUMNS
_REPLICA_COLUMNS = REPLICA_COLUMNS
_ROLLOUT_COLUMNS = ROLLOUT_COLUMNS

QUICK_CHECK_LINES = 3
"""How many of `PRAGMA quick_check`'s findings an error message quotes (the first says enough)."""


def _translated(store: SQLiteStore, exc: sqlite3.Error) -> StoreError | None:
    """The store error a sqlite3 error means, None for a programming error (raised as is).

    sqlite3's classes follow SQLite's result codes: OperationalError is SQLITE_BUSY, IOERR,
    FULL, READONLY, CANTOPEN … (the disk or a lock: may pass); a bare DatabaseError is
    SQLITE_CORRUPT or NOTADB (the file is damaged). ProgrammingError (a closed store, another
    thread) and IntegrityError (a constraint) are the caller's mistakes.
    """
    if isinstance(exc, sqlite3.ProgrammingError | sqlite3.IntegrityError):
        return None
    if isinstance(exc, sqlite3.OperationalError):
        return StoreUnavailable(store.where, f"SQLite: {exc}")
    if isinstance(exc, sqlite3.DatabaseError):
        return StoreDamaged(store.where, f"SQLite: {exc}")
    return None


def _guarded(
    method: Callable[Concatenate[SQLiteStore, P], R],
) -> Callable[Concatenate[SQLiteStore, P], R]:
    """Raise a store error for what sqlite3 raises, and remember damage (see `probe`)."""

    @functools.wraps(method)
    def call(self: SQLiteStore, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(self, *args, **kwargs)
        except StoreDamaged as exc:
            self.damage = self.damage or exc
            raise
        except sqlite3.Error as exc:
            translated = _translated(self, exc)
            if translated is None:
                raise
            if isinstance(translated, StoreDamaged):
                self.damage = self.damage or translated
            raise translated from exc

    return call


class SQLiteStore:
    """The Store over one SQLite file (WAL, synchronous=FULL, migrated on open).

    Threading: one SQLiteStore belongs to the thread that opened it (the fleet's asyncio thread;
    every call is a short local transaction, so calling it from the loop is fine). sqlite3's
    same-thread check stays on, so a call from another thread raises ProgrammingError instead
    of racing. Several SQLiteStore objects, in threads or processes, may share one file: writes
    are serialized by SQLite's lock and `put_model`'s check-and-insert is one transaction.

    Revisions: a model's revisions count up from 1 and never restart. Creating a model again
    after its deletion continues the count (deleted at 3, created again as 4), so an etag read
    before the deletion can never match the new model, and history keeps every row. To create
    over a deletion a writer may expect either 0 ("must not exist") or the deletion's revision
    (the latest row it read); both readings of the Store contract are accepted.
    """

    thread_safe = False

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        """Open (creating it and its parent folders when absent) and migrate a store file.

        Opening reads only the header and the schema version; `verify` reads the rest.

        Args:
            path: the database file.
            clock: seconds since the epoch, stamped on stored answers.

        Raises:
            SchemaTooNew: the file was written by a newer fleet; it is left untouched.
            StoreDamaged: the file is not a SQLite database, or is damaged.
            StoreUnavailable: it cannot be opened or migrated (permissions, a full disk, a lock
                held past the busy timeout).
        """
        self.path = Path(path)
        self.where = str(self.path)
        self._clock = clock
        self.damage: StoreDamaged | None = None
        """The first damage a call found; `probe` reports it until the store is reopened."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(self.where, f"cannot create its folder: {exc}") from exc
        if self.path.exists() and not self.path.is_file():
            raise StoreUnavailable(
                self.where,
                "it is a folder (or another non-file), not a database file: name a"
                " file in it, e.g. fleet.db",
            )
        if self.path.is_file() and self.path.stat().st_size == 0:
            # SQLite would take an empty file for a new database and the fleet would serve an
            # empty catalog over replicas still running. A file this store made is never empty
            # (migrating writes the header), so an empty one was truncated or made by hand.
            raise StoreDamaged(
                self.where,
                "the file is empty (0 bytes), so whatever it held is gone; restore it from a"
                " backup, or delete it to start with an empty store",
            )
        _private(self.path)
        with self._translating():
            # isolation_level=None: we issue BEGIN/COMMIT ourselves; every other statement is
            # its own transaction, committed (and synced) before the call returns.
            self._conn = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None
            )
        try:
            with self._translating():
                self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
                # Refuse a newer schema before changing anything (even the journal mode).
                check_not_newer(self._conn, self.where)
                self._configure()
                migrate(self._conn, self.where)
        except BaseException:
            self._conn.close()
            raise

    @contextmanager
    def _translating(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            translated = _translated(self, exc)
            if translated is None:
                raise
            raise translated from exc

    def _configure(self) -> None:
        # WAL: readers do not block the writer, and a commit is one append to the log.
        mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise sqlite3.OperationalError(
                f"could not put {self.path} in WAL mode (got {mode!r}); use a file on a local disk"
            )
        # FULL, not WAL's usual NORMAL: NORMAL may lose the last commits on power loss. The fleet
        # answers "accepted" only after a write returns, and an accepted write must survive
        # kill -9 and power loss, so each commit waits for the log to reach the disk.
        self._conn.execute("PRAGMA synchronous = FULL")
        # No table references another today; on, so any later migration's references are kept.
        self._conn.execute("PRAGMA foreign_keys = ON")

    def close(self) -> None:
        """Release the database (a second call does nothing)."""
        self._conn.close()

    @_guarded
    def probe(self) -> None:
        """Raise the damage a call found since opening; else read the schema version (a newer
        fleet may have migrated the file since).

        Raises:
            StoreDamaged, StoreUnavailable, SchemaTooNew.
        """
        if self.damage is not None:
            raise self.damage
        check_not_newer(self._conn, self.where)

    @_guarded
    def verify(self) -> None:
        """`PRAGMA quick_check`, then every row decoded as the fleet reads it.

        quick_check walks every page of every table and index, checking the b-trees' structure
        (it skips only what integrity_check adds: index contents against their tables), in time
        linear in the file's size: a fleet's file of a few MB takes milliseconds.
        See https://www.sqlite.org/pragma.html#pragma_quick_check.

        Raises:
            StoreDamaged: naming what quick_check found, or the first row that does not decode.
        """
        found = [str(r[0]) for r in self._conn.execute("PRAGMA quick_check").fetchall()]
        if found != ["ok"]:
            # Findings may span lines and start with a "*** in database main ***" banner.
            lines = [
                line.strip()
                for finding in found
                for line in finding.splitlines()
                if line.strip() and not line.startswith("***")
            ]
            raise StoreDamaged(
                self.where,
                "PRAGMA quick_check found damage: " + "; ".join(lines[:QUICK_CHECK_LINES]),
            )
        models = [
            model_of_row(self.where, row)
            for row in self._conn.execute(f"SELECT {_MODEL_COLUMNS} FROM model_revisions")
        ]
        replicas = [
            replica_of_row(self.where, row)
            for row in self._conn.execute(f"SELECT {_REPLICA_COLUMNS} FROM replicas")
        ]
        rollouts = [
            rollout_of_row(self.where, row)
            for row in self._conn.execute(f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts")
        ]
        for row in self._conn.execute(f"SELECT {EVENT_COLUMNS} FROM rollout_events"):
            event_of_row(self.where, row)
        check_all(self.where, models, replicas, rollouts)

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # The catalog.

    @_guarded
    def get_model(self, name: str) -> ModelRecord | None:
        """The model's latest revision, None when absent or deleted."""
        row = self._conn.execute(
            f"SELECT {_MODEL_COLUMNS} FROM model_revisions WHERE name = ?"
            " ORDER BY revision DESC LIMIT 1",
            (name,),
        ).fetchone()
        if row is None:
            return None
        record = model_of_row(self.where, row)
        return None if record.deleted else record

    def model_to_change(
        self, name: str, states: Sequence[str]
    ) -> tuple[ModelRecord | None, list[RolloutRecord]]:
        """The model's latest revision and its rollouts in `states` (Store.model_to_change)."""
        return self.get_model(name), self.list_rollouts(name, states=states)

    @_guarded
    def list_models(self) -> list[ModelRecord]:
        """Every current (latest, not deleted) model, by name."""
        rows = self._conn.execute(
            f"SELECT {_MODEL_COLUMNS} FROM model_revisions AS m"
            " WHERE revision = (SELECT MAX(revision) FROM model_revisions WHERE name = m.name)"
            " AND deleted = 0 ORDER BY name"
        ).fetchall()
        return [model_of_row(self.where, row) for row in rows]

    @_guarded
    def put_model(self, record: ModelRecord, *, expect_revision: int) -> ModelRecord:
        """Write `record` as the model's next revision if its latest one is `expect_revision`.

        The written revision is one past the model's last row, deletions included (see the class
        docstring). A model that never existed is at 0; a deleted one is at its deletion's
        revision, and 0 is accepted for it too. `record.revision` is ignored; every other field
        is stored as given.

        Args:
            record: the new state; `deleted=True` records a deletion.
            expect_revision: the revision the caller read (0 to create).

        Returns:
            `record` with the revision it was written as.

        Raises:
            StaleRevision: the model's latest revision is not `expect_revision` (`current` is the
                latest revision, a deletion's included; 0 when the model never existed).
            ValueError: a deletion of a model that is absent or deleted (nothing to delete).
        """
        spec = dump_json(record.spec)
        # Check and insert under one write lock: two writers holding the same etag cannot both
        # pass the check, the second sees the first's row and gets StaleRevision.
        with immediate(self._conn):
            row = self._conn.execute(
                "SELECT revision, deleted FROM model_revisions WHERE name = ?"
                " ORDER BY revision DESC LIMIT 1",
                (record.name,),
            ).fetchone()
            last = 0 if row is None else int(row[0])
            absent = row is None or bool(row[1])
            if expect_revision != last and not (absent and expect_revision == 0):
                raise StaleRevision(record.name, expect_revision, last)
            if record.deleted and absent:
                raise ValueError(f"model {record.name!r} does not exist, so it cannot be deleted")
            written = replace(record, revision=last + 1)
            self._conn.execute(
                f"INSERT INTO model_revisions ({_MODEL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    written.name,
                    written.revision,
                    spec,
                    written.updated_by,
                    written.updated_at,
                    int(written.deleted),
                    written.declared_in,
                ),
            )
        return written

    @_guarded
    def model_history(self, name: str) -> list[ModelRecord]:
        """Every revision of a model, oldest first (deletions included)."""
        rows = self._conn.execute(
            f"SELECT {_MODEL_COLUMNS} FROM model_revisions WHERE name = ? ORDER BY revision",
            (name,),
        ).fetchall()
        return [model_of_row(self.where, row) for row in rows]

    # Idempotency.

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """One transaction for the block's writes (Store.atomic): BEGIN IMMEDIATE, so it holds
        the write lock from its start; a block inside another is a savepoint."""
        with self._translating(), immediate(self._conn):
            yield

    @_guarded
    def get_answer(self, request_id: str) -> AnswerRecord | None:
        """The answer stored for a request id, None when there is none."""
        row = self._conn.execute(
            "SELECT method, answer, fingerprint, created_at FROM answers WHERE request_id = ?",
            (request_id,),
        ).fetchone()
        if row is None:
            return None
        return AnswerRecord(str(row[0]), bytes(row[1]), str(row[2]), float(row[3]))

    @_guarded
    def claim_answer(self, request_id: str, method: str, fingerprint: str) -> bool:
        """Reserve a request id (an empty answer until put_answer fills it); False when taken."""
        cur = self._conn.execute(
            "INSERT OR IGNORE INTO answers (request_id, method, answer, created_at, fingerprint)"
            " VALUES (?, ?, X'', ?, ?)",
            (request_id, method, self._clock(), fingerprint),
        )
        return cur.rowcount == 1

    @_guarded
    def put_answer(
        self, request_id: str, method: str, answer: bytes, *, fingerprint: str = ""
    ) -> None:
        """Keep the answer to a request id: fill its claimed (empty) row of the same method and
        fingerprint; any other answer already there is kept."""
        # DO NOTHING unless claimed: a retry racing the first attempt must not replace the
        # answer already given.
        self._conn.execute(
            "INSERT INTO answers (request_id, method, answer, created_at, fingerprint)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (request_id) DO UPDATE"
            " SET answer = excluded.answer WHERE length(answers.answer) = 0"
            " AND answers.method = excluded.method AND answers.fingerprint = excluded.fingerprint",
            (request_id, method, answer, self._clock(), fingerprint),
        )

    @_guarded
    def prune_answers(self, before: float) -> int:
        """Forget answers stored before `before`; how many were."""
        cur = self._conn.execute("DELETE FROM answers WHERE created_at < ?", (before,))
        return cur.rowcount

    @_guarded
    def forget_answer(self, request_id: str) -> None:
        """Forget one request id's answer."""
        self._conn.execute("DELETE FROM answers WHERE request_id = ?", (request_id,))

    # Replicas.

    @_guarded
    def list_replicas(self) -> list[ReplicaRecord]:
        """Every replica record, by id."""
        rows = self._conn.execute(f"SELECT {_REPLICA_COLUMNS} FROM replicas ORDER BY id").fetchall()
        return [replica_of_row(self.where, row) for row in rows]

    @_guarded
    def write_replicas(self, puts: Sequence[ReplicaRecord], deletes: Sequence[str]) -> None:
        """Insert or replace `puts` and forget `deletes` in one transaction: one sync to disk
        for a whole tick's changes instead of one per replica."""
        if not puts and not deletes:
            return
        with immediate(self._conn):
            for record in puts:
                self.put_replica(record)
            for replica_id in deletes:
                self.delete_replica(replica_id)

    @_guarded
    def put_replica(self, record: ReplicaRecord) -> None:
        """Insert a replica record, or replace every field of the one with the same id."""
        self._conn.execute(
            f"INSERT INTO replicas ({_REPLICA_COLUMNS})"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET model = excluded.model,"
            " profile = excluded.profile, revision = excluded.revision, node = excluded.node,"
            " gpus = excluded.gpus, phase = excluded.phase, reason = excluded.reason,"
            " address = excluded.address, restarts = excluded.restarts, since = excluded.since,"
            " spec = excluded.spec, members = excluded.members, progress = excluded.progress",
            (
                record.id,
                record.model,
                record.profile,
                record.revision,
                record.node,
                dump_json(list(record.gpus)),
                record.phase,
                record.reason,
                record.address,
                record.restarts,
                record.since,
                dump_json(record.spec),
                dump_json(list(record.members)),
                dump_json(record.progress),
            ),
        )

    @_guarded
    def delete_replica(self, replica_id: str) -> None:
        """Forget a replica (deleting an unknown id does nothing)."""
        self._conn.execute("DELETE FROM replicas WHERE id = ?", (replica_id,))

    # Agents' streams (fleet_svc/store/sqlite_nodes.py).

    @_guarded
    def put_node_reports(self, reports: Sequence[NodeReport]) -> None:
        """Upsert node reports at the next seqs, in one transaction."""
        if reports:
            with immediate(self._conn):
                sqlite_nodes.put_reports(self._conn, reports)

    @_guarded
    def list_node_reports(self, after_seq: int = 0) -> list[NodeReport]:
        """Node reports written after `after_seq`, by seq."""
        return sqlite_nodes.list_reports(self._conn, after_seq)

    @_guarded
    def put_desired(self, records: Sequence[DesiredRecord]) -> None:
        """Upsert desired sets at the next seqs, in one transaction."""
        if records:
            with immediate(self._conn):
                sqlite_nodes.put_desired(self._conn, records)

    @_guarded
    def list_desired(self, after_seq: int = 0) -> list[DesiredRecord]:
        """Desired sets written after `after_seq`, by seq."""
        return sqlite_nodes.list_desired(self._conn, after_seq)

    # Named values.

    @_guarded
    def get_value(self, key: str) -> str | None:
        """A stored value, None when the key was never set."""
        row = self._conn.execute("SELECT value FROM named_values WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    @_guarded
    def put_value(self, key: str, value: str) -> None:
        """Store a value, replacing the key's previous one."""
        self._conn.execute(
            "INSERT INTO named_values (key, value) VALUES (?, ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    # Rollouts.

    @_guarded
    def put_rollout(self, record: RolloutRecord) -> None:
        """Insert a rollout, or replace its state (created_at is kept)."""
        self._conn.execute(
            "INSERT INTO rollouts (id, model, state, spec, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET state = excluded.state,"
            " spec = excluded.spec, updated_at = excluded.updated_at",
            (
                record.id,
                record.model,
                record.state,
                dump_json(record.spec),
                record.created_at,
                record.updated_at,
            ),
        )

    @_guarded
    def get_rollout(self, rollout_id: str) -> RolloutRecord | None:
        """A rollout, None when unknown."""
        row = self._conn.execute(
            f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE id = ?", (rollout_id,)
        ).fetchone()
        return None if row is None else rollout_of_row(self.where, row)

    @_guarded
    def list_rollouts(self, model: str = "", *, states: Sequence[str] = ()) -> list[RolloutRecord]:
        """Rollouts of a model (every model when ""), newest first; only those in `states`
        when given."""
        where, params = rollout_filter(model, states, "?")
        rows = self._conn.execute(
            f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts{where} ORDER BY created_at DESC, id DESC",
            params,
        ).fetchall()
        return self._readable(rows, rollout_of_row)

    # Requests of rollouts.

    @_guarded
    def put_rollout_request(self, request: RolloutRequest) -> None:
        """Record a request (a repeated id is ignored)."""
        self._conn.execute(
            "INSERT OR IGNORE INTO rollout_requests"
            " (id, rollout_id, kind, reason, requested_by, created_at) VALUES (?, ?, ?, ?, ?, ?)",
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
        rows = self._conn.execute(
            "SELECT id, rollout_id, kind, reason, requested_by, created_at FROM rollout_requests"
            " ORDER BY created_at, id"
        ).fetchall()
        return [request_of_row(row) for row in rows]

    @_guarded
    def delete_rollout_requests(self, ids: Sequence[str]) -> None:
        """Forget requests the controller carried out."""
        self._conn.executemany("DELETE FROM rollout_requests WHERE id = ?", [(i,) for i in ids])

    @_guarded
    def append_event(self, rollout_id: str, at: float, event: dict[str, Any]) -> int:
        """Append an event; the seq is the rollout's last plus one, taken under the write lock."""
        with immediate(self._conn):
            row = self._conn.execute(
                "SELECT COALESCE(MAX(seq), 0) FROM rollout_events WHERE rollout_id = ?",
                (rollout_id,),
            ).fetchone()
            seq = int(row[0]) + 1
            self._conn.execute(
                "INSERT INTO rollout_events (rollout_id, seq, at, event) VALUES (?, ?, ?, ?)",
                (rollout_id, seq, at, dump_json(event)),
            )
        return seq

    @_guarded
    def list_events(self, rollout_id: str, after_seq: int = 0) -> list[EventRecord]:
        """A rollout's events after `after_seq`, in order."""
        rows = self._conn.execute(
            "SELECT rollout_id, seq, at, event FROM rollout_events"
            " WHERE rollout_id = ? AND seq > ? ORDER BY seq",
            (rollout_id, after_seq),
        ).fetchall()
        return self._readable(rows, event_of_row)

    # Traffic reports.

    @_guarded
    def put_traffic(self, records: Sequence[TrafficRecord], *, prune_before_ms: int) -> bool:
        """Keep one gateway's report of one interval once (False: it was kept before)."""
        if not records:
            return True
        first = records[0]
        with immediate(self._conn):
            self._conn.execute(
                "DELETE FROM traffic_reports WHERE interval_start_ms < ?", (prune_before_ms,)
            )
            seen = self._conn.execute(
                "SELECT 1 FROM traffic_reports WHERE gateway = ? AND interval_start_ms = ? LIMIT 1",
                (first.gateway, first.interval_start_ms),
            ).fetchone()
            if seen is not None:
                return False
            self._conn.executemany(
                f"INSERT INTO traffic_reports ({TRAFFIC_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [traffic_row(r) for r in records],
            )
        return True

    @_guarded
    def list_traffic(self, model: str, since_ms: int) -> list[TrafficRecord]:
        """The model's traffic records of intervals that began at or after `since_ms`."""
        rows = self._conn.execute(
            f"SELECT {TRAFFIC_COLUMNS} FROM traffic_reports"
            " WHERE model = ? AND interval_start_ms >= ? ORDER BY interval_start_ms, gateway",
            (model, since_ms),
        ).fetchall()
        return self._readable(rows, traffic_of_row)

    def _readable(
        self, rows: Sequence[tuple[Any, ...]], decode: Callable[[str, tuple[Any, ...]], R]
    ) -> list[R]:
        """The rows that decode (codec.readable_rows); damage met is remembered."""
        out, damage = readable_rows(self.where, rows, decode)
        self.damage = self.damage or damage
        return out


def _private(path: Path) -> None:
    """Make the database file (created empty-free by SQLite when missing: see below) and its
    journal files mode 0600: the catalog holds every model's sources and arguments. SQLite
    gives the -wal and -shm files the database file's own mode (os_unix.c,
    findCreateFileMode), so a database created 0600 keeps its journals 0600 too."""
    if not path.exists():
        # Created here, 0600, then SQLite takes the empty file as a new database; the
        # "empty file" check above ran before this, on a file that was not there.
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    for suffix in ("", "-wal", "-shm", "-journal"):
        file = path.with_name(path.name + suffix)
        try:
            if file.is_file() and (file.stat().st_mode & 0o777) != 0o600:
                os.chmod(file, 0o600)
        except OSError:
            continue
