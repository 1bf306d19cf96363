"""The host the agent runs on: its memory, and free ports for engines."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path


def _meminfo_bytes(key: str, meminfo: Path = Path("/proc/meminfo")) -> int:
    """A /proc/meminfo field in bytes (the file gives kB); 0 where there is no such file."""
    with contextlib.suppress(OSError, ValueError):
        for line in meminfo.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def memory_bytes() -> int:
    """The host's RAM."""
    return _meminfo_bytes("MemTotal")


def memory_free_bytes() -> int:
    """RAM a new process could take without swapping (MemAvailable, not MemFree: the page
    cache gives way)."""
    return _meminfo_bytes("MemAvailable")


def free_port(host: str, prefer: int = 0) -> int:
    """A TCP port on `host` nothing listens on now: `prefer` when it is free (so a restarted
    engine keeps its address), else one the kernel picks.

    Another process may take it before the engine binds it; the engine then fails to start,
    which the supervisor treats as a crash and retries on a new port.
    """
    for port in (prefer, 0) if prefer else (0,):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise OSError(f"no free port on {host}")
