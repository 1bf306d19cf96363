"""The terminal conventions of every entry point (llmgw.cmdline): bad usage exits 64,
`--version` answers, every flag is explained with its default and variable, every `llmgw`
command's help ends with an example, and the exit codes' one table is the documented one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.build import build_info
from llmgw.cmdline import EXIT_USAGE, exit_code_table
from tests.support.parsers import ENTRY_POINTS, MODULES, clean_environment, parser_of, walk

ROOT = Path(__file__).resolve().parents[2]

BAD_USAGE = [
    ("llmgw", ["nosuch"]),
    ("llmgw", []),
    ("llmgw", ["ctl", "model", "list", "--bogus"]),
    ("llmgw", ["ctl", "model", "gpus", "qwen", "two"]),
    ("llmgw", ["ctl", "apply"]),
    ("llmgw", ["ctl", "model", "list", "-o", "toml"]),
    ("llmgw", ["ctl", "model", "list", "-o", "jsonpath={.models[?(@.x)]}"]),
    ("llmgw", ["plan", "--bogus"]),
    ("llmgw", ["plan", "describe"]),
    ("llmgw", ["up", "--bogus"]),
    ("llmgw", ["certs", "node"]),
    ("llmgw", ["completion", "tcsh"]),
    ("planner", ["--bogus"]),
    ("fleet", ["--bogus"]),
    ("fleet", ["--heartbeat-s", "soon"]),
    ("agent", ["--bogus"]),
    ("agent", []),  # --fleet is required
    ("demo", ["--bogus"]),
]


def _run(name: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "100", "HOME": str(ROOT)}
    return subprocess.run(
        [sys.executable, *MODULES[name], *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
        check=False,
    )


@pytest.mark.parametrize(("name", "args"), BAD_USAGE)
def test_bad_usage_exits_64_everywhere(name: str, args: list[str]) -> None:
    """A real child process of each entry point, given a command line it cannot use, prints
    its usage and the error on stderr and exits 64 (EX_USAGE), not argparse's 2."""
    done = _run(name, args)
    assert done.returncode == EXIT_USAGE, (done.returncode, done.stderr)
    assert "usage:" in done.stderr and "error:" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_unknown_flag_is_named_as_the_command_s() -> None:
    """A flag no command took is reported with the command's own usage, not the root's."""
    done = _run("llmgw", ["ctl", "model", "list", "--bogus"])
    assert "usage: llmgw ctl model list" in done.stderr
    assert "llmgw ctl model list: error: unrecognized arguments: --bogus" in done.stderr


VERSION = re.compile(
    r"^(?P<prog>.+) (?P<version>\d+\.\d+\.\d+\S*) \(commit (?P<commit>[0-9a-f]{7,40}|unknown), "
    r"Python (?P<python>\d+\.\d+\.\d+\S*)\)$"
)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_version_on_every_entry_point(name: str) -> None:
    """`--version` prints the package's version, the commit and Python's version, exit 0."""
    done = _run(name, ["--version"])
    assert done.returncode == 0, done.stderr
    match = VERSION.match(done.stdout.strip())
    assert match, done.stdout
    info = build_info()
    assert match["version"] == info.version
    assert match["python"] == ".".join(map(str, sys.version_info[:3]))
    if (ROOT / ".git").exists():
        assert match["commit"] != "unknown"


def test_commit_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """An image build names its commit in LLMGW_BUILD_COMMIT; it wins over git."""
    monkeypatch.setenv("LLMGW_BUILD_COMMIT", "0123abcd")
    done = subprocess.run(
        [sys.executable, "-m", "planner_svc", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "(commit 0123abcd," in done.stdout


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_every_flag_has_a_sentence(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each flag of each command is explained (help hidden only for the `ctl` flags a
    command repeats, which `llmgw ctl --help` explains); none prints a module docstring."""
    clean_environment(monkeypatch)
    for path, parser in walk(parser_of(name)):
        for action in parser._actions:
            if not action.option_strings:
                continue
            if action.help == "==SUPPRESS==":
                assert path[:1] == ("ctl",), (path, action.option_strings)
                continue
            assert action.help and len(action.help) > 8, (path, action.option_strings)
        text = parser.format_help()
        assert "llmgw.cli." not in text and "(Some " not in text, path


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_env_flags_are_named_in_help(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flag whose default a variable gives says which (`env LLMGW_FLEET`), and a flag with
    a default says it."""
    clean_environment(monkeypatch)
    parser = parser_of(name)
    text = " ".join(p.format_help() for _, p in walk(parser))
    flat = " ".join(text.split())
    wanted = {
        "llmgw": ["env LLMGW_FLEET", "env LLMGW_PLANNER", "env LLMGW_DATA", "env LLMGW_TOKEN"],
        "planner": ["env LLMGW_PLANNER_LISTEN", "LLMGW_TRACE", "default 127.0.0.1:50051"],
        "fleet": ["env LLMGW_FLEET_LISTEN", "env LLMGW_FLEET_STORE", "env LLMGW_FLEET_TOKENS"],
        "agent": ["env LLMGW_FLEET", "LLMGW_AGENT_SOURCE_ROOTS"],
        "demo": ["default 127.0.0.1:50053", "default data/models"],
    }[name]
    for phrase in wanted:
        assert phrase in flat, phrase


def test_every_llmgw_command_ends_with_an_example(monkeypatch: pytest.MonkeyPatch) -> None:
    """`llmgw <cmd> --help`, for every command and group, ends with an example command."""
    clean_environment(monkeypatch)
    for path, parser in walk(parser_of("llmgw")):
        lines = parser.format_help().rstrip().splitlines()
        assert "example:" in lines, path
        tail = lines[lines.index("example:") + 1 :]
        assert tail and all(line.startswith("  ") and ("llmgw" in line) for line in tail), (
            path,
            tail,
        )


def test_exit_codes_table_is_the_documented_one() -> None:
    """docs/cli.md holds the one table of exit codes, as llmgw.cmdline defines them; the
    README points at it."""
    doc = (ROOT / "docs" / "cli.md").read_text()
    assert exit_code_table() in doc
    assert "docs/cli.md" in (ROOT / "README.md").read_text()
