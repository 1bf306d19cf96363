"""What this build is: the package's version (its installed metadata, from pyproject.toml),
the git commit it was built from when that is cheaply known, and the Python running it. One
answer for `--version` on every entry point, `llmgw_build_info` on every metrics endpoint
(llmgw.metrics) and `service.version` on traces (llmgw.tracing).

The commit is $LLMGW_BUILD_COMMIT when set (an image build sets it: deploy/Dockerfile), else
`git rev-parse` in the source tree when the package runs from a checkout (an editable
install), else "unknown". It is asked once per process, and only when something prints it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

DISTRIBUTION = "llmgw-control-plane"
"""The distribution's name in pyproject.toml."""
ENV_COMMIT = "LLMGW_BUILD_COMMIT"
GIT_TIMEOUT_S = 2.0
"""The longest `git rev-parse` may take before the commit is reported unknown."""
UNKNOWN = "unknown"


@dataclass(frozen=True)
class BuildInfo:
    """This build: the distribution's version, the commit (or "unknown") and Python's."""

    version: str
    commit: str
    python: str

    def line(self, prog: str) -> str:
        """The `--version` line: `PROG VERSION (commit C, Python P)`."""
        return f"{prog} {self.version} (commit {self.commit}, Python {self.python})"


def package_version() -> str:
    """The installed distribution's version ("0+unknown" when it is not installed)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def _git_commit(tree: Path) -> str:
    """The checkout's commit at `tree` (12 hex digits), or "unknown"."""
    if not (tree / ".git").exists():
        return UNKNOWN
    try:
        done = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN
    commit = done.stdout.strip()
    if done.returncode != 0 or not commit or not all(c in "0123456789abcdef" for c in commit):
        return UNKNOWN
    return commit


@functools.cache
def build_info() -> BuildInfo:
    """This process's build (asked once)."""
    told = os.environ.get(ENV_COMMIT, "").strip()
    commit = told[:40] if told else _git_commit(Path(__file__).resolve().parent.parent)
    return BuildInfo(package_version(), commit, platform.python_version())
