"""`llmgw ctl`: operate a running fleet (its catalog, nodes, replicas and rollouts).

Every command calls the fleet at `--fleet HOST:PORT` (or $LLMGW_FLEET; several fleets sharing
one store: `HOST:PORT,HOST:PORT...` or a name resolving to each, and the leader is found) as
the identity of its
client certificate (`--tls-ca/--tls-cert/--tls-key`, or LLMGW_TLS_CA/CERT/KEY) or of a bearer
token (`--token`, or LLMGW_TOKEN); with none given, beside a default `llmgw up` (or with
$LLMGW_DATA naming its data folder) it takes DATA/tls/admin.crt/.key and ca.crt by itself.
`--as NAME` (else $USER) is sent as `x-llmgw-caller`, which the fleet records only from an
identity allowed to act for others (the gateway).
Human tables by default, `--json` for scripts. Exit codes: 0 done, 2 refused by the fleet (the
reason and its metadata are printed), 3 the fleet could not be reached, 4 a followed rollout
failed, 5 it was cancelled, 64 bad usage.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from llmgw.cli import ctl_model, ctl_replica, ctl_rollout
from llmgw.cli.common import DEFAULT_FLEET, UsageParser, add_client_flags, exit_64_on_bad_usage


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `ctl` and its groups (model, node, replica, rollout) to the `llmgw` parser's
    subcommands."""
    ctl: argparse.ArgumentParser = sub.add_parser(
        "ctl",
        help="operate a running fleet: models, nodes, replicas",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ctl.add_argument(
        "--fleet",
        default=os.environ.get("LLMGW_FLEET", DEFAULT_FLEET),
        help="fleet address HOST:PORT, or several separated by commas (the leader is found;"
        " env LLMGW_FLEET; default %(default)s)",
    )
    ctl.add_argument(
        "--as",
        dest="as_name",
        metavar="NAME",
        help="whom you act for (recorded only from the gateway's identity; default $USER)",
    )
    ctl.add_argument("--timeout", type=float, default=15.0, help="seconds to wait for an answer")
    ctl.add_argument("--json", action="store_true", help="print the answer as JSON")
    add_client_flags(ctl)
    # Bad usage exits 64 (argparse's own code, 2, means "refused" here).
    exit_64_on_bad_usage(ctl)
    groups = ctl.add_subparsers(
        dest="ctl_group", metavar="GROUP", required=True, parser_class=UsageParser
    )
    ctl_model.add_commands(groups)
    ctl_replica.add_commands(groups)
    ctl_rollout.add_commands(groups)
    return ctl
