"""The agent's config file read: YAML into an AgentConfig, every key and value checked, each
refusal a ConfigError naming the key and what would work. See deploy/agent.example.yaml for
the file's shape."""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from fleet_svc.agent.admission import REFUSAL_TABLES, STANDIN_FLAGS, ArgRules
from fleet_svc.agent.backoff import Backoff, RestartLimit
from fleet_svc.agent.config import (
    DEFAULT_MODELS_PATH,
    MAX_VERSION_CHARS,
    STANDIN_MODULE,
    STANDIN_TEMPLATE,
    AgentConfig,
    ConfigError,
    EngineConfig,
    check_template,
    source_roots,
)
from fleet_svc.agent.fetch import DEFAULT_FETCH_MAX_BYTES
from fleet_svc.agent.secrets import SecretError, SecretRef, parse_env_value
from fleet_svc.agent.source_args import (
    LLAMACPP_SOURCE_ARGS,
    SOURCE_KINDS,
    pins_revision,
    uses_source,
)
from llmgw import strict
from llmgw.engines.revision import revision_flag


def _number(data: Mapping[str, Any], key: str, default: float, where: str) -> float:
    value = data.get(key, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{where}: {strict.wrong_type(key, 'a number >= 0', value)}")
    return float(value)


CONFIG_KEYS = (
    "engines",
    "restart",
    "unhealthy_after",
    "health_interval_s",
    "health_timeout_s",
    "log_max_bytes",
    "log_tail_lines",
    "engine_host",
    "advertise_host",
    "source_roots",
    "fetch_max_bytes",
)
"""The agent config's top-level keys (deploy/agent.example.yaml)."""
RESTART_KEYS = ("base_s", "factor", "cap_s", "jitter", "max_crashes", "window_s")
"""The keys under `restart:`."""


def _string(data: Mapping[str, Any], key: str, default: str, where: str) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {strict.wrong_type(key, 'a string', value)}")
    return value


def _str_list(value: Any, key: str, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str | int) for v in value):
        raise ConfigError(f"{where}: {key} must be a list of strings")
    return tuple(str(v) for v in value)


def parse_engine(
    name: str, data: Any, which: Callable[[str], str | None] = shutil.which
) -> EngineConfig:
    """One engine from its config entry.

    Raises:
        ConfigError: a key is missing or malformed, or the executable cannot be found.
    """
    where = f"engine {name}"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a mapping with executable or module")
    known = {
        "executable",
        "module",
        "args",
        "family",
        "health_path",
        "start_timeout_s",
        "stop_grace_s",
        "env",
        "allow_flags",
        "refuse_flags",
        "source_args",
        "worker_executable",
        "version",
        "models_path",
        "fetch_urls",
    }
    unknown = strict.unknown_keys(data, known, f"engines.{name}")
    if unknown:
        raise ConfigError("; ".join(unknown))
    executable, module = data.get("executable"), data.get("module")
    if (executable is None) == (module is None):
        raise ConfigError(f"{where}: give exactly one of executable (a path) or module")
    if module is not None:
        if not isinstance(module, str) or not re.fullmatch(r"[A-Za-z_][\w.]*", module):
            raise ConfigError(f"{where}: module must be a dotted Python module name")
        program: tuple[str, ...] = (sys.executable, "-m", module)
    else:
        if not isinstance(executable, str) or not executable:
            raise ConfigError(f"{where}: executable must be a path")
        # A bare name is looked up on PATH once, here, so what runs is fixed at start. An
        # absolute path may be installed after the agent starts: `missing_executables` tells.
        found = executable if os.path.isabs(executable) else which(executable)
        if found is None:
            raise ConfigError(
                f"{where}: executable {executable!r} is not on PATH; give its absolute path"
            )
        program = (found,)
        module = ""
    family = data.get("family", name)
    if family not in REFUSAL_TABLES:
        raise ConfigError(
            f"{where}: family {family!r} unknown; one of {sorted(REFUSAL_TABLES)} sets "
            "which argument refusals apply"
        )
    health_path = data.get("health_path", "/health")
    if not isinstance(health_path, str) or not health_path.startswith("/"):
        raise ConfigError(f"{where}: health_path must start with /")
    models_path = data.get("models_path", DEFAULT_MODELS_PATH)
    if not isinstance(models_path, str) or (models_path and not models_path.startswith("/")):
        raise ConfigError(f'{where}: models_path must start with / (or be "" for none)')
    fetch_urls = data.get("fetch_urls", family == "llamacpp")
    if not isinstance(fetch_urls, bool):
        raise ConfigError(f"{where}: fetch_urls must be true or false")
    env = data.get("env", {}) or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) for k in env):
        raise ConfigError(f"{where}: env must map names to values")
    try:
        env_values = {k: parse_env_value(k, v, where) for k, v in env.items()}
    except SecretError as exc:
        raise ConfigError(str(exc)) from exc
    refuse = data.get("refuse_flags", {}) or {}
    if not isinstance(refuse, dict) or not all(isinstance(v, str) for v in refuse.values()):
        raise ConfigError(f"{where}: refuse_flags maps each flag to why it is refused")
    source_args_data = data.get("source_args", {}) or {}
    if not isinstance(source_args_data, dict) or not set(source_args_data) <= set(SOURCE_KINDS):
        raise ConfigError(f"{where}: source_args maps {list(SOURCE_KINDS)} to argument lists")
    source_args = {
        str(kind): _str_list(items, f"source_args.{kind}", where)
        for kind, items in source_args_data.items()
    }
    if family == "llamacpp" and not source_args:
        source_args = dict(LLAMACPP_SOURCE_ARGS)
    template = check_template(name, _str_list(data.get("args"), "args", where) or STANDIN_TEMPLATE)
    worker = data.get("worker_executable")
    worker_program: tuple[str, ...] = ()
    if worker is not None:
        if not isinstance(worker, str) or not worker:
            raise ConfigError(f"{where}: worker_executable must be a path (llama.cpp's rpc-server)")
        found_worker = worker if os.path.isabs(worker) else which(worker)
        if found_worker is None:
            raise ConfigError(
                f"{where}: worker_executable {worker!r} is not on PATH; give its absolute path"
            )
        worker_program = (found_worker,)
    elif module == STANDIN_MODULE:
        worker_program = (sys.executable, "-m", STANDIN_MODULE, "--rpc-server")
    version = data.get("version", "")
    if isinstance(version, int | float) and not isinstance(version, bool):
        version = str(version)
    if not isinstance(version, str) or len(version) > MAX_VERSION_CHARS or "\n" in version:
        raise ConfigError(
            f"{where}: version must be a string of at most {MAX_VERSION_CHARS} characters, "
            'e.g. "0.10.2"'
        )
    return EngineConfig(
        name=name,
        program=program,
        template=template,
        rules=ArgRules(
            family=family,
            allow=frozenset(_str_list(data.get("allow_flags"), "allow_flags", where)),
            refuse=dict(refuse),
            extra=STANDIN_FLAGS if module == STANDIN_MODULE else (),
            needs_source=uses_source(template),
            pins_revision=pins_revision(template, source_args, family),
        ),
        revision_flag=revision_flag(family),
        health_path=health_path,
        start_timeout_s=_number(data, "start_timeout_s", 600.0, where),
        stop_grace_s=_number(data, "stop_grace_s", 30.0, where),
        env={k: v for k, v in env_values.items() if isinstance(v, str)},
        secret_env={k: v for k, v in env_values.items() if isinstance(v, SecretRef)},
        module=module,
        source_args=source_args,
        worker_program=worker_program,
        version=version.strip(),
        models_path=models_path,
        fetch_urls=fetch_urls,
    )


