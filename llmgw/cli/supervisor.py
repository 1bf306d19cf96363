"""Child processes of one parent: started in their own session with their output appended to
a log, known ready when their log says where they listen, stopped (SIGTERM, then SIGKILL after
a grace) in the order the parent asks. What `llmgw up` runs is llmgw.cli.up's business."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

_LISTENING = re.compile(r"listening on (?:http://)?(?P<host>[^\s:]+):(?P<port>\d+)")
"""The line every llmgw service prints once it listens (JSON log lines are not it)."""
_PR_SET_PDEATHSIG = 1
"""prctl(2)'s option: the signal a process gets when its parent dies (linux/prctl.h)."""


class StartFailed(Exception):
    """A child did not come up; the message says what it did instead and where its log is."""


@dataclass
class Child:
    """A child process, its log and the address it listens on."""

    name: str
    argv: list[str]
    log_path: Path
    stop_grace_s: float
    parent: str = "llmgw up"
    """Who started it, named in the line its log starts with."""
    proc: subprocess.Popen[bytes] | None = None
    address: str = ""
    log_file: TextIO | None = field(default=None, repr=False)
    log_offset: int = 0
    """Where this run's part of the log starts (logs are appended to across runs)."""

    def start(self, env: dict[str, str]) -> None:
        """Start it in its own session (a Ctrl-C at the terminal reaches the parent only, which
        stops the children in order), its stdout and stderr appended to its log."""
        # 0600: a service's log holds what it was asked and answered.
        self.log_file = open(  # noqa: SIM115 - closed when the child is reaped
            self.log_path, "a", opener=lambda path, flags: os.open(path, flags, 0o600)
        )
        os.fchmod(self.log_file.fileno(), 0o600)
        self.log_file.write(f"--- {self.parent}: {' '.join(self.argv)}\n")
        self.log_file.flush()
        self.log_offset = self.log_file.tell()
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def running(self) -> bool:
        """Whether it has been started and not exited."""
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self) -> int | None:
        """Its exit code; None while it runs or before it started."""
        return self.proc.returncode if self.proc is not None else None

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> int | None:
        """`sig` (SIGTERM), then SIGKILL after its grace; its exit code (None when never
        started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                self.proc.wait(self.stop_grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                self.proc.wait()
        if self.log_file is not None:
            self.log_file.close()
        return self.proc.returncode

    def log_lines(self) -> list[str]:
        """The lines this run of it has logged so far."""
        try:
            with self.log_path.open("rb") as handle:
                handle.seek(self.log_offset)
                return handle.read().decode(errors="replace").splitlines()
        except OSError:
            return []

    def tail(self, lines: int = 8) -> str:
        """The last lines of its log, indented, for an error message."""
        return "\n".join(f"    {line}" for line in self.log_lines()[-lines:])


def _resolve_prctl() -> Any:
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL(None, use_errno=True).prctl
    return None


# Resolved once here, so the child does no loading between fork and exec.
_PRCTL = _resolve_prctl() if sys.platform == "linux" else None


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the parent dies (even by SIGKILL), so no
    child outlives it (Linux; elsewhere a no-op)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def port_taken(host: str, port: int) -> bool:
    """Whether something listens on (or holds) host:port. gRPC servers bind with
    SO_REUSEPORT, so a second fleet could otherwise share the first one's port unnoticed."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def wait_listening(child: Child, timeout_s: float, stop: threading.Event) -> str:
    """The HOST:PORT a child prints it listens on, read from its log.

    Raises:
        StartFailed: it exited first, did not say within `timeout_s`, or `stop` was set.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stop.is_set():
        for line in child.log_lines():
            match = _LISTENING.search(line)
            if match and not line.startswith("{"):
                child.address = f"{match.group('host')}:{match.group('port')}"
                return child.address
        if not child.running():
            raise StartFailed(
                f"the {child.name} exited (code {child.exit_code()}) before it listened; "
                f"its log ({child.log_path}) ends:\n{child.tail()}"
            )
        stop.wait(0.1)
    if stop.is_set():
        raise StartFailed("stopped while starting")
    raise StartFailed(
        f"the {child.name} did not listen within {timeout_s:.0f} s; see {child.log_path}"
    )


class Supervisor:
    """The children of one parent, each logging to LOGS/NAME.log."""

    def __init__(self, logs: Path, parent: str = "llmgw up") -> None:
        self.logs = logs
        self.parent = parent
        self.children: list[Child] = []

    def start(self, name: str, argv: list[str], env: dict[str, str], grace_s: float) -> Child:
        """Start a child named `name` (its log: LOGS/NAME.log)."""
        child = Child(name, argv, self.logs / f"{name}.log", grace_s, self.parent)
        self.children.append(child)
        child.start(env)
        return child

    def restart(self, name: str, env: dict[str, str], sig: signal.Signals) -> Child:
        """Stop the child named `name` with `sig` (SIGKILL after its grace) and start it
        again with the same arguments and `env`, in its place (its log appended to)."""
        old = next(c for c in self.children if c.name == name)
        old.stop(sig)
        new = Child(name, old.argv, old.log_path, old.stop_grace_s, self.parent)
        self.children[self.children.index(old)] = new
        new.start(env)
        return new

    def exited(self) -> Child | None:
        """A child that has exited on its own, if any."""
        return next((c for c in self.children if not c.running()), None)

    def stop_all(self, order: Sequence[str], stopped: Callable[[Child, int | None], None]) -> None:
        """Stop the started children one by one, those named in `order` first and in that
        order, then the rest; `stopped(child, exit_code)` after each."""
        rank = {name: i for i, name in enumerate(order)}
        for child in sorted(self.children, key=lambda c: rank.get(c.name, len(rank))):
            if child.proc is not None:
                stopped(child, child.stop())
