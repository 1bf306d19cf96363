"""`llmgw ctl node list` and `llmgw ctl replica list|watch`: where the fleet runs things."""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any

from llmgw.cli.common import add_ctl_command, fleet_client
from llmgw.cli.output import REPLICA_HEADERS, age, gib, replica_rows, short_name, table
from llmgw.clients.convert import as_data, as_json


def node_list(opts: argparse.Namespace) -> int:
    """`node list`: the nodes whose agents connected, their cards and phase."""
    with fleet_client(opts) as fleet:
        answer = fleet.list_nodes()
    if opts.json:
        print(as_json(answer))
        return 0
    if not answer.nodes:
        print("no nodes: start an agent (`python -m fleet_svc.agent --fleet HOST:PORT ...`)")
        return 0
    rows = []
    for n in answer.nodes:
        used = sum(card.memory_used_bytes for card in n.cards)
        total = sum(card.memory_total_bytes for card in n.cards)
        rows.append(
            [
                n.name,
                short_name(n, "phase", "NODE_PHASE_"),
                n.gpu_class or "CPU",
                f"{n.free_gpus}/{len(n.cards)}",
                f"{gib(used)}/{gib(total)} GiB" if n.cards else "-",
                age(n.last_heartbeat),
                n.reason or "",
            ]
        )
    headers = ("name", "phase", "class", "cards free", "card memory", "heartbeat", "reason")
    print(table(headers, rows))
    return 0


def replica_list(opts: argparse.Namespace) -> int:
    """`replica list [--model M]`: the replicas, their phase and why."""
    with fleet_client(opts) as fleet:
        answer = fleet.list_replicas(opts.model or "")
    if opts.json:
        print(as_json(answer))
    elif not answer.replicas:
        print("no replicas" + (f" of {opts.model}" if opts.model else ""))
    else:
        print(table(REPLICA_HEADERS, replica_rows(answer.replicas)))
    return 0


def replica_watch(opts: argparse.Namespace) -> int:
    """`replica watch [--model M]`: follow the ready endpoints, one line per event, until
    interrupted."""
    with (
        fleet_client(opts) as fleet,
        contextlib.closing(fleet.watch_replicas(opts.model or "")) as events,
    ):
        try:
            for event in events:
                kind = short_name(event, "kind", "KIND_")
                if opts.json:
                    line = json.dumps(as_data(event), separators=(",", ":"))
                elif kind == "HEARTBEAT":
                    continue  # the fleet's keepalive on a quiet stream: nothing to show
                elif kind == "SYNCED":
                    line = "SYNCED   every ready endpoint above; changes follow"
                else:
                    e = event.endpoint
                    line = (
                        f"{kind:<8} {e.model}/{e.profile} {e.replica_id} {e.address} "
                        f"node={e.node} revision={e.revision}"
                    )
                    if kind == "REMOVED":
                        line += " reason=" + short_name(event, "reason", "ENDPOINT_REASON_")
                print(line, flush=True)
        except KeyboardInterrupt:
            return 0
    return 0


def add_commands(groups: Any) -> None:
    """Add the `node` and `replica` groups and their commands to `ctl`'s groups."""
    node = groups.add_parser("node", help="the nodes and their cards")
    commands = node.add_subparsers(dest="ctl_cmd", metavar="COMMAND", required=True)
    add_ctl_command(commands, "list", "every node: phase, cards, memory, heartbeat", node_list)

    replica = groups.add_parser("replica", help="the replicas")
    commands = replica.add_subparsers(dest="ctl_cmd", metavar="COMMAND", required=True)
    rlist = add_ctl_command(commands, "list", "replicas, their phase and why", replica_list)
    rlist.add_argument("--model", help="only this model's")
    watch = add_ctl_command(
        commands, "watch", "follow ready endpoints (the gateway's view)", replica_watch
    )
    watch.add_argument("--model", help="only this model's")
