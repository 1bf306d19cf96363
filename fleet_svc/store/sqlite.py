"""The fleet's store in one SQLite file: the default, so one machine needs no database server."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

from fleet_svc.store.base import (
    EventRecord,
    ModelRecord,
    ReplicaRecord,
    RolloutRecord,
    StaleRevision,
    Store,
)
from fleet_svc.store.migrations import check_not_newer, immediate, migrate

# How long a write waits for another connection's write lock before giving up with
# "database is locked". Writes are single short statements, so waiting seconds means trouble.
BUSY_TIMEOUT_MS = 10_000

_MODEL_COLUMNS = "name, revision, spec, updated_by, updated_at, deleted, declared_in"
_REPLICA_COLUMNS = (
    "id, model, profile, revision, node, gpus, phase, reason, address, restarts, since, spec"
)


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

    def __init__(self, path: str | Path, *, clock: Callable[[], float] = time.time) -> None:
        """Open (creating it and its parent folders when absent) and migrate a store file.

        Args:
            path: the database file.
            clock: seconds since the epoch, stamped on stored answers.

        Raises:
            SchemaTooNew: the file was written by a newer fleet; it is left untouched.
            sqlite3.Error: the file is not a database, or cannot be opened or migrated.
        """
        self.path = Path(path)
        self._clock = clock
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we issue BEGIN/COMMIT ourselves; every other statement is its
        # own transaction, committed (and synced) before the call returns.
        self._conn = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None
        )
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            # Refuse a newer schema before changing anything (even the journal mode) in the file.
            check_not_newer(self._conn, str(self.path))
            self._configure()
            migrate(self._conn, str(self.path))
        except BaseException:
            self._conn.close()
            raise

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

    def get_model(self, name: str) -> ModelRecord | None:
        """The model's latest revision, None when absent or deleted."""
        row = self._conn.execute(
            f"SELECT {_MODEL_COLUMNS} FROM model_revisions WHERE name = ?"
            " ORDER BY revision DESC LIMIT 1",
            (name,),
        ).fetchone()
        if row is None:
            return None
        record = _model_from_row(row)
        return None if record.deleted else record

    def list_models(self) -> list[ModelRecord]:
        """Every current (latest, not deleted) model, by name."""
        rows = self._conn.execute(
            f"SELECT {_MODEL_COLUMNS} FROM model_revisions AS m"
            " WHERE revision = (SELECT MAX(revision) FROM model_revisions WHERE name = m.name)"
            " AND deleted = 0 ORDER BY name"
        ).fetchall()
        return [_model_from_row(row) for row in rows]

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
        spec = _dump_json(record.spec)
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

    def model_history(self, name: str) -> list[ModelRecord]:
        """Every revision of a model, oldest first (deletions included)."""
        rows = self._conn.execute(
            f"SELECT {_MODEL_COLUMNS} FROM model_revisions WHERE name = ? ORDER BY revision",
            (name,),
        ).fetchall()
        return [_model_from_row(row) for row in rows]

    # Idempotency.

    def get_answer(self, request_id: str) -> tuple[str, bytes] | None:
        """The (method, serialized answer) stored for a request id, None when there is none."""
        row = self._conn.execute(
            "SELECT method, answer FROM answers WHERE request_id = ?", (request_id,)
        ).fetchone()
        return None if row is None else (str(row[0]), bytes(row[1]))

    def put_answer(self, request_id: str, method: str, answer: bytes) -> None:
        """Keep the answer to a request id; a later answer to the same id is ignored."""
        # OR IGNORE: a retry racing the first attempt must not replace the answer already given.
        self._conn.execute(
            "INSERT OR IGNORE INTO answers (request_id, method, answer, created_at)"
            " VALUES (?, ?, ?, ?)",
            (request_id, method, answer, self._clock()),
        )

    # Replicas.

    def list_replicas(self) -> list[ReplicaRecord]:
        """Every replica record, by id."""
        rows = self._conn.execute(f"SELECT {_REPLICA_COLUMNS} FROM replicas ORDER BY id").fetchall()
        return [_replica_from_row(row) for row in rows]

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

    def put_replica(self, record: ReplicaRecord) -> None:
        """Insert a replica record, or replace every field of the one with the same id."""
        self._conn.execute(
            f"INSERT INTO replicas ({_REPLICA_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET model = excluded.model,"
            " profile = excluded.profile, revision = excluded.revision, node = excluded.node,"
            " gpus = excluded.gpus, phase = excluded.phase, reason = excluded.reason,"
            " address = excluded.address, restarts = excluded.restarts, since = excluded.since,"
            " spec = excluded.spec",
            (
                record.id,
                record.model,
                record.profile,
                record.revision,
                record.node,
                _dump_json(list(record.gpus)),
                record.phase,
                record.reason,
                record.address,
                record.restarts,
                record.since,
                _dump_json(record.spec),
            ),
        )

    def delete_replica(self, replica_id: str) -> None:
        """Forget a replica (deleting an unknown id does nothing)."""
        self._conn.execute("DELETE FROM replicas WHERE id = ?", (replica_id,))

    # Named values.

    def get_value(self, key: str) -> str | None:
        """A stored value, None when the key was never set."""
        row = self._conn.execute("SELECT value FROM named_values WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def put_value(self, key: str, value: str) -> None:
        """Store a value, replacing the key's previous one."""
        self._conn.execute(
            "INSERT INTO named_values (key, value) VALUES (?, ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    # Rollouts.

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
                _dump_json(record.spec),
                record.created_at,
                record.updated_at,
            ),
        )

    def get_rollout(self, rollout_id: str) -> RolloutRecord | None:
        """A rollout, None when unknown."""
        row = self._conn.execute(
            f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE id = ?", (rollout_id,)
        ).fetchone()
        return None if row is None else _rollout_from_row(row)

    def list_rollouts(self, model: str = "") -> list[RolloutRecord]:
        """Rollouts of a model (every model when ""), newest first."""
        if model:
            rows = self._conn.execute(
                f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE model = ?"
                " ORDER BY created_at DESC, id DESC",
                (model,),
            ).fetchall()
        else:
            rows = self._conn.execute(
                f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts ORDER BY created_at DESC, id DESC"
            ).fetchall()
        return [_rollout_from_row(row) for row in rows]

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
                (rollout_id, seq, at, _dump_json(event)),
            )
        return seq

    def list_events(self, rollout_id: str, after_seq: int = 0) -> list[EventRecord]:
        """A rollout's events after `after_seq`, in order."""
        rows = self._conn.execute(
            "SELECT rollout_id, seq, at, event FROM rollout_events"
            " WHERE rollout_id = ? AND seq > ? ORDER BY seq",
            (rollout_id, after_seq),
        ).fetchall()
        return [EventRecord(str(r[0]), int(r[1]), float(r[2]), json.loads(r[3])) for r in rows]


