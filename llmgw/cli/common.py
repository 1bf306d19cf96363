"""What every `llmgw` command shares: exit codes, default addresses, the caller's name and
credentials, bad usage, and the one dispatch that runs a command and turns its failures into
exit codes.

Credentials of a client command (`ctl`, `plan`): `--tls-ca/--tls-cert/--tls-key` (each else
LLMGW_TLS_CA/CERT/KEY, llmgw.tls.client_tls) and `--token` (else LLMGW_TOKEN). With no TLS
flag or variable, the pair `llmgw up` wrote is used when it is there: DATA/tls/ca.crt and
admin.crt/.key, DATA being $LLMGW_DATA or `data` (llmgw up's default, from the same folder);
with a token, only that CA is taken (the token says who calls). Nothing found, or
`--plaintext`: plaintext (a development server on loopback started without certificates).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llmgw.certs import names_service
from llmgw.cli import jsonpath
from llmgw.clients import FleetClient, PlannerClient, Refused, Unreachable
from llmgw.cmdline import (
    EXIT_ERROR,
    EXIT_NOT_CHECKED,
    EXIT_REFUSED,
    EXIT_ROLLOUT_CANCELLED,
    EXIT_ROLLOUT_FAILED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    UsageParser,
    add_env_argument,
)
from llmgw.tls import (
    ENV_CA,
    ENV_CERT,
    ENV_KEY,
    ClientTLS,
    TLSConfigError,
    add_client_tls_arguments,
    client_tls_from_args,
    local_client_tls,
)

# The exit codes, the usage parser and --version are every entry point's (llmgw.cmdline).
__all__ = [
    "EXIT_ERROR",
    "EXIT_NOT_CHECKED",
    "EXIT_REFUSED",
    "EXIT_ROLLOUT_CANCELLED",
    "EXIT_ROLLOUT_FAILED",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "UsageParser",
    "add_env_argument",
]

DEFAULT_PLANNER = "127.0.0.1:50051"
DEFAULT_FLEET = "127.0.0.1:50052"
GIB = 1 << 30
ENV_DATA = "LLMGW_DATA"
DEFAULT_DATA = "data"
"""`llmgw up`'s data folder (its --data default), relative to where it runs."""
ENV_TOKEN = "LLMGW_TOKEN"
LOCAL_USER = "admin"
"""The client pair of DATA/tls a client command takes by itself."""

Command = Callable[[argparse.Namespace], int]
"""A command: its parsed flags in, its exit code out."""

_HINTS = {
    "fleet": "start it (`llmgw up`) or point --fleet / LLMGW_FLEET at it",
    "planner": "start it (`llmgw up`) or point --planner / LLMGW_PLANNER at it",
}
"""What to do when a service does not answer, by service."""


class UsageError(Exception):
    """The command line cannot be turned into a request."""


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


def data_folder() -> Path:
    """`llmgw up`'s data folder as a client command finds it: $LLMGW_DATA, else `data`."""
    return Path(os.environ.get(ENV_DATA) or DEFAULT_DATA)


@dataclass(frozen=True)
class Credentials:
    """How a client command connects: its TLS files (None: plaintext), its bearer token, and
    where the TLS files came from (for messages)."""

    tls: ClientTLS | None
    token: str
    found: str
    """"flags" (flags or LLMGW_TLS_*), the DATA/tls folder they were found in, or "" (none)."""


def add_client_flags(parser: argparse.ArgumentParser) -> None:
    """`--tls-ca`, `--tls-cert`, `--tls-key` and `--token` on a client command's parser."""
    add_client_tls_arguments(parser)
    parser.add_argument(
        "--token",
        help=f"a bearer token to call with instead of a client certificate (env {ENV_TOKEN})",
    )
    parser.add_argument(
        "--plaintext",
        action="store_true",
        help="no TLS, even beside `llmgw up` (a server started without certificates)",
    )