def parse_config(
    data: Any, where: str = "the agent config", which: Callable[[str], str | None] = shutil.which
) -> AgentConfig:
    """An agent config from parsed YAML.

    Raises:
        ConfigError: the data does not have the documented shape.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a mapping")
    unknown = strict.unknown_keys(data, CONFIG_KEYS)
    if unknown:
        raise ConfigError(f"{where}: {'; '.join(unknown)}")
    engines_data = data.get("engines")
    if not isinstance(engines_data, dict) or not engines_data:
        raise ConfigError(f"{where}: engines must map at least one engine name to its settings")
    engines = {}
    for name, entry in engines_data.items():
        if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9][a-z0-9_.\-]*", name):
            raise ConfigError(f"{where}: engine name {name!r} must be lower-case letters/digits")
        engines[name] = parse_engine(name, entry, which)
    restart = data.get("restart", {}) or {}
    if not isinstance(restart, dict):
        raise ConfigError(f"{where}: {strict.wrong_type('restart', 'a mapping', restart)}")
    unknown = strict.unknown_keys(restart, RESTART_KEYS, "restart")
    if unknown:
        raise ConfigError(f"{where}: {'; '.join(unknown)}")
    try:
        backoff = Backoff(
            base_s=_number(restart, "base_s", 1.0, f"{where}: restart"),
            factor=_number(restart, "factor", 2.0, f"{where}: restart"),
            cap_s=_number(restart, "cap_s", 60.0, f"{where}: restart"),
            jitter=_number(restart, "jitter", 0.2, f"{where}: restart"),
        )
    except ValueError as exc:
        raise ConfigError(f"{where}: restart: {exc}") from exc
    max_crashes = restart.get("max_crashes", 5)
    if not isinstance(max_crashes, int) or isinstance(max_crashes, bool) or max_crashes < 1:
        raise ConfigError(
            f"{where}: "
            + strict.wrong_type("restart.max_crashes", "a whole number >= 1", max_crashes)
        )
    unhealthy_after = data.get("unhealthy_after", 3)
    if (
        not isinstance(unhealthy_after, int)
        or isinstance(unhealthy_after, bool)
        or unhealthy_after < 1
    ):
        raise ConfigError(
            f"{where}: "
            + strict.wrong_type("unhealthy_after", "a whole number >= 1", unhealthy_after)
        )
    return AgentConfig(
        engines=engines,
        health_interval_s=_number(data, "health_interval_s", 1.0, where) or 1.0,
        health_timeout_s=_number(data, "health_timeout_s", 2.0, where) or 2.0,
        unhealthy_after=unhealthy_after,
        restart_backoff=backoff,
        restart_limit=RestartLimit(
            max_crashes=max_crashes,
            window_s=_number(restart, "window_s", 300.0, f"{where}: restart"),
        ),
        log_max_bytes=int(_number(data, "log_max_bytes", 10 << 20, where)),
        log_tail_lines=int(_number(data, "log_tail_lines", 20, where)),
        engine_host=_string(data, "engine_host", "127.0.0.1", where),
        advertise_host=_string(data, "advertise_host", "", where),
        source_roots=source_roots(_str_list(data.get("source_roots"), "source_roots", where)),
        fetch_max_bytes=int(_number(data, "fetch_max_bytes", DEFAULT_FETCH_MAX_BYTES, where)),
    )


def load_config(path: Path) -> AgentConfig:
    """The agent config in a YAML file.

    Raises:
        ConfigError: the file cannot be read or is malformed.
    """
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the agent config {path}: {exc}") from exc
    return parse_config(data, str(path))
