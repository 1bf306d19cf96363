"""The PostgreSQL store's connections: a checked pool, and failing fast while the server is down.

Each call takes a pooled connection checked just before use, so one the server closed (a
restart, pg_terminate_backend) is replaced, not used; while no connection can be had, calls
fail at once with StoreUnavailable for FAIL_FAST_S, so the fleet's event loop is not held
waiting for connect timeouts one call after another.
"""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg_pool
import structlog

from fleet_svc.store.base import StoreUnavailable
from fleet_svc.store.postgres_batch import BatchingConnection

log = structlog.get_logger(__name__)

CONNECT_TIMEOUT_S = 3
"""libpq's connect_timeout (whole seconds; libpq treats under 2 as 2)."""
CALL_TIMEOUT_S = 3.0
"""How long a call waits for a pooled connection before StoreUnavailable."""
STATEMENT_TIMEOUT_MS = 10_000
"""A statement (a lock wait included) taking longer is cancelled: seconds mean trouble."""
FAIL_FAST_S = 5.0
"""After a failed attempt to reach the server, calls fail at once for this long (or until the
health probe, which always tries, reaches it again). Longer than a probe's period plus its
worst wait (CALL_TIMEOUT_S), so while the server is down the probe keeps the window open and
the event loop's own calls never wait for a connection."""
POOL_MAX = 8
"""Connections per fleet: its event loop, the health probe's and the lease's threads, the
controller's one thread and the API's (fleet_svc/store_calls.py, STORE_THREADS), so the loop's
own calls never wait for a connection those threads hold."""
RECONNECT_CHAIN_S = 2.0
"""psycopg_pool's reconnect_timeout: how long one chain of connection attempts lasts. The pool
doubles its wait after each failed attempt of a chain (1, 2, 4 … s, psycopg_pool's
AttemptWithBackoff), so a long chain would follow a server back minutes late; a short one gives
up and the next call that needs a connection starts a fresh chain at once."""


class NoConnection(Exception):
    """No connection to the server could be had (it refuses, is down, or the pool is spent)."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


class Link:
    """A pool of checked connections to one database, and whether the server is down now.

    Safe to use from any thread.
    """

    def __init__(self, dsn: str, where: str, kwargs: dict[str, Any]) -> None:
        """Open the pool (its first connection made before this returns).

        Raises:
            StoreUnavailable: no connection within CALL_TIMEOUT_S + CONNECT_TIMEOUT_S.
        """
        self.where = where
        self._dsn, self._kwargs = dsn, kwargs
        self._lock = threading.Lock()
        self._pinned = threading.local()
        self._down_until = 0.0
        self._last_down: StoreUnavailable | None = None
        self._pool: psycopg_pool.ConnectionPool[BatchingConnection] = psycopg_pool.ConnectionPool(
            dsn,
            connection_class=BatchingConnection,
            kwargs=kwargs,
            min_size=1,
            max_size=POOL_MAX,
            timeout=CALL_TIMEOUT_S,
            reconnect_timeout=RECONNECT_CHAIN_S,
            name="fleet-store",
            open=False,
        )
        try:
            self._pool.open(wait=True, timeout=CALL_TIMEOUT_S + CONNECT_TIMEOUT_S)
        except psycopg_pool.PoolTimeout as exc:
            self._pool.close()
            raise StoreUnavailable(where, f"the connection pool did not open: {exc}") from exc

    def close(self) -> None:
        """Close the pool (a second call does nothing)."""
        self._pool.close()

    def dedicated(self) -> psycopg.Connection[tuple[Any, ...]]:
        """A connection of its own, outside the pool (a listener holds one for as long as it
        listens); the caller closes it.

        Raises:
            psycopg.OperationalError: it cannot be made.
        """
        return psycopg.connect(self._dsn, **self._kwargs)

    def fail_fast(self) -> None:
        with self._lock:
            if self._last_down is not None and time.monotonic() < self._down_until:
                raise self._last_down

    def down(self, problem: str) -> StoreUnavailable:
        down = StoreUnavailable(self.where, problem)
        with self._lock:
            if self._last_down is None or self._down_until == 0.0:
                log.warning("store_unreachable", store=self.where, problem=problem)
            self._last_down = down
            self._down_until = time.monotonic() + FAIL_FAST_S
        return down

    @contextmanager
    def connection(self) -> Iterator[BatchingConnection]:
        """A pooled connection that answered a check just now; returned to the pool after.

        The check costs no round trip when it can: an idle connection has nothing to read, so a
        socket that is readable holds the server's goodbye (a FATAL admin_shutdown, then end of
        file) or some stray message, and only then is a real check (an empty query) run. A
        server that vanished without closing its side is found by the call's own statement.

        The check is ours, not the pool's `check=` callback: after a failed check that one
        sleeps with backoff (1, 2, 4 … s) before trying the next connection, so after a server
        restart cut every pooled connection a call waited seconds. Here a broken connection is
        handed back (the pool discards it and opens a replacement) and the next one is tried
        at once, until CALL_TIMEOUT_S.
        """
        pinned = self.pinned()
        if pinned is not None:
            yield pinned  # inside the store's atomic block: its transaction's connection
            return
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while True:
            try:
                conn = self._pool.getconn(timeout=max(deadline - time.monotonic(), 0.001))
            except psycopg_pool.PoolClosed:
                raise
            except psycopg_pool.PoolTimeout as exc:
                raise NoConnection(self.why_no_connection()) from exc
            try:
                if not _quiet(conn):
                    psycopg_pool.ConnectionPool.check_connection(conn)
                break
            except psycopg.Error as exc:
                self._pool.putconn(conn)
                if time.monotonic() >= deadline:
                    raise NoConnection(first_line(exc)) from exc
        try:
            yield conn
        finally:
            self._pool.putconn(conn)

    def pinned(self) -> BatchingConnection | None:
        """The connection pinned to this thread by `pin` (None when none is)."""
        conn: BatchingConnection | None = getattr(self._pinned, "conn", None)
        return conn

    @contextmanager
    def pin(self, conn: BatchingConnection) -> Iterator[None]:
        """Lend `conn` to every `connection()` of this thread until the block ends (one
        transaction over several store calls)."""
        self._pinned.conn = conn
        try:
            yield
        finally:
            self._pinned.conn = None

    def why_no_connection(self) -> str:
        """Why the pool lent no connection in time: the server's reason, from one direct
        attempt (the pool keeps its own errors to its log), or a busy pool."""
        try:
            psycopg.connect(self._dsn, **self._kwargs).close()
        except psycopg.Error as exc:
            return first_line(exc)
        return f"no pooled connection within {CALL_TIMEOUT_S:g} s (all {POOL_MAX} busy)"

    def reached(self) -> None:
        with self._lock:
            if self._last_down is not None:
                log.info("store_reached_again", store=self.where)
            self._last_down, self._down_until = None, 0.0


def _quiet(conn: psycopg.Connection[tuple[Any, ...]]) -> bool:
    """Whether an idle connection is open and has nothing waiting to be read (no round trip)."""
    if conn.closed or conn.broken:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