def credentials(opts: argparse.Namespace) -> Credentials:
    """The credentials the flags, the environment or a local `llmgw up` give (see the module's
    docstring).

    Raises:
        UsageError: a certificate without its key, or the reverse.
    """
    token = getattr(opts, "token", None) or os.environ.get(ENV_TOKEN) or ""
    try:
        tls = client_tls_from_args(opts)
    except TLSConfigError as exc:
        raise UsageError(str(exc)) from exc
    if getattr(opts, "plaintext", False):
        if any(getattr(opts, f"tls_{x}", None) for x in ("ca", "cert", "key")):
            raise UsageError("--plaintext and --tls-ca/--tls-cert/--tls-key contradict")
        return Credentials(None, token, "")
    if tls is not None:
        return Credentials(tls, token, "flags")
    folder = data_folder() / "tls"
    local = local_client_tls(folder, LOCAL_USER)
    if local is None:
        return Credentials(None, token, "")
    if token:
        local = ClientTLS(ca=local.ca)
    return Credentials(local, token, str(folder))


def expecting(creds: Credentials, service: str) -> ClientTLS | None:
    """The TLS settings checking the server as `service` (`fleet.service.llmgw`): always from
    flags or the environment; from a local `llmgw up` folder only when its pair of that
    service names it (a pair from before service names: the host name, as before)."""
    if creds.tls is None:
        return None
    if creds.found not in ("", "flags"):
        pair = Path(creds.found) / f"{service}.crt"
        if pair.is_file() and not names_service(pair, service):
            return creds.tls
    return creds.tls.expecting(service)


def _client_failure(exc: Exception) -> UsageError:
    """A client that could not be made (a TLS file unreadable, a token that cannot travel)."""
    return UsageError(str(exc))


def fleet_client(opts: argparse.Namespace) -> FleetClient:
    """The fleet a `ctl` command calls: --fleet, with its credentials, naming --as (or $USER)
    as the caller (the fleet records it only from an identity allowed to act for others),
    waiting --timeout.

    Raises:
        UsageError: the credentials cannot be used (a TLS file unreadable, a bad token).
    """
    creds = credentials(opts)
    opts.credentials = creds
    try:
        return FleetClient(
            opts.fleet,
            caller=caller_name(opts.as_name),
            timeout_s=opts.timeout,
            tls=expecting(creds, "fleet"),
            token=creds.token,
        )
    except (TLSConfigError, ValueError) as exc:
        raise _client_failure(exc) from exc


def planner_client(opts: argparse.Namespace) -> PlannerClient:
    """The planner a `plan` command calls: --planner, with its credentials, waiting --timeout.

    Raises:
        UsageError: the credentials cannot be used (a TLS file unreadable, a bad token).
    """
    creds = credentials(opts)
    opts.credentials = creds
    try:
        return PlannerClient(
            opts.planner,
            timeout_s=opts.timeout,
            tls=expecting(creds, "planner"),
            token=creds.token,
        )
    except (TLSConfigError, ValueError) as exc:
        raise _client_failure(exc) from exc


def tls_hint(opts: argparse.Namespace) -> str:
    """What to check after a TLS failure, saying where this run's TLS files came from."""
    creds: Credentials | None = getattr(opts, "credentials", None)
    check = f"check --tls-ca, --tls-cert, --tls-key (or {ENV_CA}, {ENV_CERT}, {ENV_KEY})"
    if creds is None or not creds.found:
        return (
            f"{check}; beside `llmgw up`, run from the folder that holds its data/ or set "
            f"{ENV_DATA}"
        )
    if creds.found == "flags":
        return f"{check}: the CA must be the one that signed the server"
    return (
        f"{check}: the files used were {LOCAL_USER}.crt/.key and ca.crt of {creds.found} "
        "(found beside `llmgw up`); give the flags for another server, or --plaintext for one "
        "without certificates"
    )


OUTPUTS = ("json", "yaml", "wide", "name")
OUTPUT_HELP = (
    "how to print the answer: json, yaml, wide (a table with more columns), name (kind/name "
    "per line) or jsonpath=TEMPLATE (kubectl's JSONPath, e.g. '{.models[*].model.name}'); "
    "default a table for people"
)


