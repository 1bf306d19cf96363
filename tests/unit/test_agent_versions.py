"""The engine versions an agent reports: from its config, a module's distribution, or the
engine's own --version (real child processes), bounded in time."""

from __future__ import annotations

import asyncio
import importlib.metadata
import sys
from pathlib import Path

import pytest

from fleet_svc.agent.config import ConfigError
from fleet_svc.agent.config_file import parse_config, parse_engine
from fleet_svc.agent.versions import (
    module_version,
    probe_version,
    reported_versions,
    version_in,
    with_versions,
)


@pytest.mark.parametrize(
    ("output", "version"),
    [
        ("0.10.2\n", "0.10.2"),
        ("INFO 05-01 vllm version 0.9.1.dev705+g01220ce89\n", "0.9.1.dev705+g01220ce89"),
        ("version: 6123 (0c1e570)\nbuilt with cc (Debian 12.2.0) for x86_64\n", "b6123 (0c1e570)"),
        ("sglang v0.4.6.post1", "0.4.6.post1"),
        ("usage: engine [-h]\n", ""),
        ("", ""),
    ],
)
def test_version_in_reads_what_engines_print(output: str, version: str) -> None:
    """vLLM's dotted version, llama-server's build number and commit, or nothing."""
    assert version_in(output) == version


def script(tmp_path: Path, body: str) -> tuple[str, ...]:
    """A program (this interpreter running a script) whose --version runs `body`."""
    path = tmp_path / "engine.py"
    path.write_text(body)
    return (sys.executable, str(path))


def test_probe_reads_a_real_engines_version(tmp_path: Path) -> None:
    """A program asked --version answers on stderr, as llama-server does: the version is read."""
    program = script(
        tmp_path,
        "import sys\nassert sys.argv[1:] == ['--version']\n"
        "print('version: 4242 (abcdef1)', file=sys.stderr)\n",
    )
    assert asyncio.run(probe_version(program)) == "b4242 (abcdef1)"


def test_a_slow_or_missing_engine_reports_no_version(tmp_path: Path) -> None:
    """A --version that does not answer in time is killed and gives none, as does a program
    that is not there or fails."""
    slow = script(tmp_path, "import time\ntime.sleep(600)\n")
    assert asyncio.run(probe_version(slow, timeout_s=0.5)) == ""
    assert asyncio.run(probe_version((str(tmp_path / "absent"),))) == ""
    failing = script(tmp_path, "raise SystemExit('no such flag')\n")
    assert asyncio.run(probe_version(failing)) == ""


def test_module_engine_version_is_its_distributions() -> None:
    """A module engine's version is its top package's installed distribution's; none when
    that is not installed."""
    assert module_version("pytest.main") == importlib.metadata.version("pytest")
    assert module_version("no_such_package_here.server") == ""


def test_config_version_wins_and_is_reported(tmp_path: Path) -> None:
    """The config's version is reported as written (the stand-in's way), an executable's is
    asked of it, a module's unknown one is left out of Hello."""
    engine = tmp_path / "vllm-bin"
    engine.write_text('#!/bin/sh\n[ "$1" = --version ] && echo 0.10.2\n')
    engine.chmod(0o755)
    config = parse_config(
        {
            "engines": {
                "vllm": {"executable": str(engine)},
                "sglang": {"module": "fleet_svc.standin"},
                "llamacpp": {"module": "fleet_svc.standin", "version": "b6123"},
            }
        }
    )
    filled = asyncio.run(with_versions(config))
    assert reported_versions(filled) == {"llamacpp": "b6123", "vllm": "0.10.2"}


def test_config_version_must_be_a_short_string() -> None:
    """A version that is not a short string is refused with what would work."""
    with pytest.raises(ConfigError, match="version must be a string"):
        parse_engine("vllm", {"module": "fleet_svc.standin", "version": ["0.8"]})
    with pytest.raises(ConfigError, match="at most 64"):
        parse_engine("vllm", {"module": "fleet_svc.standin", "version": "1" * 65})
    assert parse_engine("vllm", {"module": "fleet_svc.standin", "version": 0.9}).version == "0.9"
