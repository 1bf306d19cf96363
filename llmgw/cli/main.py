"""`llmgw`: the operators' command line.

`llmgw plan ...` asks a running planner (llmgw.cli.plan), `llmgw ctl ...` operates a running
fleet (llmgw.cli.ctl), `llmgw up` runs the whole control plane here (llmgw.cli.up), `llmgw certs`
issues certificates from its local CA (llmgw.cli.certs). Exit codes:
0 done, 2 refused (the reason is printed), 3 a service could not be reached, 64 bad usage;
`ctl` adds 4 and 5 for a followed rollout that failed or was cancelled.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence

from llmgw.cli import certs, ctl, plan, up
from llmgw.cli.common import run_command
from llmgw.cli.terminal import escaped_output
from llmgw.tracing import ENV_TRACE, configure_tracing, span


def build_parser() -> argparse.ArgumentParser:
    """The command line's grammar: each command's parser sets `run` (llmgw.cli.common)."""
    parser = argparse.ArgumentParser(prog="llmgw", description="llmgw's control plane")
    sub = parser.add_subparsers(dest="cmd", required=True)
    plan.add_parser(sub)
    ctl.add_parser(sub)
    up.add_parser(sub)
    certs.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `llmgw` command: with tracing asked for ($LLMGW_TRACE, or an OTLP
    endpoint in the environment: llmgw.tracing) the command is one trace, its calls' spans
    under it."""
    opts = build_parser().parse_args(argv)
    tracing = configure_tracing("llmgw-cli", os.environ.get(ENV_TRACE, "auto"))
    # What ctl and plan print came from a service: escaped on its way to the terminal. `up`
    # and `certs` print only what they made themselves.
    guard = escaped_output() if opts.cmd in ("ctl", "plan") else contextlib.nullcontext()
    try:
        with guard, span(f"llmgw {opts.cmd}"):
            return run_command(opts)
    finally:
        if tracing is not None:
            tracing.shutdown()


if __name__ == "__main__":
    sys.exit(main())
