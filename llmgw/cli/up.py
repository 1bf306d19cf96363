"""`llmgw up`: the whole control plane on one machine, with an example catalog.

It starts, as child processes, the demo's file server (a tiny GGUF model and a Hugging
Face-shaped repo, `HF_ENDPOINT` pointed at it), the planner, the fleet (SQLite in the data
folder) and one node agent with stand-in cards whose engines the stand-in plays (llama.cpp
runs for real where a llama-server is built). It loads the example catalog through the
fleet's API (so it can be edited like any model), waits until the example replicas are
READY, prints where everything listens, and runs until Ctrl-C or SIGTERM, which stop the
children in order: agent (it stops its engines), fleet, planner, file server. Each child
logs JSON lines to DATA/logs/NAME.log.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import grpc

from llmgw.cli.ctl import UsageParser
from llmgw.demo.catalog import GGUF_FILE, ensure_example_catalog, example_models, wait_ready
from llmgw.demo.tiny_gguf import write_tiny_gguf
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc

EXIT_FAILED = 1
EXIT_USAGE = 64
LLAMA_SERVER_ENV = "LLMGW_LLAMA_SERVER"
LLAMA_SERVER_CACHE = Path.home() / ".cache" / "llmgw" / "llama.cpp" / "bin" / "llama-server"
"""Where the project's make target builds llama-server."""
_GPUS = re.compile(r"^\s*(\d+)x([A-Za-z0-9._-]+)")
_LISTENING = re.compile(r"listening on (?:http://)?(?P<host>[^\s:]+):(?P<port>\d+)")
_PR_SET_PDEATHSIG = 1
_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass
class Child:
    """A child process of `llmgw up`, its log and the address it listens on."""

    name: str
    argv: list[str]
    log_path: Path
    stop_grace_s: float
    proc: subprocess.Popen[bytes] | None = None
    address: str = ""
    log_file: TextIO | None = field(default=None, repr=False)
    log_offset: int = 0
    """Where this run's part of the log starts (logs are appended to across runs)."""

    def start(self, env: dict[str, str]) -> None:
        """Start it in its own session (a Ctrl-C at the terminal reaches `llmgw up` only, which
        stops the children in order), its stdout and stderr appended to its log."""
        self.log_file = self.log_path.open("a")
        self.log_file.write(f"--- llmgw up: {' '.join(self.argv)}\n")
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

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after its grace; its exit code (None when never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
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
    """In the child, before exec: get SIGTERM when `llmgw up` dies (even by SIGKILL), so no
    child outlives it (Linux; elsewhere a no-op)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


class UpError(Exception):
    """`llmgw up` cannot go on; the message says what failed and what to do."""


def gpu_class_of(gpus: str) -> str:
    """The card class of an agent's `--gpus` (the first group's): 4xH100-80GB -> H100-80GB.

    Raises:
        UpError: the text is not COUNTxCLASS.
    """
    match = _GPUS.match(gpus)
    if match is None:
        raise UpError(f"--gpus {gpus!r}: write COUNTxCLASS, e.g. 4xH100-80GB")
    return match.group(2)


def find_llama_server(env: dict[str, str]) -> str | None:
    """A llama-server to run the llama.cpp example on, looked for as the agent does:
    $LLMGW_LLAMA_SERVER when set (only that one: a build an operator named is not replaced by
    another), else PATH's, else the project's build cache (`make llama-server`); None when
    there is none."""
    told = env.get(LLAMA_SERVER_ENV, "")
    if told:
        return told if os.path.isfile(told) and os.access(told, os.X_OK) else None
    on_path = shutil.which("llama-server", path=env.get("PATH"))
    if on_path:
        return on_path
    built = Path(env.get("HOME") or Path.home()) / LLAMA_SERVER_CACHE.relative_to(Path.home())
    return str(built) if built.is_file() and os.access(built, os.X_OK) else None


def command_name(argv0: str | None = None) -> str:
    """How to call `llmgw` again, as it was called: `llmgw` when that is on PATH, else the
    path it was run by (e.g. `.venv/bin/llmgw`), else through Python."""
    called = argv0 if argv0 is not None else sys.argv[0]
    on_path = shutil.which("llmgw")
    if Path(called).name == "llmgw":
        if on_path and Path(on_path).resolve() == Path(called).resolve():
            return "llmgw"
        relative = os.path.relpath(called)
        if relative.startswith(".."):
            return os.path.abspath(called)
        return relative if "/" in relative else f"./{relative}"
    return "llmgw" if on_path else f"{sys.executable} -m llmgw.cli.main"


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
        UpError: it exited first, or did not say within `timeout_s`.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stop.is_set():
        for line in child.log_lines():
            match = _LISTENING.search(line)
            if match and not line.startswith("{"):
                child.address = f"{match.group('host')}:{match.group('port')}"
                return child.address
        if not child.running():
            code = child.proc.returncode if child.proc else None
            raise UpError(
                f"the {child.name} exited (code {code}) before it listened; "
                f"its log ({child.log_path}) ends:\n{child.tail()}"
            )
        stop.wait(0.1)
    if stop.is_set():
        raise UpError("stopped while starting")
    raise UpError(f"the {child.name} did not listen within {timeout_s:.0f} s; see {child.log_path}")


def wait_channel(channel: grpc.Channel, timeout_s: float, stop: threading.Event) -> None:
    """Wait until `channel` connects, in slices so a signal is not held up.

    Raises:
        UpError: it did not connect within `timeout_s`, or a signal came.
    """
    ready = grpc.channel_ready_future(channel)
    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        try:
            ready.result(timeout=0.25)
            return
        except grpc.FutureTimeoutError:
            if time.monotonic() > deadline:
                ready.cancel()
                raise UpError(f"could not connect within {timeout_s:.0f} s") from None
    ready.cancel()
    raise UpError("stopped while starting")


@dataclass
class Plan:
    """What `llmgw up` runs, from its flags."""

    data: Path
    host: str
    planner_port: int
    fleet_port: int
    files_port: int
    gpus: str
    node: str
    agent: bool
    ready_timeout_s: float
    python: str = sys.executable

    @property
    def logs(self) -> Path:
        """Where the children's logs are."""
        return self.data / "logs"

    @property
    def models(self) -> Path:
        """The folder the file server serves."""
        return self.data / "models"


