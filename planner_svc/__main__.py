"""Run the planner: `python -m planner_svc --listen HOST:PORT [--tls-cert F --tls-key F
[--tls-ca F]] [--allow-host H ...] [--allow-root DIR ...] [--metrics HOST:PORT]
[--probe-listen HOST:PORT]`. Exit codes: llmgw.cmdline's table (docs/cli.md)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys

from llmgw.authz.policy import InvalidRoles
from llmgw.cmdline import (
    EXIT_ERROR,
    UsageParser,
    add_env_argument,
    add_log_format_argument,
    add_version,
    log_format,
)
from llmgw.logs import configure_logging
from llmgw.metrics import add_metrics_argument
from llmgw.probes import add_probe_argument
from llmgw.tls import TLSConfigError, add_server_tls_arguments, server_tls_from_args
from llmgw.tracing import add_trace_argument, configure_tracing

DEFAULT_LISTEN = "127.0.0.1:50051"


SWITCH_INTERVAL_S = 0.001
MAX_DRAIN_DELAY_S = 300.0
"""The longest --drain-delay taken (a pod's termination grace bounds it anyway)."""


def drain_delay(value: str) -> float:
    """A --drain-delay: seconds, 0 to MAX_DRAIN_DELAY_S."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not 0 <= seconds <= MAX_DRAIN_DELAY_S:
        raise argparse.ArgumentTypeError(f"{value} s is not within 0 to {MAX_DRAIN_DELAY_S:g} s")
    return seconds


def build_parser() -> argparse.ArgumentParser:
    """The planner's command line."""
    parser = UsageParser(
        prog="python -m planner_svc",
        description="The llmgw planner: sizes a model's cards and context for each engine "
        "(a gRPC service; nothing it answers changes anything).",
        epilog="example:\n  python -m planner_svc --listen 0.0.0.0:50051 --tls-cert planner.crt "
        "--tls-key planner.key --tls-ca ca.crt",
    )
    add_version(parser)
    add_env_argument(
        parser,
        "--listen",
        env="LLMGW_PLANNER_LISTEN",
        default=DEFAULT_LISTEN,
        help="HOST:PORT to listen on; port 0 picks a free one",
    )
    add_log_format_argument(parser)
    add_server_tls_arguments(parser)
    sources = parser.add_argument_group("what the planner may fetch")
    sources.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOST[:PORT|:*]",
        help="a host GGUF URLs may be read from (repeat; *.DOMAIN for a domain); default "
        "huggingface.co and its CDNs, or $LLMGW_PLANNER_ALLOW_HOSTS (comma-separated); the "
        "Hub endpoint ($HF_ENDPOINT) is always allowed",
    )
    sources.add_argument(
        "--allow-root",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder local .gguf sources may be read from (repeat); default none, or "
        "$LLMGW_PLANNER_ALLOW_ROOTS (':'-separated)",
    )
    parser.add_argument(
        "--drain-delay",
        type=drain_delay,
        default=os.environ.get("LLMGW_DRAIN_DELAY_S", "0"),
        metavar="SECONDS",
        help="on SIGTERM, report NOT_SERVING and keep serving this long before stopping, so a "
        "readiness probe sees it and the Service stops sending (default %(default)s; "
        "deploy/ sets it above the readiness probe's period times its failure threshold)",
    )
    access = parser.add_argument_group("who may call")
    access.add_argument(
        "--settings",
        default="",
        help="the cluster settings YAML whose roles: and revoked: the planner honours, re-read "
        "when it changes (the fleet's file; default: admin and viewer, the fleet a viewer)",
    )
    access.add_argument(
        "--tokens",
        default="",
        help="a file of bearer tokens (NAME SHA256HEX lines, as the fleet's --tokens)",
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
    # Plans run on a worker thread (planner_svc/rpc/servicer.py); the event loop waits for the
    # GIL up to the switch interval each time it wakes while one runs. 1 ms instead of
    # CPython's 5 ms keeps other calls' latency near idle beside a large plan.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    from planner_svc.server import serve
    from planner_svc.sources.policy import SourcePolicy

    # What the imports built lives as long as the process: frozen out of the collector's
    # view, so each full collection a stream of requests sets off walks only their objects
    # (it walked every module's too: about 25 us a fresh SizeContext, on average).
    gc.collect()
    gc.freeze()

    try:
        tracing = configure_tracing("llmgw-planner", opts.trace)
        tls = server_tls_from_args(opts)
        policy = SourcePolicy.from_env(
            os.environ,
            allow_hosts=opts.allow_host,
            allow_roots=opts.allow_root,
        )
        asyncio.run(
            serve(
                opts.listen,
                tls=tls,
                insecure=opts.insecure,
                policy=policy,
                metrics=opts.metrics,
                probes=opts.probe_listen,
                drain_s=opts.drain_delay,
                settings_path=opts.settings,
                tokens_path=opts.tokens,
            )
        )
    except InvalidRoles as exc:
        print(f"planner: {exc.message}", file=sys.stderr)
        return EXIT_ERROR
    except (RuntimeError, TLSConfigError, ValueError, OSError) as exc:
        print(f"planner: {exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if tracing is not None:
            tracing.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