@dataclass(frozen=True)
class OutputFormat:
    """What `-o` asked for: a kind ("json", "yaml", "wide", "name", "jsonpath") and, for
    jsonpath, the parsed template."""

    kind: str
    template: tuple[Any, ...] = ()

    @property
    def machine(self) -> bool:
        """Whether the answer is printed as data (JSON, YAML, JSONPath), not for people."""
        return self.kind in ("json", "yaml", "jsonpath")


def output_format(text: str) -> OutputFormat:
    """An `-o` value (argparse `type`).

    Raises:
        argparse.ArgumentTypeError: not one of the formats, or a template it cannot read.
    """
    kind, sep, template = text.partition("=")
    if kind in OUTPUTS and not sep:
        return OutputFormat(kind)
    if kind == "jsonpath" and sep:
        try:
            return OutputFormat("jsonpath", tuple(jsonpath.parse(template)))
        except jsonpath.TemplateError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc
    raise argparse.ArgumentTypeError(f"{text!r}: one of {', '.join(OUTPUTS)} or jsonpath=TEMPLATE")


def add_output_flags(parser: argparse.ArgumentParser, hidden: bool = False) -> None:
    """`-o/--output FORMAT` and `--json` (the same as `-o json`) on a command's parser;
    `hidden`: repeated after a `ctl` command's name, keeping the value given before it."""
    keep: dict[str, Any] = {"default": argparse.SUPPRESS} if hidden else {"default": None}
    parser.add_argument(
        "-o", "--output", type=output_format, metavar="FORMAT", help=OUTPUT_HELP, **keep
    )
    parser.add_argument(
        "--json",
        dest="output",
        action="store_const",
        const=OutputFormat("json"),
        help="the same as -o json",
        **keep,
    )


def output_of(opts: argparse.Namespace) -> OutputFormat | None:
    """The `-o` a command was given (None: for people)."""
    told: OutputFormat | None = getattr(opts, "output", None)
    return told


def machine_output(opts: argparse.Namespace) -> bool:
    """Whether a command prints data (JSON, YAML, JSONPath) rather than text for people."""
    told = output_of(opts)
    return told is not None and told.machine


CTL_GLOBALS = "--fleet, --as, --timeout, -o/--output, --json, --tls-*, --token, --plaintext"
"""The flags of `llmgw ctl` each of its commands also takes after its name."""


def ctl_flags() -> argparse.ArgumentParser:
    """The flags every `ctl` command also takes after its name (`llmgw ctl model list -o
    json`); SUPPRESS keeps the value given before the command when they are not repeated after
    it. Their help is `llmgw ctl --help`'s; a command's help names them (CTL_GLOBALS)."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument("--fleet", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    flags.add_argument("--as", dest="as_name", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    flags.add_argument("--timeout", type=float, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    add_output_flags(flags, hidden=True)
    for flag in ("--tls-ca", "--tls-cert", "--tls-key", "--token"):
        flags.add_argument(flag, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    flags.add_argument(
        "--plaintext", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    return flags


CTL_FLAGS = ctl_flags()


def example(*lines: str) -> str:
    """A command's epilog: its examples, each a command line (the help ends with them)."""
    return "example:\n" + "\n".join(f"  {line}" for line in lines)


