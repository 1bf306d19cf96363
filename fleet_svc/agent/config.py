"""The agent's own config: which engines it runs and how, read from YAML or defaulted.

The config is the agent's trust boundary: the fleet names an engine, and only an engine named
here runs, as the executable and argument template written here. The file itself is read by
config_file.py; see deploy/agent.example.yaml for its shape.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleet_svc.agent.admission import REFUSAL_TABLES, STANDIN_FLAGS, ArgRules
from fleet_svc.agent.backoff import Backoff, RestartLimit
from fleet_svc.agent.fetch import DEFAULT_FETCH_MAX_BYTES
from fleet_svc.agent.replica import ReplicaSpec
from fleet_svc.agent.secrets import SecretRef
from fleet_svc.agent.source_args import LLAMACPP_SOURCE_ARGS as LLAMACPP_SOURCE_ARGS
from fleet_svc.agent.source_args import SOURCE_KINDS as SOURCE_KINDS
from fleet_svc.agent.source_args import not_a_flag, pin_items, pins_revision, source_parts
from fleet_svc.agent.source_args import uses_source as uses_source

# How llama-server is found (the operator's $LLMGW_LLAMA_SERVER, PATH, the build cache) is
# shared with `llmgw up`; the agent's callers import it from here.
from llmgw.engines.revision import revision_flag, source_revision
from llmgw.llama_server import LLAMA_SERVER_ENV as LLAMA_SERVER_ENV
from llmgw.llama_server import find_llama_server as find_llama_server

STANDIN_MODULE = "fleet_svc.standin"

MAX_VERSION_CHARS = 64
"""An engine's version as the config may write it (and the agent reports it)."""

PLACEHOLDERS = frozenset(
    {"model", "port", "host", "args", "source", "source_args", "engine", "replica_id", "profile"}
)
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")

# Stand-in engines: one argument template for every engine they stand in for. `{engine}` lets
# the stand-in answer like the engine it replaces (its error wording, `owned_by`).
STANDIN_TEMPLATE = (
    "--host",
    "{host}",
    "--port",
    "{port}",
    "--model",
    "{model}",
    "--engine",
    "{engine}",
    "{args}",
)
# llama-server: the model from the replica's source, served under the catalog's name.
LLAMACPP_TEMPLATE = (
    "--host",
    "{host}",
    "--port",
    "{port}",
    "{source_args}",
    "--alias",
    "{model}",
    "{args}",
)
DEFAULT_MODELS_PATH = "/v1/models"
"""Where vLLM, SGLang, trtllm-serve and llama-server list the models they serve (an
OpenAI-shaped `{"data": [{"id": NAME}, ...]}`); llama-server in router mode, started with no
model, answers /health 200 and lists none."""


class ConfigError(ValueError):
    """The agent's config cannot be used; the message names the key and what would work."""


