"""Engine processes: started by this agent or adopted from an earlier one, signalled as a group,
and the run records that let a restarted agent find them again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from fleet_svc.agent import claims
from fleet_svc.agent.replica import ReplicaSpec
from llmgw.engines.gang import MemberOrder

log = structlog.get_logger("fleet_svc.agent.process")


class EngineProcess(Protocol):
    """A running engine process, started by this agent or adopted from an earlier one."""

    pid: int

    async def wait(self) -> int | None:
        """Wait for it to exit; its exit code, None when unknown."""
        ...


class ChildProcess:
    """A process this agent started (its exit code can be read)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc
        self.pid = proc.pid

    async def wait(self) -> int | None:
        """The exit code; negative for a signal, as subprocess reports it."""
        return await self._proc.wait()


class AdoptedProcess:
    """A process an earlier agent started: watched by polling, its exit code unknown."""

    def __init__(self, pid: int, start_ticks: int | None, poll_s: float) -> None:
        self.pid = pid
        self._start_ticks = start_ticks
        self._poll_s = poll_s

    def alive(self) -> bool:
        """Whether it still runs (and the pid is not another process's by now)."""
        return claims.process_alive(self.pid) and (
            self._start_ticks is None or process_start_ticks(self.pid) == self._start_ticks
        )

    async def wait(self) -> int | None:
        """Poll until it is gone."""
        while self.alive():
            await asyncio.sleep(self._poll_s)
        return None


def process_start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (/proc/PID/stat field 22): with
    the pid it identifies a process across pid reuse. None without /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    # Fields after the name start at field 3 (state); starttime is field 22.
    return int(fields[22 - 3]) if len(fields) > 22 - 3 else None


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Send `sig` to the engine's process group (its session leader's pid), ignoring a group
    that is already gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def group_alive(pgid: int) -> bool:
    """Whether any process of the group is left."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# How long to wait, after SIGKILL, for the engine's whole process group to be gone: its worker
# processes hold card memory until they exit. Past it the agent goes on (and logs it) rather
# than hang on a process stuck in the kernel.
GROUP_EXIT_WAIT_S = 5.0


async def wait_group_gone(pgid: int, timeout_s: float = GROUP_EXIT_WAIT_S) -> bool:
    """Wait until no process of the group is left; whether that happened in time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while group_alive(pgid):
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True


@dataclass(frozen=True)
class RunRecord:
    """What the agent writes down about a running replica, so that an agent started again
    can adopt the process instead of starting a second one."""

    spec: ReplicaSpec
    pid: int
    port: int
    start_ticks: int | None
    restarts: int
    gang_port: int = 0
    """The port a gang member listens on for its gang (0: none)."""

    def to_json(self) -> str:
        """The record as JSON."""
        data = asdict(self)
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        """A record from `to_json`'s output.

        Raises:
            ValueError, KeyError, TypeError: the text is not such a record.
        """
        data: dict[str, Any] = json.loads(text)
        spec = data["spec"]
        gang = spec.get("gang")
        return cls(
            spec=ReplicaSpec(
                replica_id=str(spec["replica_id"]),
                revision=int(spec["revision"]),
                engine=str(spec["engine"]),
                model=str(spec.get("model", "")),
                profile=str(spec.get("profile", "")),
                args=tuple(str(a) for a in spec.get("args", ())),
                gpus=tuple(int(g) for g in spec.get("gpus", ())),
                source=str(spec.get("source", "")),
                gang=(
                    MemberOrder(
                        rank=int(gang["rank"]),
                        nnodes=int(gang["nnodes"]),
                        peers=tuple(str(p) for p in gang.get("peers", ())),
                    )
                    if isinstance(gang, dict)
                    else None
                ),
            ),
            pid=int(data["pid"]),
            port=int(data["port"]),
            start_ticks=None if data.get("start_ticks") is None else int(data["start_ticks"]),
            restarts=int(data.get("restarts", 0)),
            gang_port=int(data.get("gang_port", 0)),
        )


def read_records(records_dir: Path) -> list[RunRecord]:
    """The run records an earlier agent left, skipping unreadable ones."""
    if not records_dir.is_dir():
        return []
    records = []
    for path in sorted(records_dir.glob("*.json")):
        try:
            records.append(RunRecord.from_json(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("run_record_skipped", path=str(path))
    return records


# Exit code reported when it is not known: a process adopted from an earlier agent is not our
# child, so its status cannot be read; a program that could not be executed has none.
UNKNOWN_EXIT = -1


def exit_text(code: int) -> str:
    """How an engine's exit code reads in a message (UNKNOWN_EXIT: it exited, nothing more)."""
    if code == UNKNOWN_EXIT:
        return "the engine exited"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"the engine was killed by {signal.Signals(-code).name}"
        return f"the engine was killed by signal {-code}"
    return f"the engine exited with code {code}"
