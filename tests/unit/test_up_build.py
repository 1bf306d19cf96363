"""The background llama-server build of `llmgw up --build-llama-server`: its phase read from
the build's log (the script's steps, make's and ninja's counters), told only when it moved on,
and the build command a test may put in its place."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from llmgw.cli.up_build import ENV_BUILD, SCRIPT, BuildPhase, EngineBuild, build_command, phase_of

STEPS = [
    "[llama-server] downloading the llama-cpp-python 0.3.36 source distribution",
    "[llama-server] unpacking llama_cpp_python-0.3.36.tar.gz",
    "[llama-server] configuring (-DCMAKE_BUILD_TYPE=Release ...)",
    "[llama-server] compiling llama-server and libllama with 2 jobs (about ten minutes)",
]


@pytest.mark.parametrize(
    ("lines", "phase"),
    [
        ([], BuildPhase("starting")),
        (STEPS[:1], BuildPhase("downloading the llama.cpp sources")),
        (STEPS[:3], BuildPhase("configuring")),
        # A percentage before compiling (configure's own output) is not the compile's.
        ([*STEPS[:3], "[ 50%] something"], BuildPhase("configuring")),
        (
            [*STEPS, "[ 12%] Building C object", "[ 43%] Building CXX object"],
            BuildPhase("compiling", 43),
        ),
        ([*STEPS, "[57/228] Building CXX object"], BuildPhase("compiling", 25)),
        (
            [*STEPS, "[228/228] Linking", "[llama-server] built /x/llama-server in 840 s"],
            BuildPhase("built"),
        ),
        (
            ["[llama-server] up to date: /x/llama-server (llama-cpp-python 0.3.36)"],
            BuildPhase("built"),
        ),
    ],
)
def test_the_phase_is_the_last_step_and_the_compile_counter_after_it(
    lines: list[str], phase: BuildPhase
) -> None:
    """What `llmgw up` says of a build from the lines it logged so far."""
    assert phase_of(lines) == phase


def test_the_build_is_the_script_unless_the_environment_names_another() -> None:
    """The project's script by default; $LLMGW_LLAMA_SERVER_BUILD's words when set."""
    assert build_command({}) == ["bash", str(SCRIPT)] and SCRIPT.is_file()
    assert build_command({ENV_BUILD: "python3 '/a b/fake.py'"}) == ["python3", "/a b/fake.py"]


def test_news_comes_once_per_phase_and_per_ten_percent(tmp_path: Path) -> None:
    """A build's phase is told when it changes, and while compiling at each new tenth only, so
    `llmgw up` prints a handful of lines for a 14-minute build; its exit code once it ends."""
    script = tmp_path / "build.py"
    script.write_text(
        "print('[llama-server] compiling llama-server', flush=True)\n"
        "for n in (1, 2, 3, 15):\n"
        "    print(f'[{n}/20] Building', flush=True)\n"
    )
    build = EngineBuild(tmp_path, {ENV_BUILD: f"{sys.executable} {script}"}, sys.executable)
    build.start()
    assert build.child.proc is not None
    build.child.proc.wait(30)
    assert build.finished() == 0
    assert build.news() == "compiling 70%"
    assert build.news() is None
    build.stop()
