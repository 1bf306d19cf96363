"""The SQLite store's calls: what sqlite3 raises turned into store errors, and the scope of a
block of writes.

Every call of the store's groups (sqlite_catalog.py, sqlite_answers.py, sqlite_state.py,
sqlite_traffic.py, and sqlite.py's own) is wrapped by `guarded` and runs on the connection
`SQLiteCalls` holds, which SQLiteStore (sqlite.py) is made of with them.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Concatenate, ParamSpec, TypeVar

from fleet_svc.store.base import StoreDamaged, StoreError, StoreUnavailable
from fleet_svc.store.codec import readable_rows
from fleet_svc.store.migrations import immediate

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S", bound="SQLiteCalls")


def _translated(store: SQLiteCalls, exc: sqlite3.Error) -> StoreError | None:
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


def guarded(
    method: Callable[Concatenate[S, P], R],
) -> Callable[Concatenate[S, P], R]:
    """Raise a store error for what sqlite3 raises, and remember damage (see `probe`)."""

    @functools.wraps(method)
    def call(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
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


class SQLiteCalls:
    """What every call of the SQLite store shares: its connection, where it is (for messages),
    the damage found, and the scope of a block of writes."""

    _conn: sqlite3.Connection
    where: str
    damage: StoreDamaged | None
    """The first damage a call found; `probe` reports it until the store is reopened."""
    _clock: Callable[[], float]
    """Seconds since the epoch, stamped on stored answers."""

    @contextmanager
    def _translating(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            translated = _translated(self, exc)
            if translated is None:
                raise
            raise translated from exc

    @contextmanager
    def atomic(self, *, checked_at_commit: bool = False) -> Iterator[None]:
        """One transaction for the block's writes (Store.atomic): BEGIN IMMEDIATE, so it holds
        the write lock from its start; a block inside another is a savepoint. Every check is
        made at once (a local file: no round trip to save), `checked_at_commit` or not."""
        with self._translating(), immediate(self._conn):
            yield

    def _readable(
        self, rows: Sequence[tuple[Any, ...]], decode: Callable[[str, tuple[Any, ...]], R]
    ) -> list[R]:
        """The rows that decode (codec.readable_rows); damage met is remembered."""
        out, damage = readable_rows(self.where, rows, decode)
        self.damage = self.damage or damage
        return out
