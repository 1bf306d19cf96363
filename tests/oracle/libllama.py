"""Where the tests find the real llama.cpp library: the one `make llama-server`
(scripts/build_llama_server.sh) builds beside llama-server, so one build serves the server and
the tests.

The build leaves, under ~/.cache/llmgw/llama.cpp (or $LLMGW_LLAMA_CPP_HOME):
- lib/libllama.so and lib/libggml*.so, the shared libraries llama-server itself links;
- python/llama_cpp/, the llama-cpp-python source distribution's ctypes bindings, Python only.
A child process imports the bindings' `llama_cpp.llama_cpp` module (not the package's
`__init__`, which needs diskcache and jinja2) with LLAMA_CPP_LIB_PATH naming lib/, which those
bindings read to find libllama (llama_cpp/llama_cpp.py of the 0.3.36 sdist).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BUILD_HINT = (
    "the llama.cpp library is not built: run `make llama-server` (it builds llama-server and "
    "libllama into ~/.cache/llmgw/llama.cpp, about ten minutes once on 2 cores), or set "
    "LLMGW_SKIP_ORACLE=1 to skip the tests that run it"
)


def home() -> Path:
    """The folder the build installs into."""
    override = os.environ.get("LLMGW_LLAMA_CPP_HOME")
    return Path(override) if override else Path.home() / ".cache" / "llmgw" / "llama.cpp"


def child_env() -> dict[str, str]:
    """The environment of a child that imports the bindings: LLAMA_CPP_LIB_PATH set."""
    return {**os.environ, "LLAMA_CPP_LIB_PATH": str(home() / "lib"), "GGML_NO_BACKTRACE": "1"}


def import_code() -> str:
    """Python source that imports the ctypes bindings as `lib` (put first in a child's code)."""
    return f"""
import sys, types
sys.path.insert(0, {str(home() / "python")!r})
_pkg = types.ModuleType("llama_cpp")
_pkg.__path__ = [{str(home() / "python" / "llama_cpp")!r}]
sys.modules["llama_cpp"] = _pkg
import llama_cpp.llama_cpp as lib
"""


def built() -> bool:
    """Whether the build's library and bindings are there (cheap: no process started)."""
    return (home() / "lib" / "libllama.so").is_file() and (
        home() / "python" / "llama_cpp" / "llama_cpp.py"
    ).is_file()


def missing() -> str | None:
    """Why llama.cpp cannot be run here; None when its library loads in a child."""
    if not built():
        return f"{BUILD_HINT} (no {home() / 'lib' / 'libllama.so'})"
    probe = subprocess.run(
        [sys.executable, "-c", import_code() + "print(lib.llama_max_devices())"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=child_env(),
    )
    if probe.returncode != 0:
        return f"{BUILD_HINT}; loading it failed: {probe.stderr.strip()[-400:]}"
    return None