def add_ctl_command(
    commands: Any, name: str, what: str, fn: Command, *examples: str
) -> argparse.ArgumentParser:
    """Add a command to a `ctl` group (the subparsers of `model`, `node`, ...), run by `fn`,
    its help ending with `examples`."""
    leaf: argparse.ArgumentParser = commands.add_parser(
        name,
        help=what,
        description=f"{what[0].upper()}{what[1:]}. Also takes `llmgw ctl`'s flags after its "
        f"name ({CTL_GLOBALS}).",
        parents=[CTL_FLAGS],
        epilog=example(*examples) if examples else None,
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
        elif exc.tls:
            print(f"llmgw: {exc}: {tls_hint(opts)}", file=sys.stderr)
        else:
            hint = _HINTS.get(exc.service)
            print(f"llmgw: {exc}" + (f": {hint}" if hint else ""), file=sys.stderr)
        return EXIT_UNREACHABLE
    except Refused as exc:
        text, info = refusal_text(exc)
        told = output_of(opts)
        if told is not None and told.kind == "yaml":
            print(yaml.safe_dump({"error": info}, sort_keys=False), end="")
        elif told is not None and told.machine:
            print(json.dumps({"error": info}, indent=2))
        else:
            print(text, file=sys.stderr)
        return EXIT_REFUSED


def _percents(text: str) -> list[int]:
    """`5,25,50,100` as a list of percents."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of percents such as 5,25,50,100"
        ) from None


CANARY_FLAGS: tuple[tuple[str, str, Any, str], ...] = (
    ("--canary-steps", "steps", _percents, "percents of the model's weight, e.g. 5,25,50,100"),
    ("--canary-step-s", "step_min_s", int, "the least seconds a step lasts (default 60)"),
    (
        "--canary-min-requests",
        "step_min_requests",
        int,
        "requests the canary serves before a step is judged (default 100)",
    ),
    (
        "--canary-max-error-ratio",
        "max_error_ratio",
        float,
        "the most 5xx and timeouts per request (default 0.01; negative: not checked)",
    ),
    (
        "--canary-max-error-increase",
        "max_error_ratio_increase",
        float,
        "the most the canary's error ratio may exceed the old revision's",
    ),
    ("--canary-max-ttft-ms", "max_p99_ttft_ms", int, "the most p99 time to first token"),
    ("--canary-max-itl-ms", "max_p99_itl_ms", int, "the most p99 inter-token latency"),
    (
        "--canary-max-context-refusals",
        "max_context_refusal_ratio",
        float,
        "the most requests refused for context length, per request",
    ),
    (
        "--canary-max-hold-s",
        "max_hold_s",
        int,
        "the most seconds a step may hold for want of requests before the canary fails"
        " (default: no limit)",
    ),
)
"""The canary policy's flags: flag, the policy's field, its type, help."""


def add_canary_flags(parser: argparse.ArgumentParser) -> None:
    """The canary flags (any of them makes the change a canary: --strategy canary)."""
    group = parser.add_argument_group("canary (docs/rollouts.md)")
    for flag, name, kind, text in CANARY_FLAGS:
        metavar = {"steps": "PCT,...", "step_min_s": "S", "max_hold_s": "S"}.get(name, "N")
        if kind is float:
            metavar = "RATIO"
        elif name.endswith("_ms"):
            metavar = "MS"
        group.add_argument(flag, dest=f"canary_{name}", type=kind, metavar=metavar, help=text)


def canary_of(opts: argparse.Namespace) -> dict[str, Any] | None:
    """The canary policy the flags ask for (None: no canary flag and no --strategy canary)."""
    fields = {
        name: getattr(opts, f"canary_{name}")
        for _flag, name, _kind, _text in CANARY_FLAGS
        if getattr(opts, f"canary_{name}", None) is not None
    }
    if not fields and getattr(opts, "strategy", "") != "canary":
        return None
    return fields


INT32_MAX = 2**31 - 1


def count(text: str) -> int:
    """A flag's count: a whole number from 0 to 2^31 − 1 (the planner refuses what its
    engine cannot take; this only keeps the request encodable)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text[:40]!r}") from None
    if not 0 <= value <= INT32_MAX:
        raise argparse.ArgumentTypeError(f"{value} is outside 0..{INT32_MAX}")
    return value


def sequences_flag(p: argparse.ArgumentParser) -> None:
    """Add `--sequences N`: concurrent requests to size for (plan, and the fleet's changes)."""
    p.add_argument(
        "--sequences",
        type=count,
        default=0,
        help="concurrent requests to size for, written to the engine's own flag "
        "(vLLM --max-num-seqs, SGLang --max-running-requests, TensorRT-LLM --max_batch_size, "
        "llama.cpp --parallel); the answer says whether that batch fits (default 0: none)",
    )
