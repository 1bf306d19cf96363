"""Replica logs: one file per replica that its engine writes and the agent caps and reads."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

# How far back from the end of the log to look for the last lines.
_TAIL_WINDOW_BYTES = 64 << 10


class ReplicaLog:
    """`<logs_dir>/<replica_id>.log`, written by the engine through an O_APPEND descriptor,
    mode 0600 (an engine's log can hold what it was started with).

    Capped by copy-and-truncate: past `max_bytes` the file is copied to `.log.1` and cut to
    nothing. The engine keeps writing through its descriptor; O_APPEND puts its next line at
    the new end, so nothing has to be reopened and a process the agent did not start (adopted
    after an agent restart) is capped the same way.
    """

    def __init__(self, logs_dir: Path, replica_id: str, max_bytes: int) -> None:
        logs_dir.mkdir(parents=True, exist_ok=True)
        self.path = logs_dir / f"{replica_id}.log"
        self.max_bytes = max_bytes

    def open_for_engine(self) -> int:
        """A descriptor the engine gets as stdout and stderr; the caller closes its copy."""
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)  # a log from before stays no more readable than a new one
        return fd

    def note(self, line: str) -> None:
        """Write one line of the agent's own (what it ran, why it stopped it) into the log,
        so the log reads as the replica's whole story."""
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, f"[agent] {line}\n".encode())
        finally:
            os.close(fd)

    def cap(self) -> bool:
        """Rotate when past the cap; returns whether it did."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return False
        if self.max_bytes <= 0 or size <= self.max_bytes:
            return False
        backup = self.path.with_name(self.path.name + ".1")
        shutil.copyfile(self.path, backup)
        os.chmod(backup, 0o600)
        with open(self.path, "r+b") as f:
            f.truncate(0)
        return True

    def tail(self, lines: int) -> list[str]:
        """The last `lines` lines (fewer when the log is shorter), without line ends."""
        if lines <= 0:
            return []
        with contextlib.suppress(FileNotFoundError):
            with open(self.path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - _TAIL_WINDOW_BYTES))
                data = f.read()
            text = data.decode("utf-8", errors="replace").splitlines()
            if size > _TAIL_WINDOW_BYTES and text:
                text = text[1:]  # the first line is cut
            return [line for line in text if line.strip()][-lines:]
        return []
