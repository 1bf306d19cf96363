"""Throw-away PostgreSQL databases for tests.

The server is LLMGW_TEST_PG_DSN's (a DSN of any database on it, as a role that may create
databases) when that is set. Otherwise the test run starts a server of its own on first use
(tests/support/private_postgres.py: initdb into a folder under /tmp, a free port, trust auth on
127.0.0.1 only), exports its DSN to the run's child processes, and stops it when the run ends;
no server need be running on the machine. Each test gets a database of its own, created here
and dropped after (connections to it are ended first), so tests never see each other's rows.
When no server can be had the test FAILS saying so, unless LLMGW_SKIP_POSTGRES=1 asks to skip:
a store suite that quietly skipped half its cases would prove nothing.
"""

from __future__ import annotations

import atexit
import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import conninfo, sql

from tests.support.private_postgres import NoServer, PrivateServer, discard, start_private_server

DSN_ENV = "LLMGW_TEST_PG_DSN"
BENCH_ENV = "LLMGW_BENCH_PG"
"""bench/'s server (bench/store_pg.py): pointed at the run's server when the run starts one."""
SKIP_ENV = "LLMGW_SKIP_POSTGRES"
PREFIX = "llmgw_test_"

_lock = threading.Lock()
_own: PrivateServer | None = None


def _unreachable(message: str) -> None:
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(message)
    pytest.fail(message)


def admin_dsn() -> str:
    """The DSN databases are created and dropped from: LLMGW_TEST_PG_DSN, or the run's own
    server's `postgres` database, started here the first time it is needed."""
    global _own
    with _lock:
        given = os.environ.get(DSN_ENV)
        if given:
            return given
        try:
            _own = start_private_server()
        except NoServer as why:
            _unreachable(f"no PostgreSQL for the store tests: {why}; or set {SKIP_ENV}=1")
            raise
        atexit.register(discard, _own)
        os.environ[DSN_ENV] = _own.dsn
        os.environ.setdefault(BENCH_ENV, _own.dsn)
        return _own.dsn


def stop_own_server() -> None:
    """Stop the server this run started, if it started one (pytest_sessionfinish)."""
    global _own
    with _lock:
        if _own is not None:
            discard(_own)
            if os.environ.get(DSN_ENV) == _own.dsn:
                del os.environ[DSN_ENV]
            if os.environ.get(BENCH_ENV) == _own.dsn:
                del os.environ[BENCH_ENV]
            _own = None


def dsn_of(dbname: str) -> str:
    """A DSN for one database on the test server (a URL when the server's DSN is one)."""
    base = admin_dsn()
    if base.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(base)
        return urlunsplit(parts._replace(path="/" + dbname))
    return conninfo.make_conninfo(base, dbname=dbname)


def admin() -> psycopg.Connection[tuple[object, ...]]:
    """An autocommit connection to the maintenance database; fails (or skips) the test when
    the server cannot be reached."""
    dsn = admin_dsn()
    try:
        return psycopg.connect(dsn, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        _unreachable(
            f"PostgreSQL is not reachable at {dsn} ({why}): the store tests run against it;"
            f" unset {DSN_ENV} for a server of the run's own, or set {SKIP_ENV}=1 to skip them"
        )
        raise


def terminate(dbname: str) -> int:
    """End every connection to `dbname` but this one's (as a server restart would); how many."""
    with admin() as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (dbname,),
        ).fetchall()
    return len(rows)


def allow_connections(dbname: str, allowed: bool) -> None:
    """Let `dbname` accept new connections or refuse them ("database … is not currently
    accepting connections"): an outage of one database, leaving the server to other users."""
    with admin() as conn:
        conn.execute(
            f"ALTER DATABASE {sql.Identifier(dbname).as_string(conn)}"
            f" ALLOW_CONNECTIONS {'true' if allowed else 'false'}"
        )


@contextmanager
def fresh_database() -> Iterator[tuple[str, str]]:
    """A new, empty database: its (name, DSN); dropped after, its connections ended first."""
    name = PREFIX + uuid.uuid4().hex[:12]
    with admin() as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield name, dsn_of(name)
    finally:
        with admin() as conn:
            conn.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
            # WITH (FORCE) (PostgreSQL 13+) ends the connections still open to it.
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
