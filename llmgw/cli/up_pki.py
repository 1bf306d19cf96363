"""What `llmgw up` makes for mutual TLS and who may do what: the local CA and its pairs under
DATA/tls (llmgw.certs.make_local_tls, plus the fleet's own client pair), the fleet's cluster
settings with their roles, and the flags that hand each child its files. Apart from
llmgw.cli.up, which runs the children."""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from llmgw import certs
from llmgw.cli.common import LOCAL_USER
from llmgw.demo.catalog import CALLER
from llmgw.tls import is_loopback

VIEWER = "viewer"
FLEET_IDENTITY = "fleet"
"""The user identity of the fleet's channel to the planner."""
FLEET_CLIENT = "fleet-client"
"""Its pair's file stem (`fleet.crt` is the fleet's server pair)."""
SETTINGS = "settings.yaml"
ROLES = {"admin": [LOCAL_USER, CALLER], "viewer": [VIEWER]}
"""The roles of the identities `llmgw up` issues, role -> identities (the fleet's cluster
settings' `roles`); the fleet's identity only calls the planner."""


@dataclass(frozen=True)
class LocalPki:
    """The files of DATA/tls each process is given."""

    ca: Path
    planner: tuple[Path, Path]
    fleet: tuple[Path, Path]
    fleet_client: tuple[Path, Path]
    node: tuple[Path, Path]
    writer: tuple[Path, Path]
    """The example catalog's writer (`llmgw-up`)."""
    admin: tuple[Path, Path]


def make_pki(folder: Path, *, node: str, host: str) -> LocalPki:
    """The local CA and pairs under `folder` (DATA/tls; those already there are kept), for the
    agent of `node`, the server pairs also valid for `host` (llmgw up's --host) when it is a
    name or address clients dial."""
    hosts = [] if host in ("0.0.0.0", "::", "") or is_loopback(host) else [host]
    local = certs.make_local_tls(
        folder,
        servers=("planner", "fleet"),
        nodes=(node,),
        clients=(LOCAL_USER, VIEWER, CALLER),
        hosts=hosts,
    )
    fleet_client = (folder / f"{FLEET_CLIENT}.crt", folder / f"{FLEET_CLIENT}.key")
    if not all(p.exists() for p in fleet_client):
        ca = certs.load_ca(folder)
        pair = certs.issue_client(ca, FLEET_IDENTITY)
        fleet_client = certs.write_pair(folder, FLEET_CLIENT, pair)
    return LocalPki(
        ca=local.ca_cert,
        planner=local.servers["planner"],
        fleet=local.servers["fleet"],
        fleet_client=fleet_client,
        node=local.nodes[node],
        writer=local.clients[CALLER],
        admin=local.clients[LOCAL_USER],
    )


def write_settings(path: Path) -> bool:
    """Write the fleet's cluster settings with the local identities' roles, unless the file
    is there (then it is the operator's); whether it was written."""
    if path.exists():
        return False
    lines = [
        "# The fleet's cluster settings, written by `llmgw up` once and then yours to edit:",
        "# `roles` maps each role to the identities (certificate or token names) that have it.",
        "roles:",
        *(f"  {role}: [{', '.join(names)}]" for role, names in ROLES.items()),
        "",
    ]
    # 0600, created exclusively and never through a link: it names who holds which role.
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write("\n".join(lines))
    tmp.replace(path)
    return True


def shown_path(path: Path) -> str:
    """A path as a person would type it here: relative when under the working directory."""
    relative = os.path.relpath(path)
    return path.as_posix() if relative.startswith("..") else relative


def tls_flags(prefix: str, ca: Path, pair: tuple[Path, Path] | None) -> list[str]:
    """`--PREFIXtls-ca CA [--PREFIXtls-cert C --PREFIXtls-key K]`."""
    flags = [f"--{prefix}tls-ca", str(ca)]
    if pair is not None:
        flags += [f"--{prefix}tls-cert", str(pair[0]), f"--{prefix}tls-key", str(pair[1])]
    return flags


def server_flags(ca: Path, pair: tuple[Path, Path]) -> list[str]:
    """`--tls-cert C --tls-key K --tls-ca CA`: a server's pair, clients of `ca` required."""
    return ["--tls-cert", str(pair[0]), "--tls-key", str(pair[1]), "--tls-ca", str(ca)]