_ROLLOUT_COLUMNS = "id, model, state, spec, created_at, updated_at"


def _rollout_from_row(row: tuple[Any, ...]) -> RolloutRecord:
    return RolloutRecord(
        id=str(row[0]),
        model=str(row[1]),
        state=str(row[2]),
        spec=json.loads(row[3]),
        created_at=float(row[4]),
        updated_at=float(row[5]),
    )


def open_store(url: str) -> Store:
    """Open the store a URL names.

    Args:
        url: `sqlite:///abs/path.db` (absolute), `sqlite://relative.db` (relative to the working
            folder), or a plain file path.

    Returns:
        The opened store.

    Raises:
        ValueError: the URL names no file, or a database this build cannot open (PostgreSQL).
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        path = url
    elif scheme == "sqlite":
        path = rest
    elif scheme in ("postgresql", "postgres") or scheme.startswith("postgresql+"):
        raise ValueError(
            "the PostgreSQL store is not built yet; give a SQLite file (sqlite:///abs/path.db"
            " or a path) instead"
        )
    else:
        raise ValueError(
            f"unknown store URL scheme {scheme!r}; give sqlite:///abs/path.db,"
            " sqlite://relative.db or a file path"
        )
    if not path:
        raise ValueError(f"store URL {url!r} names no file; give sqlite:///abs/path.db or a path")
    return SQLiteStore(path)


def _dump_json(value: Any) -> str:
    # allow_nan=False: NaN is not JSON, and a spec that cannot be read back must fail at write.
    return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)


def _model_from_row(row: tuple[Any, ...]) -> ModelRecord:
    name, revision, spec, updated_by, updated_at, deleted, declared_in = row
    return ModelRecord(
        name=name,
        revision=int(revision),
        spec=json.loads(spec),
        updated_by=updated_by,
        updated_at=float(updated_at),
        deleted=bool(deleted),
        declared_in=declared_in,
    )


def _replica_from_row(row: tuple[Any, ...]) -> ReplicaRecord:
    (id_, model, profile, revision, node, gpus, phase, reason, address, restarts, since, spec) = row
    return ReplicaRecord(
        id=id_,
        model=model,
        profile=profile,
        revision=int(revision),
        node=node,
        gpus=tuple(int(g) for g in json.loads(gpus)),
        phase=phase,
        reason=reason,
        address=address,
        restarts=int(restarts),
        since=float(since),
        spec=json.loads(spec),
    )
