"""A PostgreSQL server of a test's own (initdb into a temporary folder, pg_ctl on a free port).

Two uses: the test run's own server, which holds every test's throw-away databases when
LLMGW_TEST_PG_DSN names none (tests/support/postgres.py starts it on first use and stops it
when the run ends), and a server for one test that stops and starts it (test_store_restart).

initdb refuses to run as root, so as root the cluster is made and run as the `postgres` user
(runuser); a test skips, saying why, where neither is possible.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest


def _server_programs() -> Path:
    """Where initdb and pg_ctl are: LLMGW_TEST_PGBIN, else the newest of Debian's
    /usr/lib/postgresql/N/bin (the `postgresql` package; `make postgres` installs it)."""
    given = os.environ.get("LLMGW_TEST_PGBIN")
    if given:
        return Path(given)
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    return found[-1].parent if found else Path("/usr/lib/postgresql/15/bin")


BIN = _server_programs()
RUN_AS = "postgres"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PrivateServer:
    """One private server: its data folder and port, and how to stop and start it."""

    folder: Path
    port: int
    user: str | None
    """The account it runs as (None: this process's own)."""

    @property
    def dsn(self) -> str:
        """The DSN of its `postgres` database (trust auth, over TCP)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args: str) -> None:
        command = [str(BIN / "pg_ctl"), "-D", str(self.folder / "data"), *args]
        if self.user:
            command = ["runuser", "-u", self.user, "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        """Start it and wait until it accepts connections."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder}"
            " -c fsync=off -c full_page_writes=off -c max_connections=400"
        )
        self._ctl("-o", options, "-l", str(self.folder / "server.log"), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop it (`fast`: sessions are ended, as a restart by an operator does)."""
        self._ctl("-m", mode, "-w", "stop")


class NoServer(Exception):
    """A private server cannot be made here; the message says why."""


def _account() -> str | None:
    """The account initdb and the server run as: None for this process's own, `postgres` as
    root (initdb refuses root)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(RUN_AS)
    except KeyError:
        why = f"initdb refuses root and there is no {RUN_AS!r} user to run it as"
        raise NoServer(why) from None
    if shutil.which("runuser") is None:
        raise NoServer("initdb refuses root and runuser is not installed")
    return RUN_AS


def start_private_server() -> PrivateServer:
    """initdb a fresh cluster into a new folder under /tmp and start it on a free port.

    Raises NoServer when the server programs or an account to run them are missing. The
    caller stops it and removes `folder` (`discard`)."""
    if not (BIN / "initdb").exists():
        raise NoServer(
            f"no PostgreSQL server programs at {BIN} (`make postgres` installs Debian's"
            " postgresql; or set LLMGW_TEST_PGBIN, or LLMGW_TEST_PG_DSN for a running server)"
        )
    user = _account()
    # Under /tmp itself: pytest's own folders are private to root, which the server's user
    # could not enter.
    folder = Path(tempfile.mkdtemp(prefix="llmgw-pg-"))
    try:
        if user is not None:
            shutil.chown(folder, user)
        server = PrivateServer(folder, _free_port(), user)
        initdb = [
            str(BIN / "initdb"),
            "-D",
            str(folder / "data"),
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-sync",
        ]
        if user is not None:
            initdb = ["runuser", "-u", user, "--", *initdb]
        subprocess.run(initdb, check=True, capture_output=True, timeout=120)
        server.start()
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return server


def discard(server: PrivateServer) -> None:
    """Stop `server` (if it still runs) and remove its folder."""
    with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
        server.stop("immediate")  # a stopped server makes pg_ctl fail: nothing to do
    shutil.rmtree(server.folder, ignore_errors=True)


@contextmanager
def private_postgres() -> Iterator[PrivateServer]:
    """A fresh private server, started; stopped and removed after. The test skips, saying
    why, where no server can be made."""
    try:
        server = start_private_server()
    except NoServer as why:
        pytest.skip(str(why))
    try:
        yield server
    finally:
        discard(server)
