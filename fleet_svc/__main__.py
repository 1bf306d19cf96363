"""Run the fleet: `python -m fleet_svc --listen HOST:PORT --store PATH|DSN [--settings FILE]
[--tls-cert F --tls-key F [--tls-ca F]] [--planner-tls-ca F --planner-tls-cert F
--planner-tls-key F [--planner-tls-server-name NAME]] [--tokens FILE]`.

Exit codes (llmgw.cmdline's table, docs/cli.md): 0 stopped by SIGTERM/SIGINT; 1 a
configuration it cannot use (a bad settings file, an unknown store URL, a DSN libpq cannot
parse); 3 the store cannot be reached, is damaged, or was written by a newer fleet (one line on
stderr names the file or the DSN, password left out, and what is wrong); 64 bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys

from fleet_svc.answers import REQUEST_ID_WINDOW_S
from fleet_svc.domain.errors import FleetError
from fleet_svc.domain.nodes import Liveness
from fleet_svc.leadership import LEASE_S, RENEW_S
from fleet_svc.store.base import StoreError
from fleet_svc.watch import HEARTBEAT_S
from llmgw.cmdline import (
    EXIT_ERROR,
    EXIT_UNREACHABLE,
    UsageParser,
    add_env_argument,
    add_log_format_argument,
    add_version,
    log_format,
)
from llmgw.logs import configure_logging
from llmgw.metrics import add_metrics_argument
from llmgw.probes import add_probe_argument
from llmgw.tls import (
    ENV_CA,
    ENV_CERT,
    ENV_KEY,
    TLSConfigError,
    add_server_tls_arguments,
    client_tls,
    server_tls_from_args,
)
from llmgw.tracing import add_trace_argument, configure_tracing

EXIT_STORE = EXIT_UNREACHABLE
"""The store cannot be reached or read (docs/fleet.md, "Exit codes")."""


def build_parser() -> argparse.ArgumentParser:
    """The fleet's command line."""
    parser = UsageParser(
        prog="python -m fleet_svc",
        description="The llmgw fleet: keeps the catalog of models, places their replicas on "
        "the nodes whose agents connect, and rolls changes out (a gRPC service).",
        epilog="example:\n  python -m fleet_svc --listen 0.0.0.0:50052 --store "
        "postgresql://fleet@db/fleet --settings settings.yaml --tls-cert fleet.crt --tls-key "
        "fleet.key --tls-ca ca.crt",
    )
    add_version(parser)
    add_env_argument(
        parser,
        "--listen",
        env="LLMGW_FLEET_LISTEN",
        default="127.0.0.1:50052",
        help="HOST:PORT to listen on; port 0 picks a free one",
    )
    add_env_argument(
        parser,
        "--store",
        env="LLMGW_FLEET_STORE",
        default="data/fleet.db",
        help="where the fleet keeps what it accepted: a SQLite file (or sqlite:///path), or a"
        " PostgreSQL database (postgresql://user@host:5432/db; a password is better given in"
        " PGPASSWORD or ~/.pgpass than here)",
    )
    parser.add_argument(
        "--settings",
        default="",
        help="the cluster settings YAML: roles, declared models (default none)",
    )
    parser.add_argument(
        "--heartbeat-s", type=float, default=2.0, help="seconds between an agent's heartbeats"
    )
    parser.add_argument(
        "--grace-heartbeats",
        type=int,
        default=3,
        help="heartbeats an agent may miss before its node is NOT_READY",
    )
    parser.add_argument(
        "--lost-after-s",
        type=float,
        default=30.0,
        help="seconds of an agent's silence before its node is LOST",
    )
    parser.add_argument(
        "--drain-s",
        type=float,
        default=2.0,
        help="seconds a replica is drained (out of the endpoints) before it is stopped",
    )
    parser.add_argument(
        "--watch-heartbeat-s",
        type=float,
        default=HEARTBEAT_S,
        help="longest silence on a WatchReplicas stream before a HEARTBEAT (keep it under "
        "every proxy's read timeout)",
    )
    add_env_argument(
        parser,
        "--planner",
        env="LLMGW_PLANNER",
        default="127.0.0.1:50051",
        help="the planner's HOST:PORT (for SetContext and SetGPUs)",
    )
    parser.add_argument(
        "--start-timeout-s",
        type=float,
        default=600.0,
        help="how long a rollout's new replica may take to turn healthy",
    )
    parser.add_argument(
        "--request-id-window-s",
        type=float,
        default=REQUEST_ID_WINDOW_S,
        help="how long a request id's first answer is kept for retries (default: a day)",
    )
    shared = parser.add_argument_group(
        "several fleets on one PostgreSQL (one leads; see docs/fleet.md, Leadership)"
    )
    shared.add_argument(
        "--lease-s", type=float, default=LEASE_S, help="how long a leader's lease lasts unrenewed"
    )
    shared.add_argument(
        "--renew-s",
        type=float,
        default=RENEW_S,
        help="how often the leader renews its lease and followers try for it",
    )
    add_env_argument(
        shared,
        "--advertise",
        env="LLMGW_FLEET_ADVERTISE",
        default="",
        metavar="HOST:PORT",
        help="where callers reach this fleet, told to callers of the others while it leads"
        " (default: the --listen host, or this host's name for a wildcard, and the bound port)",
    )
    add_log_format_argument(parser)
    add_server_tls_arguments(parser)
    add_env_argument(
        parser,
        "--tokens",
        env="LLMGW_FLEET_TOKENS",
        default="",
        metavar="FILE",
        help="bearer-token hashes, lines `NAME SHA256HEX` (or a YAML map); given, callers "
        "may authenticate with `authorization: Bearer TOKEN` (see docs/security.md)",
    )
    to_planner = parser.add_argument_group("the fleet's channel to the planner")
    to_planner.add_argument(
        "--planner-tls-ca", help=f"the CA that signed the planner's certificate (env {ENV_CA})"
    )
    to_planner.add_argument(
        "--planner-tls-cert", help=f"the fleet's client certificate (env {ENV_CERT})"
    )
    to_planner.add_argument(
        "--planner-tls-key", help=f"that certificate's private key (env {ENV_KEY})"
    )
    to_planner.add_argument(
        "--planner-tls-server-name",
        default=None,
        help="the name to check the planner's certificate against (default "
        "planner.service.llmgw, so another service's certificate of the CA is refused; a host "
        "name for a planner pair that names no service)",
    )
    add_metrics_argument(parser)
    add_probe_argument(parser)
    add_trace_argument(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse flags, configure logging, serve until signalled."""
    opts = build_parser().parse_args(argv)
    configure_logging(log_format(opts) == "json")
    tracing = None
    from fleet_svc.server import FleetOptions, serve

    # What the imports built lives as long as the process: frozen out of the collector's
    # view, so a full collection (a catalog change of 1,000 replicas sets one off) walks only
    # what the fleet holds, not every module's objects too (a third of the objects a full
    # collection walked with 1,000 agents connected, measured with gc callbacks).
    gc.collect()
    gc.freeze()

    try:
        tracing = configure_tracing("llmgw-fleet", opts.trace)
        tls = server_tls_from_args(opts)
        planner_tls = client_tls(
            opts.planner_tls_ca,
            opts.planner_tls_cert,
            opts.planner_tls_key,
            server_name=opts.planner_tls_server_name,
        )
        asyncio.run(
            serve(
                FleetOptions(
                    listen=opts.listen,
                    store_url=opts.store,
                    settings_path=opts.settings,
                    liveness=Liveness(opts.heartbeat_s, opts.grace_heartbeats, opts.lost_after_s),
                    drain_s=opts.drain_s,
                    planner=opts.planner,
                    start_timeout_s=opts.start_timeout_s,
                    request_id_window_s=opts.request_id_window_s,
                    tls=tls,
                    insecure=opts.insecure,
                    planner_tls=planner_tls,
                    tokens_path=opts.tokens,
                    metrics=opts.metrics,
                    probes=opts.probe_listen,
                    watch_heartbeat_s=opts.watch_heartbeat_s,
                    lease_s=opts.lease_s,
                    renew_s=opts.renew_s,
                    advertise=opts.advertise,
                )
            )
        )
    except StoreError as exc:
        print(f"fleet: {exc}", file=sys.stderr)
        return EXIT_STORE
    except (RuntimeError, TLSConfigError, ValueError, FleetError, OSError) as exc:
        print(f"fleet: {exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if tracing is not None:
            tracing.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