@dataclass(frozen=True)
class EngineConfig:
    """How the agent runs one engine.

    `program` is the executable and any fixed leading arguments (for a Python module: the
    agent's own interpreter, `-m`, the module); `template` the arguments after it, with
    `{placeholders}` filled per replica and `{args}` standing for the profile's arguments.
    """

    name: str
    program: tuple[str, ...]
    template: tuple[str, ...]
    rules: ArgRules
    health_path: str = "/health"
    start_timeout_s: float = 600.0
    stop_grace_s: float = 30.0
    env: Mapping[str, str] = field(default_factory=dict)
    secret_env: Mapping[str, SecretRef] = field(default_factory=dict)
    """Variables whose values the agent resolves at each start (`fleet_svc.agent.secrets`):
    never in the fleet's hands, never logged."""
    module: str = ""
    source_args: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    worker_program: tuple[str, ...] = ()
    """What a gang's worker ranks run when the engine splits its gang into a server and
    workers (llama.cpp's `rpc-server`); empty: this agent runs no such worker."""
    version: str = ""
    """The engine's version as the node reports it (the config's `version`, else found at
    start: `fleet_svc.agent.versions`); "" when not known."""
    revision_flag: tuple[str, ...] = ()
    """How the engine is given a pinned revision of an hf:// source (its family's flag,
    `llmgw.engines.revision`); () when it has none."""
    fetch_urls: bool = False
    """An http(s) source is fetched by the agent into its model cache (`fleet_svc.agent.fetch`)
    and the engine given the local file (its `path` source_args) instead of the URL: the
    default for llama.cpp, whose own fetching needs a build with TLS."""
    models_path: str = DEFAULT_MODELS_PATH
    """The engine's list of the models it serves (OpenAI's `GET /v1/models`): a replica is
    HEALTHY only once its health path answers 200 and this list names its served model; ""
    for an engine that has no such list (health alone then)."""

    def fetches(self, source: str) -> bool:
        """Whether the agent fetches `source` for this engine before starting it."""
        return (
            self.fetch_urls
            and "{source_args}" in self.template
            and source.startswith(("http://", "https://"))
        )

    def served_name(self, spec: ReplicaSpec) -> str:
        """The name the engine serves `spec`'s model under: the catalog's where the template
        gives it (`{model}`: vLLM's and SGLang's --served-model-name, llama-server's
        --alias); for TensorRT-LLM, whose `trtllm-serve` has no such flag, the name it was
        given the model by (tensorrt_llm/commands/serve.py: OpenAIServer(model=model)); ""
        when the template does not say (then any model listed will do)."""
        if self.rules.family == "trtllm" and spec.source and uses_source(self.template):
            return source_parts(spec.source)[1]
        if any("{model}" in part for part in self.template):
            return spec.model or spec.replica_id
        return ""

    def command(self, spec: ReplicaSpec, host: str, port: int) -> list[str]:
        """The argv that runs `spec` on `host:port`: program, then the filled template.

        Profile arguments are inserted as they are, each one argument: nothing in them is
        expanded (a `{port}` inside a profile argument stays literal). `{source_args}` becomes
        the items `source_args` gives for the source's kind, `{value}` filled (the bare value
        for a kind it does not name).
        """
        revision = source_revision(spec.source)
        values = {
            "model": spec.model or spec.replica_id,
            "port": str(port),
            "host": host,
            "source": spec.source,
            "engine": self.name,
            "replica_id": spec.replica_id,
            "profile": spec.profile,
        }
        argv = list(self.program)
        for part in self.template:
            if part == "{args}":
                argv.extend(spec.args)
            elif part == "{source_args}":
                kind, value = source_parts(spec.source)
                not_a_flag(value)
                items = self.source_args.get(kind, ("{value}",))
                # `{revision}` in an item is the pin; with none, items holding it are left out.
                argv.extend(
                    item.replace("{value}", value).replace("{revision}", revision)
                    for item in items
                    if revision or "{revision}" not in item
                )
                if kind == "hf":
                    pin = pin_items(
                        items, revision, self.revision_flag, spec.args, self.rules.family
                    )
                    if pin is None:
                        # Admission refuses such a replica (`ArgRules.pins_revision`): never
                        # start an engine on another revision than the one sized.
                        raise ValueError(f"engine {self.name} cannot be given revision {revision}")
                    argv.extend(pin)
            else:
                if part == "{source}":
                    not_a_flag(spec.source)
                argv.append(_PLACEHOLDER.sub(lambda m: values[m.group(1)], part))
        return argv


@dataclass(frozen=True)
class AgentConfig:
    """The agent's settings: its engines and how it supervises them."""

    engines: Mapping[str, EngineConfig]
    health_interval_s: float = 1.0
    health_timeout_s: float = 2.0
    unhealthy_after: int = 3
    restart_backoff: Backoff = field(
        default_factory=lambda: Backoff(base_s=1.0, factor=2.0, cap_s=60.0, jitter=0.2)
    )
    restart_limit: RestartLimit = field(default_factory=RestartLimit)
    log_max_bytes: int = 10 << 20
    log_tail_lines: int = 20
    # The address engines listen on: loopback unless the gateway reaches nodes over the network.
    engine_host: str = "127.0.0.1"
    # What the agent reports as the engine's host (the node's name or IP for a remote gateway).
    advertise_host: str = ""
    # Folders local model sources may be in (real paths); none: no local source runs.
    source_roots: tuple[str, ...] = ()
    # The largest file the agent fetches into its model cache (engines with fetch_urls).
    fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES

    def arg_rules(self) -> dict[str, ArgRules]:
        """Engine name -> its argument rules: what admission needs."""
        return {name: e.rules for name, e in self.engines.items()}


