"""Run the planner: `python -m planner_svc --listen HOST:PORT`."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from llmgw.logs import configure_logging

DEFAULT_LISTEN = "127.0.0.1:50051"


def main(argv: list[str] | None = None) -> int:
    """Parse flags, configure logging, serve until signalled."""
    parser = argparse.ArgumentParser(prog="python -m planner_svc", description=__doc__)
    parser.add_argument(
        "--listen",
        default=os.environ.get("LLMGW_PLANNER_LISTEN", DEFAULT_LISTEN),
        help="HOST:PORT to listen on; port 0 picks a free one (default %(default)s)",
    )
    parser.add_argument(
        "--log-format",
        choices=("json", "console"),
        default="json" if not sys.stderr.isatty() else "console",
        help="log lines as JSON (production) or for people",
    )
    opts = parser.parse_args(argv)
    configure_logging(opts.log_format == "json")
    from planner_svc.server import serve

    try:
        asyncio.run(serve(opts.listen))
    except RuntimeError as exc:
        print(f"planner: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