def build_plan(opts: argparse.Namespace) -> Plan:
    """The plan from the flags.

    Raises:
        UpError: a flag is out of range.
    """
    for flag in ("planner_port", "fleet_port", "files_port"):
        value = getattr(opts, flag)
        if not 0 <= value <= 65535:
            raise UpError(f"--{flag.replace('_', '-')} {value}: a port is 0..65535 (0: any free)")
    gpu_class_of(opts.gpus)
    return Plan(
        data=Path(opts.data).resolve(),
        host=opts.host,
        planner_port=opts.planner_port,
        fleet_port=opts.fleet_port,
        files_port=opts.files_port,
        gpus=opts.gpus,
        node=opts.node,
        agent=not opts.no_agent,
        ready_timeout_s=opts.ready_timeout,
    )


class Up:
    """One run of `llmgw up`."""

    def __init__(self, plan: Plan, out: TextIO = sys.stdout) -> None:
        self.plan = plan
        self.out = out
        self.stop = threading.Event()
        self.children: list[Child] = []
        self.complete = True
        """Whether every example replica served before the banner."""

    def say(self, text: str) -> None:
        """A line for the person running it."""
        print(text, file=self.out, flush=True)

    def _child(self, name: str, argv: list[str], grace_s: float) -> Child:
        child = Child(name, argv, self.plan.logs / f"{name}.log", grace_s)
        self.children.append(child)
        return child

    def check_ports(self) -> None:
        """Refuse to start when a fixed port is taken, naming it."""
        p = self.plan
        for name, flag, port in (
            ("planner", "--planner-port", p.planner_port),
            ("fleet", "--fleet-port", p.fleet_port),
            ("file server", "--files-port", p.files_port),
        ):
            if port and port_taken(p.host, port):
                raise UpError(
                    f"port {port} ({name}) on {p.host} is taken: stop what listens there "
                    f"(another `llmgw up`?) or pass {flag} N (0 picks a free one)"
                )

    def run(self) -> int:
        """Start everything, wait for the examples, serve until signalled; the exit code."""
        p = self.plan
        p.logs.mkdir(parents=True, exist_ok=True)
        p.models.mkdir(parents=True, exist_ok=True)
        self.check_ports()
        env = dict(os.environ)
        # The folder holding the project's packages, so the children import them whatever the
        # working directory (as the agent does for its engines).
        env["PYTHONPATH"] = os.pathsep.join(
            x for x in (_PROJECT_ROOT, env.get("PYTHONPATH", "")) if x
        )
        gguf_path = p.models / GGUF_FILE
        if not gguf_path.is_file():
            write_tiny_gguf(gguf_path)
        llama_server = find_llama_server(env)

        files = self._child(
            "files",
            [
                p.python,
                "-m",
                "llmgw.demo",
                "--listen",
                f"{p.host}:{p.files_port}",
                "--folder",
                str(p.models),
                "--log-format",
                "json",
            ],
            5.0,
        )
        files.start(env)
        files_url = "http://" + wait_listening(files, 30, self.stop)
        # The children read the demo's hf:// repo from the file server, with their own cache
        # (no stored Hub token is sent to it, nothing mixes with the user's cache).
        env |= {
            "HF_ENDPOINT": files_url,
            "HF_HOME": str(p.data / "huggingface"),
            "HF_HUB_DISABLE_TELEMETRY": "1",
        }
        planner = self._child(
            "planner",
            [
                p.python,
                "-m",
                "planner_svc",
                "--listen",
                f"{p.host}:{p.planner_port}",
                "--log-format",
                "json",
            ],
            10.0,
        )
        planner.start(env)
        # The fleet asks the planner to size context and card changes: it starts once the
        # planner's address is known (a port of 0 is only known once it listens).
        planner_address = wait_listening(planner, 60, self.stop)
        fleet = self._child(
            "fleet",
            [
                p.python,
                "-m",
                "fleet_svc",
                "--listen",
                f"{p.host}:{p.fleet_port}",
                "--store",
                str(p.data / "fleet.db"),
                "--planner",
                planner_address,
                "--log-format",
                "json",
            ],
            10.0,
        )
        fleet.start(env)
        fleet_address = wait_listening(fleet, 60, self.stop)
        # Every child starts before this process opens a gRPC channel: gRPC's threads and a
        # fork do not mix (the children's pre-exec hook runs between them).
        if p.agent:
            agent_env = dict(env)
            if llama_server:
                agent_env[LLAMA_SERVER_ENV] = llama_server
            agent = self._child(
                "agent",
                [
                    p.python,
                    "-m",
                    "fleet_svc.agent",
                    "--fleet",
                    fleet_address,
                    "--node",
                    p.node,
                    "--gpus",
                    p.gpus,
                    "--state-dir",
                    str(p.data / "agent"),
                    "--demo",
                    "--log-format",
                    "json",
                ],
                # The agent stops its engines (each with its own grace) before it exits.
                45.0,
            )
            agent.start(agent_env)
        gguf_source = str(gguf_path) if llama_server else f"{files_url}/files/{GGUF_FILE}"
        models = example_models(gguf_source=gguf_source, gpu_class=gpu_class_of(p.gpus))
        ready: list[fleet_pb2.Replica] = []
        with grpc.insecure_channel(fleet_address) as channel:
            stub = fleet_pb2_grpc.FleetServiceStub(channel)
            try:
                wait_channel(channel, 30, self.stop)
                for line in ensure_example_catalog(stub, models):
                    self.say(f"catalog: {line}")
            except (grpc.RpcError, UpError) as exc:
                if self.stop.is_set():
                    return 0
                raise UpError(
                    f"the fleet at {fleet_address} did not take the example catalog ({exc}); "
                    f"see {fleet.log_path}"
                ) from exc
            if p.agent:
                self.say(f"waiting for the example replicas (up to {p.ready_timeout_s:.0f} s):")
                got = wait_ready(stub, models, p.ready_timeout_s, self.stop, self.out)
                if got is None and not self.stop.is_set():
                    self.say(
                        f"llmgw up: the example replicas are not all READY after "
                        f"{p.ready_timeout_s:.0f} s; `llmgw ctl replica list` says why, the "
                        f"engines' logs are in {p.data / 'agent' / 'logs'}. "
                        "The control plane keeps running."
                    )
                ready = got or []
                self.complete = got is not None
        if self.stop.is_set():
            return 0
        self.banner(files_url, planner_address, fleet_address, ready, llama_server)
        return self.serve()

    def banner(
        self,
        files_url: str,
        planner: str,
        fleet: str,
        ready: Sequence[fleet_pb2.Replica],
        llama_server: str | None,
    ) -> None:
        """Where everything listens and how to use it."""
        p = self.plan
        prog = command_name()
        fleet_flag = "" if fleet == "127.0.0.1:50052" else f" --fleet {fleet}"
        planner_flag = "" if planner == "127.0.0.1:50051" else f" --planner {planner}"
        lines = [
            "llmgw up: ready" if self.complete else "llmgw up: running (see above)",
            f"  planner  {planner}",
            f"  fleet    {fleet}   (store {p.data / 'fleet.db'})",
            f"  files    {files_url}   (HF_ENDPOINT of the children: the demo's hf:// repo)",
        ]
        if p.agent:
            engine = f"llama.cpp on {llama_server}" if llama_server else "stand-in engines"
            lines.append(f"  agent    node {p.node}, {p.gpus} stand-in cards, {engine}")
        else:
            lines.append("  agent    none (--no-agent): replicas stay PENDING until one connects")
        lines.append(f"  logs     {p.logs}")
        for r in ready:
            lines.append(f"  replica  {r.model}/{r.profile} ({r.engine}) at http://{r.address}")
        lines += [
            "",
            "Try:",
            f"  {prog} ctl{fleet_flag} model list",
            f"  {prog} ctl{fleet_flag} replica list",
            f"  {prog} ctl{fleet_flag} model show tiny-llama-hf",
            f"  {prog} ctl{fleet_flag} node list",
            f"  {prog} ctl{fleet_flag} replica watch",
            f"  {prog} ctl{fleet_flag} model gpus tiny-llama-hf 2",
            f"  {prog} ctl{fleet_flag} model context tiny-llama-gguf 16384",
            f"  {prog} plan{planner_flag} describe hf://llmgw-demo/tiny-llama",
        ]
        for r in ready:
            if r.model == "tiny-llama-gguf":
                lines.append(
                    f"  curl -s http://{r.address}/v1/completions -H 'Content-Type: "
                    f'application/json\' -d \'{{"model": "{r.model}", "prompt": '
                    f'"hello", "max_tokens": 8}}\''
                )
        lines.append("Ctrl-C stops everything.")
        self.say("\n".join(lines))

    def serve(self) -> int:
        """Run until signalled; a child that exits on its own stops everything."""
        while not self.stop.wait(0.5):
            for child in self.children:
                if not child.running():
                    code = child.proc.returncode if child.proc else None
                    self.say(
                        f"llmgw up: the {child.name} exited (code {code}); its log "
                        f"({child.log_path}) ends:\n{child.tail()}\nstopping the rest"
                    )
                    return EXIT_FAILED
        return 0

    def shutdown(self) -> None:
        """Stop the children: agent first (it stops its engines), then fleet, planner and file
        server."""
        order = ("agent", "fleet", "planner", "files")
        for child in sorted(self.children, key=lambda c: order.index(c.name)):
            if child.proc is not None:
                code = child.stop()
                self.say(f"llmgw up: {child.name} stopped (code {code})")