def check_template(name: str, template: tuple[str, ...]) -> tuple[str, ...]:
    """`template` with `{args}` at its end when it does not say where the profile's arguments
    go; ConfigError for an unknown placeholder, or an `{args}`/`{source_args}` sharing an item
    or given twice."""
    for part in template:
        for placeholder in _PLACEHOLDER.findall(part):
            if placeholder not in PLACEHOLDERS:
                known = ", ".join("{" + p + "}" for p in sorted(PLACEHOLDERS))
                raise ConfigError(
                    f"engine {name}: unknown placeholder {{{placeholder}}} (known: {known})"
                )
        for whole in ("{args}", "{source_args}"):
            if whole in part and part != whole:
                raise ConfigError(f"engine {name}: {whole} must be a template item of its own")
    if template.count("{args}") > 1:
        raise ConfigError(f"engine {name}: {{args}} may appear once")
    if "{args}" not in template:
        template = (*template, "{args}")
    return template


def module_engine(
    name: str, module: str, template: tuple[str, ...], family: str, **extra: Any
) -> EngineConfig:
    """An engine run as `<the agent's python> -m <module>`."""
    checked = check_template(name, template)
    return EngineConfig(
        name=name,
        program=(sys.executable, "-m", module),
        template=checked,
        rules=ArgRules(
            family,
            extra=STANDIN_FLAGS if module == STANDIN_MODULE else (),
            needs_source=uses_source(checked),
            pins_revision=pins_revision(checked, extra.get("source_args", {}), family),
        ),
        module=module,
        revision_flag=revision_flag(family),
        **extra,
    )


def source_roots(paths: Sequence[str], where: str = "source_roots") -> tuple[str, ...]:
    """Folders local sources may be under, as real paths (symlinks resolved now: a source's
    real path is compared with them).

    Raises:
        ConfigError: a path that is not absolute.
    """
    out = []
    for path in paths:
        if not os.path.isabs(path):
            raise ConfigError(f"{where}: {path!r} must be an absolute path")
        out.append(os.path.realpath(path))
    return tuple(dict.fromkeys(out))


def missing_executables(config: AgentConfig) -> dict[str, str]:
    """Engine name -> its executable, for configured engines whose executable is not an
    executable file now (their replicas will crash until it is installed)."""
    return {
        name: e.program[0]
        for name, e in config.engines.items()
        if not (os.path.isfile(e.program[0]) and os.access(e.program[0], os.X_OK))
    }


def standin_engine(name: str, family: str | None = None) -> EngineConfig:
    """The stand-in engine under `name`, refusing the arguments `family` would refuse."""
    fam = family or name
    return module_engine(
        name,
        STANDIN_MODULE,
        STANDIN_TEMPLATE,
        fam if fam in REFUSAL_TABLES else "standin",
        # The stand-in "loads" in seconds; a minute is ample.
        start_timeout_s=60.0,
        stop_grace_s=5.0,
        # It stands in for llama.cpp's rpc-server too (a gang's worker ranks).
        worker_program=(sys.executable, "-m", STANDIN_MODULE, "--rpc-server"),
    )


def default_config(
    demo: bool = False,
    llama_server: str | None = None,
    base: AgentConfig | None = None,
    roots: Sequence[str] = (),
) -> AgentConfig:
    """The config an agent runs with when given none, or `base` with demo stand-ins added.

    Engines: `standin`; `llamacpp` when a llama-server executable is known; in demo mode the
    engines that cannot run here (vLLM, SGLang, TensorRT-LLM, and llama.cpp without a
    llama-server) are stood in for by the stand-in, each with its own argument refusals.
    `roots` are added to the folders local sources may be under (the agent's --source-root).
    """
    engines: dict[str, EngineConfig] = dict(base.engines) if base else {}
    if base is None:
        engines["standin"] = standin_engine("standin")
        if llama_server:
            engines["llamacpp"] = EngineConfig(
                name="llamacpp",
                program=(llama_server,),
                template=check_template("llamacpp", LLAMACPP_TEMPLATE),
                rules=ArgRules("llamacpp", needs_source=True, pins_revision=False),
                source_args=LLAMACPP_SOURCE_ARGS,
                start_timeout_s=300.0,
                stop_grace_s=10.0,
                fetch_urls=True,
            )
    if demo:
        for name in ("vllm", "sglang", "trtllm", "llamacpp"):
            engines.setdefault(name, standin_engine(name))
    if base is not None:
        return AgentConfig(
            **{
                **base.__dict__,
                "engines": engines,
                "source_roots": tuple(dict.fromkeys((*base.source_roots, *source_roots(roots)))),
            }
        )
    return AgentConfig(engines=engines, source_roots=source_roots(roots))
