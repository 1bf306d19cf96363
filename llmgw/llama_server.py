"""Where llama.cpp's llama-server is found on this machine: the one rule the node agent and
`llmgw up` share. Pure lookup: nothing runs."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

LLAMA_SERVER_ENV = "LLMGW_LLAMA_SERVER"
"""Names the llama-server an operator wants run (a path to an executable)."""
BUILD_DIR = Path(".cache") / "llmgw" / "llama.cpp"
"""The build cache under $HOME (scripts/build_llama_server.sh, `make llama-server`): it holds
bin/llama-server beside the lib/ and python/ of the same build."""
BINARY = Path("bin") / "llama-server"
"""llama-server's place in the build cache."""
LLAMA_SERVER_CACHE = Path.home() / BUILD_DIR / BINARY
"""The build cache's llama-server for this process's $HOME."""


def find_llama_server(
    env: Mapping[str, str] = os.environ,
    which: Callable[[str], str | None] | None = None,
    cache: Path | None = None,
) -> str | None:
    """llama-server's path: $LLMGW_LLAMA_SERVER when set, else PATH's, else the build cache's.

    Args:
        env: the environment of whoever will run it: its $LLMGW_LLAMA_SERVER, its PATH and its
            HOME (for the build cache) are read.
        which: how PATH is searched; default: `env`'s PATH.
        cache: the build cache's llama-server; default HOME/.cache/llmgw/llama.cpp/bin/
            llama-server with `env`'s HOME.
    Returns:
        An executable's path, or None. A $LLMGW_LLAMA_SERVER that names no executable finds
        none: the build an operator named is not silently replaced by another one.
    """
    told = env.get(LLAMA_SERVER_ENV, "")
    if told:
        return told if _executable(Path(told)) else None
    on_path = (which or (lambda name: shutil.which(name, path=env.get("PATH"))))("llama-server")
    if on_path:
        return on_path
    built = cache or Path(env.get("HOME") or Path.home()) / BUILD_DIR / BINARY
    return str(built) if _executable(built) else None


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)