def run(opts: argparse.Namespace) -> int:
    """Run `llmgw up`; its exit code."""
    try:
        plan = build_plan(opts)
    except UpError as exc:
        print(f"llmgw up: {exc}", file=sys.stderr)
        return EXIT_USAGE
    up = Up(plan)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        up.stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return up.run()
    except UpError as exc:
        if up.stop.is_set():
            # Ctrl-C or SIGTERM while starting: not a failure.
            return 0
        print(f"llmgw up: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        up.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `up` to the `llmgw` parser's subcommands."""
    up: argparse.ArgumentParser = sub.add_parser(
        "up",
        help="run the whole control plane here, with an example catalog",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    up.add_argument("--data", default="data", help="folder for the store, logs and model files")
    up.add_argument("--host", default="127.0.0.1", help="address every service listens on")
    up.add_argument("--planner-port", type=int, default=50051, help="0 picks a free port")
    up.add_argument("--fleet-port", type=int, default=50052, help="0 picks a free port")
    up.add_argument("--files-port", type=int, default=50053, help="the demo's file server")
    up.add_argument("--gpus", default="4xH100-80GB", help="the local agent's stand-in cards")
    up.add_argument("--node", default="local", help="the local agent's node name")
    up.add_argument("--no-agent", action="store_true", help="start no agent")
    up.add_argument(
        "--ready-timeout",
        type=float,
        default=120.0,
        help="seconds to wait for the example replicas to be READY",
    )
    up.set_defaults(run=run)
    # Bad usage exits 64, as every llmgw command's does.
    setattr(up, "error", UsageParser.error.__get__(up))  # noqa: B010
    return up
