"""`llmgw ctl`: operate a running fleet (its catalog, nodes, replicas and rollouts).

Every command calls the fleet at `--fleet HOST:PORT` (or $LLMGW_FLEET; several fleets sharing
one store: `HOST:PORT,HOST:PORT...` or a name resolving to each, and the leader is found) as
the identity of its
client certificate (`--tls-ca/--tls-cert/--tls-key`, or LLMGW_TLS_CA/CERT/KEY) or of a bearer
token (`--token`, or LLMGW_TOKEN); with none given, beside a default `llmgw up` (or with
$LLMGW_DATA naming its data folder) it takes DATA/tls/admin.crt/.key and ca.crt by itself.
`--as NAME` (else $USER) is sent as `x-llmgw-caller`, which the fleet records only from an
identity allowed to act for others (the gateway).
Human tables by default, `-o json|yaml|wide|name|jsonpath=...` (or `--json`) for scripts.
Exit codes: the table of llmgw.cmdline (docs/cli.md).
"""

from __future__ import annotations

import argparse
from typing import Any

from llmgw.cli import ctl_apply, ctl_model, ctl_replica, ctl_rollout
from llmgw.cli.common import (
    DEFAULT_FLEET,
    add_client_flags,
    add_env_argument,
    add_output_flags,
    example,
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `ctl` and its groups (model, node, replica, rollout) and `apply`/`diff` to the
    `llmgw` parser's subcommands."""
    ctl: argparse.ArgumentParser = sub.add_parser(
        "ctl",
        help="operate a running fleet: models, nodes, replicas",
        description="Operate a running fleet: its catalog's models, nodes, replicas and "
        "rollouts. Beside a default `llmgw up` (or with LLMGW_DATA naming its data folder) "
        "the fleet and the credentials are found by themselves.",
        epilog=example("llmgw ctl model list", "llmgw ctl apply -f models/ --dry-run"),
    )
    add_env_argument(
        ctl,
        "--fleet",
        env="LLMGW_FLEET",
        default=DEFAULT_FLEET,
        help="the fleet's address HOST:PORT, or several separated by commas (the leader is found)",
    )
    ctl.add_argument(
        "--as",
        dest="as_name",
        metavar="NAME",
        help="whom you act for (recorded only from the gateway's identity; default $USER)",
    )
    ctl.add_argument("--timeout", type=float, default=15.0, help="seconds to wait for an answer")
    add_output_flags(ctl)
    add_client_flags(ctl)
    groups = ctl.add_subparsers(dest="ctl_group", metavar="GROUP", required=True)
    ctl_model.add_commands(groups)
    ctl_replica.add_commands(groups)
    ctl_rollout.add_commands(groups)
    ctl_apply.add_commands(groups)
    return ctl
