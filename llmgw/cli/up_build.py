"""`llmgw up --build-llama-server`: llama.cpp's llama-server built in the background while the
control plane already runs, its phase told as it goes.

The build is scripts/build_llama_server.sh (what `make llama-server` runs), or the command
$LLMGW_LLAMA_SERVER_BUILD names (a test's stand-in for a 14-minute build). Its log is
DATA/logs/llama-server-build.log; its phase is read from the script's `[llama-server] …` lines
and the compile's own counters (`[ 43%]` from make, `[123/456]` from ninja).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from llmgw.cli.supervisor import Child

ENV_BUILD = "LLMGW_LLAMA_SERVER_BUILD"
"""A command to run instead of scripts/build_llama_server.sh (shell words; for tests)."""
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build_llama_server.sh"

_STEP = re.compile(r"^\[llama-server\]\s+(\S+)")
_PERCENT = re.compile(r"^\[\s*(\d{1,3})%\]")
_NINJA = re.compile(r"^\[(\d+)/(\d+)\]")
_PHASES = {
    "downloading": "downloading the llama.cpp sources",
    "unpacking": "unpacking the sources",
    "configuring": "configuring",
    "compiling": "compiling",
    "built": "built",
    "up": "built",
}


@dataclass(frozen=True)
class BuildPhase:
    """Where a build stands: its phase for people and, while compiling, how far (0..100;
    -1 when not known)."""

    phase: str
    percent: int = -1

    def text(self) -> str:
        """`compiling 43%`, `configuring`."""
        return f"{self.phase} {self.percent}%" if self.percent >= 0 else self.phase


def phase_of(lines: list[str]) -> BuildPhase:
    """The phase a build's log lines show (the last step named, the last counter after it)."""
    phase, percent = "starting", -1
    for line in lines:
        step = _STEP.match(line)
        if step:
            phase = _PHASES.get(step.group(1), phase)
            percent = -1
            continue
        if phase != "compiling":
            continue
        if m := _PERCENT.match(line):
            percent = min(int(m.group(1)), 100)
        elif (n := _NINJA.match(line)) and int(n.group(2)) > 0:
            percent = min(int(n.group(1)) * 100 // int(n.group(2)), 100)
    return BuildPhase(phase, percent)


def build_command(env: dict[str, str]) -> list[str]:
    """The build to run: $LLMGW_LLAMA_SERVER_BUILD's words, else the project's script."""
    told = env.get(ENV_BUILD, "").strip()
    return shlex.split(told) if told else ["bash", str(SCRIPT)]


class EngineBuild:
    """One background build: started once, asked how far it is, stopped with its whole
    process group (cmake's compilers too; the script resumes an interrupted build)."""

    def __init__(self, logs: Path, env: dict[str, str], python: str) -> None:
        self._env = {**env, "PYTHON": env.get("PYTHON", python)}
        self.child = Child(
            "llama-server-build",
            build_command(env),
            logs / "llama-server-build.log",
            stop_grace_s=10.0,
        )
        self._shown = ""

    @property
    def log_path(self) -> Path:
        """Where the build logs."""
        return self.child.log_path

    def start(self) -> None:
        """Start the build in its own session."""
        self.child.start(self._env)

    def phase(self) -> BuildPhase:
        """How far it is."""
        return phase_of(self.child.log_lines())

    def news(self) -> str | None:
        """The phase's text when it moved on since last asked (compiling in steps of 10 %),
        else None."""
        now = self.phase()
        text = now.text() if now.percent < 0 else f"{now.phase} {now.percent // 10 * 10}%"
        if text == self._shown:
            return None
        self._shown = text
        return text

    def finished(self) -> int | None:
        """The build's exit code once it ended; None while it runs."""
        return None if self.child.running() else self.child.exit_code()

    def stop(self) -> None:
        """End the build (its process group: the compilers it started) if it still runs."""
        proc = self.child.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(self.child.stop_grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.child.stop()
