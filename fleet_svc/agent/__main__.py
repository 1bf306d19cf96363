"""Run the node agent: `python -m fleet_svc.agent --fleet HOST:PORT --node NAME [...]`.
Exit codes: llmgw.cmdline's table (docs/cli.md): 0 stopped by a signal, 1 a config, card
list or TLS file it cannot use, 64 bad flags."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import structlog
from grpc_health.v1 import health, health_pb2
from prometheus_client import CollectorRegistry

from fleet_svc.agent.cards import CardSpecError, discover_cards
from fleet_svc.agent.config import (
    AgentConfig,
    ConfigError,
    default_config,
    find_llama_server,
    missing_executables,
)
from fleet_svc.agent.config_file import load_config
from fleet_svc.agent.metrics import add_agent_metrics
from fleet_svc.agent.replicas import ReplicaSet
from fleet_svc.agent.rpc.client import AgentClient, NodeIdentity
from fleet_svc.agent.runner_context import Spans
from fleet_svc.agent.versions import reported_versions, with_versions
from llmgw.cmdline import (
    EXIT_ERROR,
    UsageParser,
    add_env_argument,
    add_log_format_argument,
    add_version,
    log_format,
    set_env,
)
from llmgw.identity import NODE, IdentityError, identity_of_certificate
from llmgw.logs import configure_logging
from llmgw.metrics import MetricsServer, add_metrics_argument, start_metrics_server
from llmgw.probes import LIVENESS, ProbeServer, add_probe_argument, start_probe_server
from llmgw.tls import TLSConfigError, add_client_tls_arguments, client_tls_from_args
from llmgw.tracing import ChildSpans, add_trace_argument, configure_tracing

EPILOG = """\
cards: with --gpus or --gpus-file the agent is told its cards (stand-in cards: a stand-in
engine's memory claims show as memory in use); otherwise it asks NVML (nvidia-ml-py) and,
finding no driver or no devices, reports none (a CPU node).

engines: only those in --config run (see deploy/agent.example.yaml); without one, the stand-in
and, where llama-server is found ($LLMGW_LLAMA_SERVER, else PATH, else the build cache
~/.cache/llmgw/llama.cpp/bin that `make llama-server` fills), llama.cpp. --demo stands the
stand-in in for the engines that cannot run here (vllm, sglang, trtllm, llamacpp without a
llama-server), each refusing the arguments its engine would be refused.

shutdown: on SIGTERM or SIGINT the agent stops the replicas it runs (SIGTERM, then SIGKILL
after the engine's grace) before it exits: the fleet gives an agent that comes back its desired
replicas again, so nothing is lost but the engines' warm state. With --leave-replicas it leaves
them running; an agent started again with the same --state-dir adopts them instead of starting
them twice. SIGUSR1 stops the agent leaving them running this once, whatever --leave-replicas
says (`llmgw up` restarts its agent so when a llama-server it built lands).

example:
  python -m fleet_svc.agent --fleet fleet:50052 --tls-ca ca.crt --tls-cert node-gpu7.crt \\
      --tls-key node-gpu7.key --config agent.yaml
"""


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"label {text!r} is not KEY=VALUE")
    return key.strip(), value.strip()


def build_parser() -> argparse.ArgumentParser:
    """The agent's command line."""
    parser = UsageParser(
        prog="python -m fleet_svc.agent",
        description="The llmgw node agent: reports this node's cards and replicas to the "
        "fleet and runs the engine processes the fleet wants here.",
        epilog=EPILOG,
    )
    add_version(parser)
    add_env_argument(
        parser, "--fleet", env="LLMGW_FLEET", default="", help="the fleet's HOST:PORT (required)"
    )
    parser.add_argument(
        "--node",
        default=None,
        help="this node's name (default: the node name its --tls-cert carries, else the "
        "hostname); the fleet refuses a name other than its certificate's",
    )
    cards = parser.add_mutually_exclusive_group()
    cards.add_argument(
        "--gpus",
        help="the node's stand-in cards, e.g. 8xH100-80GB or 2xL4-24GB,1xA100-80GB (default: "
        "NVML's)",
    )
    cards.add_argument("--gpus-file", type=Path, help="a YAML file listing the node's cards")
    parser.add_argument(
        "--config",
        type=Path,
        help="the agent's engine config (YAML, see deploy/agent.example.yaml; default: the "
        "stand-in and llama.cpp)",
    )
    roots = parser.add_argument(
        "--source-root",
        action="append",
        default=[p for p in os.environ.get("LLMGW_AGENT_SOURCE_ROOTS", "").split(os.pathsep) if p],
        metavar="DIR",
        help="a folder local model sources may be in (repeat; added to the config's "
        "source_roots; default $LLMGW_AGENT_SOURCE_ROOTS, ':'-separated); a local source "
        "anywhere else is refused",
    )
    set_env(roots, "LLMGW_AGENT_SOURCE_ROOTS")
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="logs, run records and card claims (default ~/.cache/llmgw/agent/NODE)",
    )
    parser.add_argument(
        "--label",
        type=_label,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label of this node (repeatable)",
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="the engines that cannot run here are stood in for by the stand-in engine",
    )
    parser.add_argument(
        "--leave-replicas",
        action="store_true",
        help="on shutdown leave the engines running for the next agent to adopt "
        "(default: stop them)",
    )
    add_client_tls_arguments(parser)
    add_log_format_argument(parser)
    parser.add_argument(
        "--advertise-host",
        default=None,
        metavar="HOST",
        help="the host the agent reports for its engines' addresses (overrides the config's "
        "advertise_host; in Kubernetes the pod's IP)",
    )
    add_metrics_argument(parser)
    add_probe_argument(parser)
    add_trace_argument(parser)
    return parser


def build_config(config_path: Path | None, demo: bool, roots: Sequence[str] = ()) -> AgentConfig:
    """The agent config: the file's, else the default one; with demo stand-ins when asked,
    and `roots` added to the folders local sources may be in.

    Raises:
        ConfigError: the file cannot be used, or a root is not an absolute path.
    """
    if config_path is not None:
        base = load_config(config_path)
        return default_config(demo=demo, base=base, roots=roots)
    return default_config(demo=demo, llama_server=find_llama_server(), roots=roots)


def node_of_certificate(opts: argparse.Namespace) -> str | None:
    """The node name in the client certificate the flags (or LLMGW_TLS_*) give, if any."""
    try:
        tls = client_tls_from_args(opts)
        if tls is None or tls.cert is None:
            return None
        identity = identity_of_certificate(tls.cert.read_bytes())
    except (TLSConfigError, IdentityError, OSError):
        return None  # run_agent reports unusable TLS files; the hostname stands meanwhile
    return identity.name if identity.kind == NODE else None


PROBE_POLL_S = 1.0
"""How often the probe port's "" follows whether the stream to the fleet is up."""


async def _report_connected(client: AgentClient, servicer: health.aio.HealthServicer) -> None:
    """Keep the probe port's "" SERVING while the stream to the fleet is welcomed (readiness),
    `llmgw.liveness` SERVING throughout."""
    serving, not_serving = (
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    )
    await servicer.set(LIVENESS, serving)
    while True:
        await servicer.set("", serving if client.connected.is_set() else not_serving)
        await asyncio.sleep(PROBE_POLL_S)


async def run_agent(opts: argparse.Namespace, spans: Spans | None = None) -> None:
    """Run until SIGTERM/SIGINT, then stop (or leave) the replicas; `spans` where the agent
    traces (its replicas' starts and stops join the fleet's traces)."""
    log = structlog.get_logger("fleet_svc.agent").bind(node=opts.node)
    config = await with_versions(build_config(opts.config, opts.demo, opts.source_root))
    if opts.advertise_host:
        config = replace(config, advertise_host=opts.advertise_host)
    state_dir: Path = opts.state_dir or Path.home() / ".cache" / "llmgw" / "agent" / opts.node
    state_dir.mkdir(parents=True, exist_ok=True)
    cards = discover_cards(opts.gpus, opts.gpus_file, state_dir)
    tls = client_tls_from_args(opts)
    if tls is not None:
        tls.credentials()  # unreadable files fail now, not at every reconnection
    replicas = ReplicaSet(config, cards, state_dir, spans=spans)
    adopted = replicas.adopt()
    client = AgentClient(opts.fleet, NodeIdentity(opts.node, dict(opts.label)), replicas, tls=tls)
    log.info(
        "agent_started",
        fleet=opts.fleet,
        tls="mutual" if tls and tls.cert else "server" if tls else "none",
        cards=len(replicas.card_indices),
        card_source=cards.kind,
        engines=sorted(config.engines),
        engine_versions=reported_versions(config),
        adopted=[s.replica_id for s in adopted],
        state_dir=str(state_dir),
    )
    for engine, path in missing_executables(config).items():
        log.warning("engine_executable_missing", engine=engine, executable=path)
    stopping = asyncio.Event()
    leave = opts.leave_replicas

    def leave_them() -> None:
        nonlocal leave
        leave = True
        stopping.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    loop.add_signal_handler(signal.SIGUSR1, leave_them)
    metrics: MetricsServer | None = None
    if opts.metrics:
        registry = CollectorRegistry()
        add_agent_metrics(registry, client, replicas)
        metrics = await start_metrics_server(opts.metrics, registry)
    probes: ProbeServer | None = None
    watch: asyncio.Task[None] | None = None
    if opts.probe_listen:
        servicer = health.aio.HealthServicer()
        probes = await start_probe_server(opts.probe_listen, servicer)
        watch = asyncio.create_task(_report_connected(client, servicer))
    task = asyncio.create_task(client.run())
    await stopping.wait()
    log.info("agent_stopping", stop_replicas=not leave)
    for running in (task, watch):
        if running is not None:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
    if probes is not None:
        await probes.stop()
    if metrics is not None:
        await metrics.stop()
    await replicas.aclose(stop_replicas=not leave)
    log.info("agent_stopped")


def main(argv: list[str] | None = None) -> int:
    """Parse flags, configure logging, run until signalled; the exit code."""
    parser = build_parser()
    opts = parser.parse_args(argv)
    if not opts.fleet:
        parser.error("--fleet HOST:PORT is required (or set $LLMGW_FLEET)")
    if opts.node is None:
        opts.node = node_of_certificate(opts) or socket.gethostname()
    configure_logging(log_format(opts) == "json")
    structlog.contextvars.bind_contextvars(node=opts.node)
    tracing = None
    try:
        tracing = configure_tracing("llmgw-agent", opts.trace)
        asyncio.run(run_agent(opts, ChildSpans() if tracing is not None else None))
    except (ConfigError, CardSpecError, TLSConfigError, OSError, ValueError) as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if tracing is not None:
            tracing.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
