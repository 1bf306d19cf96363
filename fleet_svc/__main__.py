"""Run the fleet: `python -m fleet_svc --listen HOST:PORT --store PATH|DSN [--settings FILE]`.

Exit codes: 0 stopped by SIGTERM/SIGINT; 1 a configuration it cannot use (a bad settings file,
an unknown store URL); 2 bad flags (argparse); 3 the store cannot be reached, is damaged, or was
written by a newer fleet (one line on stderr names the file or the DSN, password left out, and
what is wrong).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from fleet_svc.domain.nodes import Liveness
from fleet_svc.store.base import StoreError
from llmgw.logs import configure_logging

EXIT_STORE = 3
"""The store cannot be reached or read (docs/fleet.md, "Exit codes")."""


def main(argv: list[str] | None = None) -> int:
    """Parse flags, configure logging, serve until signalled."""
    parser = argparse.ArgumentParser(prog="python -m fleet_svc", description=__doc__)
    parser.add_argument("--listen", default=os.environ.get("LLMGW_FLEET_LISTEN", "127.0.0.1:50052"))
    parser.add_argument(
        "--store",
        default=os.environ.get("LLMGW_FLEET_STORE", "data/fleet.db"),
        help="where the fleet keeps what it accepted: a SQLite file (or sqlite:///path), or a"
        " PostgreSQL database (postgresql://user@host:5432/db; a password is better given in"
        " PGPASSWORD or ~/.pgpass than here)",
    )
    parser.add_argument("--settings", default="", help="cluster settings YAML (declared models)")
    parser.add_argument("--heartbeat-s", type=float, default=2.0, help="heartbeat interval")
    parser.add_argument("--grace-heartbeats", type=int, default=3, help="missed before NOT_READY")
    parser.add_argument("--lost-after-s", type=float, default=30.0, help="silence before LOST")
    parser.add_argument("--drain-s", type=float, default=2.0, help="drain delay before a stop")
    parser.add_argument(
        "--planner",
        default=os.environ.get("LLMGW_PLANNER", "127.0.0.1:50051"),
        help="the planner's HOST:PORT (for SetContext and SetGPUs)",
    )
    parser.add_argument(
        "--start-timeout-s",
        type=float,
        default=600.0,
        help="how long a rollout's new replica may take to turn healthy",
    )
    parser.add_argument("--log-format", choices=("json", "console"), default="json")
    opts = parser.parse_args(argv)
    configure_logging(opts.log_format == "json")
    from fleet_svc.server import FleetOptions, serve

    try:
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
                )
            )
        )
    except StoreError as exc:
        print(f"fleet: {exc}", file=sys.stderr)
        return EXIT_STORE
    except (RuntimeError, ValueError) as exc:
        print(f"fleet: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
