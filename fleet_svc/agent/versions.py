"""Engine versions the node runs: from the agent's config, else asked of the engine itself.

The planner keys its memory rules by engine version (llmgw.engines.versions); a profile that
names none is sized by the version its nodes report. Where a version comes from, in order:
1. the engine's `version` in the agent config (the operator's word; the stand-in engines
   report theirs this way);
2. an engine run as a Python module: the installed distribution of its top package
   (`importlib.metadata`: the agent runs it with its own interpreter, so the same install);
3. an executable: `EXECUTABLE --version`, bounded in time and output (vLLM's CLI prints
   "0.10.2"; llama-server prints "version: 6123 (0c1e570)" on stderr).
An engine whose version cannot be told this way reports none.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import re
from collections.abc import Callable, Sequence
from dataclasses import replace

import structlog

from fleet_svc.agent.config import MAX_VERSION_CHARS, AgentConfig, EngineConfig

log = structlog.get_logger(__name__)

PROBE_TIMEOUT_S = 10.0
"""How long `--version` may take (an engine that imports torch first takes a few seconds)."""

PROBE_OUTPUT_BYTES = 64 << 10
"""What of its output is read: a version is in the first lines."""

_LLAMACPP = re.compile(r"version:\s*(\d+)\s*\(([0-9a-f]{6,40})\)")
_DOTTED = re.compile(r"(?<![\w.])v?(\d+\.\d+(?:\.\d+)?(?:[.+\-][0-9A-Za-z.+\-]*)?)")


def version_in(text: str) -> str:
    """The version an engine's `--version` output names: llama.cpp's build as "b6123
    (0c1e570)", else the first dotted number ("0.10.2", "0.9.1.dev705+g01220ce89"); "" when
    it names none."""
    found = _LLAMACPP.search(text)
    if found is not None:
        return f"b{found.group(1)} ({found.group(2)})"
    dotted = _DOTTED.search(text)
    return dotted.group(1)[:MAX_VERSION_CHARS] if dotted else ""


def module_version(module: str, lookup: Callable[[str], str] = importlib.metadata.version) -> str:
    """The installed version of the distribution a module belongs to ("" when none is)."""
    top = module.split(".", 1)[0]
    try:
        return lookup(top)[:MAX_VERSION_CHARS]
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return ""


async def probe_version(program: Sequence[str], timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """What `PROGRAM --version` says its version is ("" when it fails, is silent or is slow;
    a slow one is killed)."""
    try:
        process = await asyncio.create_subprocess_exec(
            *program,
            "--version",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except OSError:
        return ""
    assert process.stdout is not None
    try:
        output = await asyncio.wait_for(process.stdout.read(PROBE_OUTPUT_BYTES), timeout_s)
        await asyncio.wait_for(process.wait(), timeout_s)
    except TimeoutError:
        return ""
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    return version_in(output.decode(errors="replace"))


async def engine_version(engine: EngineConfig, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """One engine's version, from its config, its module's distribution or its --version."""
    if engine.version:
        return engine.version
    if engine.module:
        return module_version(engine.module)
    return await probe_version(engine.program, timeout_s)


async def with_versions(config: AgentConfig, timeout_s: float = PROBE_TIMEOUT_S) -> AgentConfig:
    """The config with each engine's version filled in (`engine_version`), asked in parallel."""
    names = sorted(config.engines)
    found = await asyncio.gather(*(engine_version(config.engines[n], timeout_s) for n in names))
    engines = dict(config.engines)
    for name, version in zip(names, found, strict=True):
        if version:
            engines[name] = replace(engines[name], version=version)
        else:
            log.info("engine_version_unknown", engine=name)
    return replace(config, engines=engines)


def reported_versions(config: AgentConfig) -> dict[str, str]:
    """Engine name -> version, for the engines whose version is known (what Hello carries)."""
    return {name: e.version for name, e in sorted(config.engines.items()) if e.version}
