"""A PostgreSQL server of a test's own (initdb into a temporary folder, pg_ctl on a free port),
for tests that stop and start the server: the machine's shared server on 5432 is never
restarted, other sessions use it.

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

BIN = Path(os.environ.get("LLMGW_TEST_PGBIN", "/usr/lib/postgresql/15/bin"))
"""Where initdb and pg_ctl are (Debian's postgresql-15 package)."""
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
            " -c fsync=off -c full_page_writes=off"
        )
        self._ctl("-o", options, "-l", str(self.folder / "server.log"), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop it (`fast`: sessions are ended, as a restart by an operator does)."""
        self._ctl("-m", mode, "-w", "stop")


@contextmanager
def private_postgres() -> Iterator[PrivateServer]:
    """A fresh private server, started; stopped and removed after."""
    if not (BIN / "initdb").exists():
        pytest.skip(f"no PostgreSQL server programs at {BIN} (set LLMGW_TEST_PGBIN)")
    user: str | None = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(RUN_AS)
        except KeyError:
            pytest.skip(f"initdb refuses root and there is no {RUN_AS!r} user to run it as")
        if shutil.which("runuser") is None:
            pytest.skip("initdb refuses root and runuser is not installed")
        user = RUN_AS
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
        try:
            yield server
        finally:
            with contextlib.suppress(subprocess.CalledProcessError):  # stopped already
                server.stop("immediate")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
