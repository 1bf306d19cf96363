"""The fleet's store in one SQLite file: the default, so one machine needs no database server.

Its calls are grouped by the rows they touch, each group a class SQLiteStore is made of
(sqlite_catalog.py, sqlite_answers.py, sqlite_state.py, sqlite_traffic.py; the agents' streams
and named values are here); sqlite_calls.py turns sqlite3's errors into store errors. Rows are
decoded in codec.py, the schema is migrations.py.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

from fleet_svc.store import sqlite_nodes
from fleet_svc.store.base import (
    DesiredRecord,
    ModelRecord,
    NodeBeat,
    NodeReport,
    RolloutRecord,
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
from fleet_svc.store.migrations import check_not_newer, immediate, migrate
from fleet_svc.store.sqlite_answers import AnswerCalls
from fleet_svc.store.sqlite_calls import guarded
from fleet_svc.store.sqlite_catalog import CatalogCalls
from fleet_svc.store.sqlite_state import StateCalls
from fleet_svc.store.sqlite_traffic import TrafficCalls
from fleet_svc.store.verify import check_all

# How long a write waits for another connection's write lock before giving up with
# "database is locked". Writes are single short statements, so waiting seconds means trouble.
BUSY_TIMEOUT_MS = 10_000

QUICK_CHECK_LINES = 3
"""How many of `PRAGMA quick_check`'s findings an error message quotes (the first says enough)."""


class SQLiteStore(CatalogCalls, AnswerCalls, StateCalls, TrafficCalls):
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

    @guarded
    def probe(self) -> None:
        """Raise the damage a call found since opening; else read the schema version (a newer
        fleet may have migrated the file since).

        Raises:
            StoreDamaged, StoreUnavailable, SchemaTooNew.
        """
        if self.damage is not None:
            raise self.damage
        check_not_newer(self._conn, self.where)

    @guarded
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
            for row in self._conn.execute(f"SELECT {MODEL_COLUMNS} FROM model_revisions")
        ]
        replicas = [
            replica_of_row(self.where, row)
            for row in self._conn.execute(f"SELECT {REPLICA_COLUMNS} FROM replicas")
        ]
        rollouts = [
            rollout_of_row(self.where, row)
            for row in self._conn.execute(f"SELECT {ROLLOUT_COLUMNS} FROM rollouts")
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

    # The catalog and its rollouts.

    def model_to_change(
        self, name: str, states: Sequence[str]
    ) -> tuple[ModelRecord | None, list[RolloutRecord]]:
        """The model's latest revision and its rollouts in `states` (Store.model_to_change)."""
        return self.get_model(name), self.list_rollouts(name, states=states)

    # Agents' streams (fleet_svc/store/sqlite_nodes.py).

    @guarded
    def put_node_reports(self, reports: Sequence[NodeReport], beat: NodeBeat | None = None) -> None:
        """Upsert node reports at the next seqs and the holder's beat, in one transaction."""
        if reports or beat is not None:
            with immediate(self._conn):
                sqlite_nodes.put_reports(self._conn, reports)
                if beat is not None:
                    sqlite_nodes.put_beat(self._conn, beat)

    @guarded
    def list_node_beats(self, after_seq: int = 0) -> list[NodeBeat]:
        """Holders' beats written after `after_seq`, by seq."""
        return sqlite_nodes.list_beats(self._conn, after_seq)

    @guarded
    def list_node_reports(self, after_seq: int = 0) -> list[NodeReport]:
        """Node reports written after `after_seq`, by seq."""
        return sqlite_nodes.list_reports(self._conn, after_seq)

    @guarded
    def put_desired(self, records: Sequence[DesiredRecord]) -> None:
        """Upsert desired sets at the next seqs, in one transaction."""
        if records:
            with immediate(self._conn):
                sqlite_nodes.put_desired(self._conn, records)

    @guarded
    def list_desired(self, after_seq: int = 0) -> list[DesiredRecord]:
        """Desired sets written after `after_seq`, by seq."""
        return sqlite_nodes.list_desired(self._conn, after_seq)

    # Named values.

    @guarded
    def get_value(self, key: str) -> str | None:
        """A stored value, None when the key was never set."""
        row = self._conn.execute("SELECT value FROM named_values WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    @guarded
    def put_value(self, key: str, value: str) -> None:
        """Store a value, replacing the key's previous one."""
        self._conn.execute(
            "INSERT INTO named_values (key, value) VALUES (?, ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )


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
