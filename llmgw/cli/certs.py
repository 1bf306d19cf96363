"""`llmgw certs node|client NAME`: issue a certificate from a local CA (the one `llmgw up`
made under DATA/tls, or any folder holding `ca.crt` and `ca.key`), for another node's agent
or another caller. The work is llmgw.certs's (`issue_node_files`, `issue_client_files`); this
module parses the command line and says what was written.

A node's certificate names it as `spiffe://llmgw/node/NAME` (it may Connect as NAME only); a
caller's as `spiffe://llmgw/user/NAME`, whose role the cluster settings give. Issuing again
for the same name writes a new pair over the old one (how a certificate is renewed). Exit
codes: 0 written, 64 bad usage (a name that cannot be an identity, no CA in the folder).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmgw.certs import CA_CERT, CertError, issue_client_files, issue_node_files
from llmgw.cli.common import UsageError, data_folder, example
from llmgw.identity import node_uri, user_uri

Issue = Callable[[str, Path, Path | None], tuple[Path, Path]]


def _issue(opts: argparse.Namespace, kind: str, issue: Issue, uri: Callable[[str], str]) -> int:
    ca_dir = Path(opts.ca_dir) if opts.ca_dir else data_folder() / "tls"
    out = Path(opts.out) if opts.out else None
    try:
        identity = uri(opts.name)
        cert, key = issue(opts.name, ca_dir, out)
    except (CertError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    ca = ca_dir / CA_CERT
    if opts.json:
        paths = {"cert": str(cert), "key": str(key), "ca": str(ca)}
        print(json.dumps({"kind": kind, "identity": identity, **paths}, indent=2))
        return 0
    print(f"wrote {cert} and {key} ({identity}, signed by {ca})")
    flags = f"--tls-ca {ca} --tls-cert {cert} --tls-key {key}"
    if kind == "node":
        print(f"run its agent with: python -m fleet_svc.agent --node {opts.name} {flags} ...")
    else:
        print(f"call with: llmgw ctl {flags} model list")
        print(f"its role comes from the cluster settings (roles), under the name {opts.name!r}")
    return 0


def node(opts: argparse.Namespace) -> int:
    """`certs node NAME`: a pair for node NAME's agent."""
    return _issue(opts, "node", issue_node_files, node_uri)


def client(opts: argparse.Namespace) -> int:
    """`certs client NAME`: a pair for caller NAME."""
    return _issue(opts, "client", issue_client_files, user_uri)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `certs` and its commands to the `llmgw` parser's subcommands."""
    certs: argparse.ArgumentParser = sub.add_parser(
        "certs",
        help="issue certificates from a local CA (another node, another caller)",
        description="Issue a certificate from a local CA (the one `llmgw up` made under "
        "DATA/tls, or any folder holding ca.crt and ca.key): for another node's agent "
        "(spiffe://llmgw/node/NAME) or another caller (spiffe://llmgw/user/NAME, whose role "
        "the cluster settings give). Issuing again for a name writes a new pair over the old "
        "one (how a certificate is renewed).",
        epilog=example("llmgw certs node gpu-node-7", "llmgw certs client alice --out ~/.llmgw"),
    )
    commands = certs.add_subparsers(dest="certs_cmd", metavar="KIND", required=True)
    for name, what, fn, stem in (
        ("node", "a pair for a node's agent: node-NAME.crt/.key", node, "node-NAME"),
        ("client", "a pair for a caller: NAME.crt/.key", client, "NAME"),
    ):
        cmd = commands.add_parser(
            name,
            help=what,
            description=f"Issue {what}.",
            epilog=example(f"llmgw certs {name} {'gpu-node-7' if name == 'node' else 'alice'}"),
        )
        cmd.add_argument("name", metavar="NAME", help="1-63 letters, digits, '.', '_' or '-'")
        cmd.add_argument(
            "--ca-dir",
            help="the folder holding ca.crt and ca.key (default: DATA/tls, DATA being "
            "$LLMGW_DATA or `data`)",
        )
        cmd.add_argument("--out", help=f"where to write {stem}.crt/.key (default: the CA folder)")
        cmd.add_argument("--json", action="store_true", help="print the paths as JSON")
        cmd.set_defaults(run=fn)
    return certs
