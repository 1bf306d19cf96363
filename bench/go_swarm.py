"""The Go swarm: `agent_fanin`'s lean agents run by a Go program (bench/swarm), a process of
its own, instead of in the bench's event loop.

`build_swarm` builds bench/swarm once per run (module mode from its committed go.sum, modules
from GOMODCACHE or the Go module proxy, as tests/integration/test_go_client.py builds
tests/go/client). `GoSwarm` starts it against a fleet and reads its stdout: one JSON line for
every desired set an agent acknowledged, stamped with CLOCK_MONOTONIC just after the Ack was
sent, and one line for every stream that ended (or failed to open) before the bench let it go,
which the swarm does not open again. On Linux `time.perf_counter` reads that clock too, so the
bench's own stamps and the swarm's are on one clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.planner_throughput import process_cpu_s

SWARM_MODULE = Path(__file__).resolve().parent / "swarm"
BUILD_TIMEOUT_S = 300.0
"""A first build downloads grpc-go and compiles it: minutes on two busy cores."""


class SwarmError(RuntimeError):
    """The Go swarm could not be built, or it ended before the bench let it go."""


def go_tool() -> str | None:
    """The machine's go: PATH's, else /usr/local/go/bin/go (where the Makefile finds it)."""
    found = shutil.which("go")
    if found is None and Path("/usr/local/go/bin/go").is_file():
        found = "/usr/local/go/bin/go"
    return found


def module_env() -> dict[str, str]:
    """A module-mode build's environment: go.mod and go.sum as committed (-mod=readonly, so
    nothing is resolved anew), the local toolchain, no cgo."""
    env = dict(os.environ)
    env.pop("GO111MODULE", None)
    env.pop("GOPATH", None)
    env.update(GOFLAGS="-mod=readonly -buildvcs=false", GOTOOLCHAIN="local", CGO_ENABLED="0")
    env.setdefault("GOCACHE", str(Path.home() / ".cache" / "go-build"))
    return env


async def build_swarm(folder: Path) -> Path:
    """`go build` bench/swarm into `folder`; the binary's path.

    Raises:
        SwarmError: go is not installed, or the build failed (its output in the message).
    """
    go = go_tool()
    if go is None:
        raise SwarmError(
            "--swarm go needs the go tool (1.26 or newer, bench/swarm/go.mod), on PATH or in "
            "/usr/local/go/bin; install it or run with --swarm python"
        )
    folder.mkdir(parents=True, exist_ok=True)
    binary = folder / "swarm"
    proc = await asyncio.create_subprocess_exec(
        go,
        "build",
        "-o",
        str(binary),
        ".",
        cwd=SWARM_MODULE,
        env=module_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), BUILD_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise SwarmError(f"go build of {SWARM_MODULE} took over {BUILD_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        raise SwarmError(f"go build of {SWARM_MODULE} failed:\n{out.decode(errors='replace')}")
    return binary


def check_clock() -> None:
    """The swarm stamps CLOCK_MONOTONIC; refuse where time.perf_counter reads another clock.

    Raises:
        SwarmError: perf_counter is not clock_gettime(CLOCK_MONOTONIC) here (not Linux).
    """
    how = time.get_clock_info("perf_counter").implementation
    if how != "clock_gettime(CLOCK_MONOTONIC)":
        raise SwarmError(f"time.perf_counter is {how}, not the Go swarm's CLOCK_MONOTONIC")


@dataclass
class GoSwarm:
    """A running bench/swarm process of `agents` agents and what its lines said so far."""

    process: asyncio.subprocess.Process
    agents: int
    log_path: Path
    seen: list[bool] = field(init=False)
    """Per agent: it has acknowledged a desired set (it joined)."""
    running_now: list[int] = field(init=False)
    """Per agent: replicas it runs, after the last set it answered."""
    latencies: list[float | None] = field(init=False)
    """Per agent: from the round's start to its Ack of the first set holding the model."""
    start_s: float | None = None
    """The round's start (perf_counter, CLOCK_MONOTONIC); None between rounds."""
    ended: int = 0
    """Streams that ended before `close` (the swarm does not open them again)."""
    _joined: int = 0
    _acked: int = 0
    _all_joined: asyncio.Event = field(default_factory=asyncio.Event)
    _reader: asyncio.Task[None] | None = None
    _closing: bool = False

    def __post_init__(self) -> None:
        self.seen = [False] * self.agents
        self.running_now = [0] * self.agents
        self.latencies = [None] * self.agents
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(
        cls,
        binary: Path,
        address: str,
        agents: int,
        log_path: Path,
        *,
        per_connection: int,
        model: str,
        tls: tuple[Path, Path] | None = None,
        max_joining: int = 0,
    ) -> GoSwarm:
        """Run the swarm against the fleet at `address` (or several, comma-separated: agent i
        connects to the (i mod n)th) (`tls`: the CA and the folder of node pairs; every agent
        then has its own connection; `max_joining`: at most that many agents between Connect
        and their first desired set at once, 0 for no cap). Its stderr goes to `log_path`."""
        check_clock()
        argv = [
            str(binary),
            "-fleet",
            address,
            "-agents",
            str(agents),
            "-per-conn",
            str(per_connection),
            "-model",
            model,
        ]
        if max_joining:
            argv += ["-max-joining", str(max_joining)]
        if tls is not None:
            argv += ["-tls-ca", str(tls[0]), "-tls-dir", str(tls[1])]
        with log_path.open("wb") as log:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                limit=1 << 20,
            )
        return cls(process, agents, log_path)

    @property
    def pid(self) -> int:
        """The swarm's process id."""
        return self.process.pid

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            ev = json.loads(line)
            i = ev["agent"]
            if ev.get("ended"):
                self.ended += 1
                continue
            if not self.seen[i]:
                self.seen[i] = True
                self._joined += 1
                if self._joined == self.agents:
                    self._all_joined.set()
            self.running_now[i] = ev["running"]
            if self.start_s is not None and ev["watched"] and self.latencies[i] is None:
                self.latencies[i] = ev["t_ns"] / 1e9 - self.start_s
                self._acked += 1

    def _check(self) -> None:
        """Raise if the swarm ended on its own."""
        if not self._closing and self._reader is not None and self._reader.done():
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise SwarmError(f"the Go swarm ended (exit {self.process.returncode}): {tail}")

    async def joined(self, timeout_s: float) -> None:
        """Wait until every agent has acknowledged a desired set.

        Raises:
            SwarmError: the swarm ended first.
            TimeoutError: not within `timeout_s`.
        """
        deadline = time.perf_counter() + timeout_s
        while not self._all_joined.is_set():
            self._check()
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{self.agents - self._joined} agents never joined")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_joined.wait(), 0.1)

    def start_round(self, model: str, start_s: float) -> None:
        """Time each agent's first Ack of a set holding a replica of the model from `start_s`
        (the swarm was told the model's name when it started)."""
        del model  # the swarm's -model flag
        self.latencies = [None] * self.agents
        self._acked = 0
        self.start_s = start_s

    def all_acked(self) -> bool:
        """Every agent acknowledged a set holding the model since the round started."""
        self._check()
        return self._acked == self.agents

    def round_latencies_s(self) -> list[float]:
        """The round's latencies so far."""
        return [t for t in self.latencies if t is not None]

    def end_round(self) -> None:
        """Stop timing."""
        self.start_s = None

    def any_running(self) -> bool:
        """Some agent still runs a replica."""
        self._check()
        return any(self.running_now)

    def cpu_s(self) -> float:
        """The swarm process's user + system CPU so far (/proc/PID/stat)."""
        return process_cpu_s(self.pid)

    async def close(self) -> None:
        """Close its stdin (it ends every stream and exits); kill it after 10 s."""
        self._closing = True
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 10)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
