"""`llmgw`: the operators' command line.

`llmgw plan ...` asks a running planner (llmgw.cli.plan), `llmgw ctl ...` operates a running
fleet (llmgw.cli.ctl), `llmgw up` runs the whole control plane here (llmgw.cli.up), `llmgw certs`
issues certificates from its local CA (llmgw.cli.certs), `llmgw completion SHELL` prints a
shell's completion script (llmgw.cli.completion). The exit codes, bad usage (64) and
`--version` are every entry point's (llmgw.cmdline; the table is in docs/cli.md).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence

from llmgw.cli import certs, completion, ctl, plan, up
from llmgw.cli.common import UsageParser, example, run_command
from llmgw.cli.terminal import escaped_output
from llmgw.cmdline import add_version
from llmgw.tracing import ENV_TRACE, configure_tracing, span


def build_parser() -> UsageParser:
    """The command line's grammar: each command's parser sets `run` (llmgw.cli.common)."""
    parser = UsageParser(
        prog="llmgw",
        description="llmgw's control plane: plan a model's cards and context, operate a "
        "fleet, run it all here.",
        epilog=example("llmgw up", "llmgw ctl model list", "llmgw ctl --help"),
    )
    add_version(parser)
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND", required=True)
    plan.add_parser(sub)
    ctl.add_parser(sub)
    up.add_parser(sub)
    certs.add_parser(sub)
    completion.add_parser(sub, parser)
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
