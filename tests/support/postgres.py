"""Throw-away PostgreSQL databases for tests, on the server at 127.0.0.1:5432 (trust auth).

Each test gets a database of its own, created here and dropped after (connections to it are
ended first), so tests never see each other's rows and the server is left as found. When the
server is not reachable the test FAILS saying so, unless LLMGW_SKIP_POSTGRES=1 asks to skip:
a store suite that quietly skipped half its cases would prove nothing.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg import sql

HOST = os.environ.get("LLMGW_TEST_PGHOST", "127.0.0.1")
PORT = int(os.environ.get("LLMGW_TEST_PGPORT", "5432"))
USER = os.environ.get("LLMGW_TEST_PGUSER", "postgres")
ADMIN_DSN = f"postgresql://{USER}@{HOST}:{PORT}/postgres"
"""Where databases are created and dropped from (the maintenance database)."""
SKIP_ENV = "LLMGW_SKIP_POSTGRES"
PREFIX = "llmgw_test_"


def dsn_of(dbname: str) -> str:
    """A DSN for one database on the test server."""
    return f"postgresql://{USER}@{HOST}:{PORT}/{dbname}"


def admin() -> psycopg.Connection[tuple[object, ...]]:
    """An autocommit connection to the maintenance database; fails (or skips) the test when
    the server cannot be reached."""
    try:
        return psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        message = (
            f"PostgreSQL is not reachable at {HOST}:{PORT} as {USER} ({why}): the store tests run"
            f" against it; start it, or set {SKIP_ENV}=1 to skip them"
        )
        if os.environ.get(SKIP_ENV) == "1":
            pytest.skip(message)
        pytest.fail(message)


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
