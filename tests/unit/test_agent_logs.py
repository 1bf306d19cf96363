"""Replica logs: capped by copy-and-truncate, their last lines read back."""

from __future__ import annotations

import os
from pathlib import Path

from fleet_svc.agent.logs import ReplicaLog


def test_log_is_capped_and_the_engines_descriptor_keeps_appending(tmp_path: Path) -> None:
    """Past the cap the log moves to .log.1 and restarts empty; an engine's O_APPEND
    descriptor then writes at the new start, not past a hole."""
    log = ReplicaLog(tmp_path, "r1", max_bytes=100)
    fd = log.open_for_engine()
    try:
        os.write(fd, b"x" * 150 + b"\n")
        assert log.cap()
        os.write(fd, b"after\n")
    finally:
        os.close(fd)
    assert log.path.read_bytes() == b"after\n"
    assert (tmp_path / "r1.log.1").stat().st_size == 151
    assert not log.cap()


def test_tail_gives_the_last_lines(tmp_path: Path) -> None:
    """tail(n) gives the last n non-empty lines, agent notes included."""
    log = ReplicaLog(tmp_path, "r1", max_bytes=0)
    log.path.write_text("".join(f"line {i}\n" for i in range(100)))
    log.note("crashed")
    assert log.tail(3) == ["line 98", "line 99", "[agent] crashed"]
    assert ReplicaLog(tmp_path, "none", 0).tail(5) == []
