"""The conventions every llmgw entry point shares at a terminal: its exit codes, one parser
class whose bad usage exits 64, `--version`, and help written for people (each flag's default
and environment variable shown, examples kept as written).

Every entry point builds its parser from `UsageParser` (`llmgw` and each of its commands,
`python -m planner_svc`, `python -m fleet_svc`, `python -m fleet_svc.agent`, `python -m
llmgw.demo`); subcommands inherit the class, so one `error` decides the exit code of the
whole command tree. A flag read from the environment is added with `add_env_argument`, which
records the variable for the help. `EXIT_CODES` is the one table of exit codes; docs/cli.md
prints it (a test keeps the two the same).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from llmgw.build import build_info

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_REFUSED = 2
EXIT_UNREACHABLE = 3
EXIT_ROLLOUT_FAILED = 4
EXIT_ROLLOUT_CANCELLED = 5
EXIT_USAGE = 64
"""Bad usage: EX_USAGE of sysexits.h (argparse's own 2 means "refused" here)."""


@dataclass(frozen=True)
class ExitCode:
    """One row of the exit-code table."""

    code: int
    meaning: str
    who: str


EXIT_CODES = (
    ExitCode(EXIT_OK, "done; a service stopped by SIGTERM or SIGINT", "every entry point"),
    ExitCode(
        EXIT_ERROR,
        "could not go on: a configuration it cannot use (settings, agent config, store URL, "
        "TLS files), an address it cannot bind, or (`llmgw up`) a child that exited; `llmgw "
        "ctl diff`: the files differ from the catalog (as `kubectl diff`)",
        "`llmgw up`, `llmgw ctl diff`, planner, fleet, agent, demo file server",
    ),
    ExitCode(
        EXIT_REFUSED,
        "a service refused the request; its reason and metadata are printed",
        "`llmgw ctl`, `llmgw plan`",
    ),
    ExitCode(
        EXIT_UNREACHABLE,
        "a service did not answer (a failed TLS handshake says what to check); the fleet: "
        "its store cannot be reached, is damaged or was written by a newer fleet",
        "`llmgw ctl`, `llmgw plan`, fleet",
    ),
    ExitCode(EXIT_ROLLOUT_FAILED, "a followed rollout failed", "`llmgw ctl`"),
    ExitCode(EXIT_ROLLOUT_CANCELLED, "a followed rollout was cancelled", "`llmgw ctl`"),
    ExitCode(
        EXIT_USAGE,
        "bad usage: an unknown command or flag, a bad flag value, a file that cannot be a request",
        "every entry point",
    ),
)


def exit_code_table() -> str:
    """EXIT_CODES as the Markdown table docs/cli.md holds."""
    lines = ["| code | meaning | from |", "|---|---|---|"]
    lines += [f"| {e.code} | {e.meaning} | {e.who} |" for e in EXIT_CODES]
    return "\n".join(lines)


_NO_DEFAULT: tuple[object, ...] = (None, "", False, [], argparse.SUPPRESS)


class HelpFormatter(argparse.HelpFormatter):
    """Help for people: descriptions wrapped to the terminal, a paragraph whose lines are
    indented (examples) kept as written, and after each flag's sentence its default (when it
    has one the sentence does not already give) and the environment variable it is read
    from."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for para in text.split("\n\n"):
            lines = para.splitlines()
            if any(line[:1].isspace() for line in lines):
                paragraphs.append("\n".join(indent + line for line in lines))
            else:
                paragraphs.append(super()._fill_text(para, width, indent))
        return "\n\n".join(paragraphs)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if text == argparse.SUPPRESS or not action.option_strings:
            return text
        extras = []
        default = action.default
        if (
            "default" not in text.lower()
            and not isinstance(default, bool)
            and default not in _NO_DEFAULT
            and action.nargs != 0
        ):
            extras.append("default %(default)s")
        env = getattr(action, "env", None)
        if env and env not in text:
            extras.append(f"env {env}")
        if extras:
            text += f" ({'; '.join(extras)})"
        return text


class _Version(argparse.Action):
    """`--version`: print `PROG VERSION (commit C, Python P)` and exit 0."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(
            option_strings,
            dest=argparse.SUPPRESS,
            default=argparse.SUPPRESS,
            nargs=0,
            help="print the version, the commit and the Python version, and exit",
        )

    def __call__(self, parser: argparse.ArgumentParser, *_: Any, **__: Any) -> NoReturn:
        print(build_info().line(parser.prog))
        parser.exit(EXIT_OK)


class UsageParser(argparse.ArgumentParser):
    """The parser of every llmgw entry point and of each of its commands: bad usage exits 64
    (EX_USAGE) with the usage and the error on stderr; help through `HelpFormatter`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    _deepest: UsageParser | None = None
    """The innermost parser of the command line being parsed (its command's)."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        UsageParser._deepest = self  # a subcommand's parser runs inside its parent's parse
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        """Print the usage and the error; exit 64. Flags no parser took are reported by the
        outermost parser; they are said as the command's own (its usage, its prog)."""
        where = self
        if message.startswith("unrecognized arguments") and UsageParser._deepest is not None:
            where = UsageParser._deepest
        where.print_usage(sys.stderr)
        where.exit(EXIT_USAGE, f"{where.prog}: error: {message}\n(see `{where.prog} --help`)\n")


def add_version(parser: argparse.ArgumentParser) -> None:
    """`--version` on an entry point's parser."""
    parser.add_argument("--version", action=_Version)


def add_env_argument(
    container: Any, *flags: str, env: str, default: Any = None, **kwargs: Any
) -> argparse.Action:
    """A flag whose default is read from `env` when that is set (else `default`); its help
    names the variable. A value from the environment is checked by the flag's `type` as a
    value on the command line is (argparse converts string defaults)."""
    action: argparse.Action = container.add_argument(
        *flags, default=os.environ.get(env) or default, **kwargs
    )
    action.env = env  # type: ignore[attr-defined]
    return action


def set_env(action: argparse.Action, env: str) -> argparse.Action:
    """Record that `action`'s default comes from `env` (the help names it)."""
    action.env = env  # type: ignore[attr-defined]
    return action


def log_format_default() -> str:
    """`--log-format`'s default: console at a terminal, JSON elsewhere (production)."""
    return "console" if sys.stderr.isatty() else "json"


def add_log_format_argument(parser: argparse.ArgumentParser) -> None:
    """`--log-format json|console` (default: console when stderr is a terminal, else json)."""
    parser.add_argument(
        "--log-format",
        choices=("json", "console"),
        default=None,
        help="log lines as JSON (production) or for people (default: console when stderr is "
        "a terminal, else json)",
    )


def log_format(opts: argparse.Namespace) -> str:
    """The log format the flags ask for, the terminal deciding when they do not."""
    told: str | None = opts.log_format
    return told or log_format_default()
