"""What every `llmgw` command shares: exit codes, default addresses, the caller's name, bad
usage, and the one dispatch that runs a command and turns its failures into exit codes.

The convention: each command's parser sets `run=fn`, `fn(opts) -> int` its exit code; `fn`
raises `UsageError` for a command line that cannot become a request and lets the clients'
`Unreachable` / `Refused` through; `run_command` prints them and picks the exit code. This
module imports no other module of `llmgw.cli`.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from llmgw.clients import FleetClient, Refused, Unreachable

EXIT_ERROR = 1
"""`llmgw up` could not go on, or a child of it exited."""
EXIT_REFUSED = 2
"""A service refused the request (its reason is printed)."""
EXIT_UNREACHABLE = 3
"""A service did not answer."""
EXIT_ROLLOUT_FAILED = 4
EXIT_ROLLOUT_CANCELLED = 5
EXIT_USAGE = 64
"""Bad usage (EX_USAGE of sysexits.h)."""

DEFAULT_PLANNER = "127.0.0.1:50051"
DEFAULT_FLEET = "127.0.0.1:50052"
GIB = 1 << 30

Command = Callable[[argparse.Namespace], int]
"""A command: its parsed flags in, its exit code out."""

_HINTS = {"fleet": "start it (`llmgw up`) or point --fleet / LLMGW_FLEET at it"}
"""What to do when a service does not answer, by service."""


class UsageError(Exception):
    """The command line cannot be turned into a request."""


class UsageParser(argparse.ArgumentParser):
    """An argument parser whose errors exit with 64 (EX_USAGE), not argparse's 2, which
    `llmgw` keeps for refusals."""

    def error(self, message: str) -> NoReturn:
        """Print the usage and the error; exit 64."""
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def exit_64_on_bad_usage(parser: argparse.ArgumentParser) -> None:
    """Make a parser made by `add_parser` (hence not a UsageParser) exit 64 on bad usage."""
    setattr(parser, "error", UsageParser.error.__get__(parser))  # noqa: B010


def caller_name(told: str | None) -> str:
    """Who runs the command: `--as`, else $USER, else the login name."""
    if told:
        return told
    user = os.environ.get("USER") or os.environ.get("LOGNAME")
    if user:
        return user
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "unknown"


def fleet_client(opts: argparse.Namespace) -> FleetClient:
    """The fleet a `ctl` command calls: --fleet, as --as (or $USER), waiting --timeout."""
    return FleetClient(opts.fleet, caller=caller_name(opts.as_name), timeout_s=opts.timeout)


def ctl_flags() -> argparse.ArgumentParser:
    """The flags every `ctl` command also takes after its name (`llmgw ctl model list --json`);
    SUPPRESS keeps the value given before the command when they are not repeated after it."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument("--fleet", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    flags.add_argument("--as", dest="as_name", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    flags.add_argument("--timeout", type=float, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    flags.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the answer as JSON"
    )
    return flags


CTL_FLAGS = ctl_flags()


def add_ctl_command(commands: Any, name: str, what: str, fn: Command) -> argparse.ArgumentParser:
    """Add a command to a `ctl` group (the subparsers of `model`, `node`, ...), run by `fn`."""
    leaf: argparse.ArgumentParser = commands.add_parser(
        name, help=what, description=what, parents=[CTL_FLAGS]
    )
    leaf.set_defaults(run=fn)
    return leaf


def refusal_text(refused: Refused) -> tuple[str, dict[str, Any]]:
    """A refusal for people, and as data for --json: code, message, and the ErrorInfo's
    reason and metadata when the status carried one."""
    info: dict[str, Any] = {"code": refused.code, "message": refused.message}
    if refused.reason is not None:
        info["reason"] = refused.reason
        info["metadata"] = dict(refused.metadata or {})
    text = f"refused ({info.get('reason', refused.code)}): {refused.message}"
    for key, value in sorted(info.get("metadata", {}).items()):
        text += f"\n  {key}: {value}"
    return text, info


def run_command(opts: argparse.Namespace) -> int:
    """Run the command the parser chose; its exit code, failures printed."""
    run: Command = opts.run
    try:
        return int(run(opts))
    except UsageError as exc:
        print(f"llmgw: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Unreachable as exc:
        if exc.reason is not None:
            # The service answered: what it depends on did not; its message says which.
            print(f"llmgw: the {exc.service} says ({exc.reason}): {exc.detail}", file=sys.stderr)
        else:
            hint = _HINTS.get(exc.service)
            print(f"llmgw: {exc}" + (f": {hint}" if hint else ""), file=sys.stderr)
        return EXIT_UNREACHABLE
    except Refused as exc:
        text, info = refusal_text(exc)
        if getattr(opts, "json", False):
            print(json.dumps({"error": info}, indent=2))
        else:
            print(text, file=sys.stderr)
        return EXIT_REFUSED
