"""Fleets as child processes (`python -m fleet_svc`) sharing one store, and which of them
leads, for the failover tests and the failover benchmark."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class FleetProc:
    """One fleet process: its process, port, name and log file."""

    proc: subprocess.Popen[str]
    port: int
    name: str
    log: Path

    @property
    def address(self) -> str:
        """HOST:PORT it listens on (and advertises as leader)."""
        return f"127.0.0.1:{self.port}"

    def kill(self) -> None:
        """SIGKILL, and wait for it to be gone."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


def with_application_name(dsn: str, name: str) -> str:
    """The DSN naming its sessions `name` in pg_stat_activity (and in a test's audit rows)."""
    return f"{dsn}{'&' if '?' in dsn else '?'}application_name={name}"


@contextmanager
def fleet_process(
    store: str,
    folder: Path,
    name: str,
    *,
    planner: str = "127.0.0.1:1",
    extra: Sequence[str] = (),
) -> Iterator[FleetProc]:
    """`python -m fleet_svc` on a free port with fast heartbeats; killed after if still up.
    On PostgreSQL its sessions are named `name`."""
    log = folder / f"{name}.log"
    dsn = with_application_name(store, name) if store.startswith("postgresql") else store
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fleet_svc",
            "--listen",
            "127.0.0.1:0",
            "--store",
            dsn,
            "--planner",
            planner,
            "--heartbeat-s",
            "0.5",
            "--drain-s",
            "0",
            "--start-timeout-s",
            "60",
            "--log-format",
            "json",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=log.open("ab"),
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("fleet listening on"), (line, log.read_text()[-2000:])
        yield FleetProc(proc, int(line.rsplit(":", 1)[1]), name, log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a paused one is resumed to be killed
            proc.kill()
        proc.wait(timeout=10)


@contextmanager
def fleet_processes(
    store: str, folder: Path, count: int, **kwargs: object
) -> Iterator[list[FleetProc]]:
    """`count` fleets on one store, started one after another (the first leads)."""
    with ExitStack() as stack:
        yield [
            stack.enter_context(fleet_process(store, folder, f"fleet-{i}", **kwargs))  # type: ignore[arg-type]
            for i in range(count)
        ]


@dataclass(frozen=True)
class LeaseRow:
    """The lease as the database holds it."""

    holder: str
    address: str
    epoch: int
    live: bool
    """Whether it has not expired (by the server's clock)."""


def lease_of(dsn: str) -> LeaseRow | None:
    """The lease row now, None before any fleet took it."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
        row = conn.execute(
            "SELECT holder, address, epoch, expires_at > clock_timestamp() FROM leases"
            " WHERE name = 'fleet'"
        ).fetchone()
    return None if row is None else LeaseRow(str(row[0]), str(row[1]), int(row[2]), bool(row[3]))


def leader_among(dsn: str, fleets: Sequence[FleetProc]) -> FleetProc | None:
    """The fleet holding a live lease (None when none of them does now)."""
    lease = lease_of(dsn)
    if lease is None or not lease.live:
        return None
    return next((f for f in fleets if f.address == lease.address), None)
