"""`llmgw ctl node list` and `llmgw ctl replica list|watch`: where the fleet runs things."""

from __future__ import annotations

import argparse
import contextlib
import threading
from typing import Any

from llmgw.cli.common import add_ctl_command, example, fleet_client
from llmgw.cli.output import (
    REPLICA_HEADERS,
    age,
    gib,
    printer,
    replica_rows,
    say,
    short_name,
    table,
)
from llmgw.cli.progress import ProgressFollower
from llmgw.clients.convert import Node, Replica, as_data


def _node_rows(nodes: list[Node], wide: bool) -> list[list[object]]:
    rows: list[list[object]] = []
    for n in nodes:
        used = sum(card.memory_used_bytes for card in n.cards)
        total = sum(card.memory_total_bytes for card in n.cards)
        row: list[object] = [
            n.name,
            short_name(n, "phase", "NODE_PHASE_"),
            n.gpu_class or "CPU",
            f"{n.free_gpus}/{len(n.cards)}",
            f"{gib(used)}/{gib(total)} GiB" if n.cards else "-",
            age(n.last_heartbeat),
        ]
        if wide:
            row.append(",".join(f"{k}={v}" for k, v in sorted(n.labels.items())) or "-")
        row.append(n.reason or "")
        rows.append(row)
    return rows


def node_list(opts: argparse.Namespace) -> int:
    """`node list`: the nodes whose agents connected, their cards and phase."""
    with fleet_client(opts) as fleet:
        answer = fleet.list_nodes()
    nodes = list(answer.nodes)
    headers = ["name", "phase", "class", "cards free", "card memory", "heartbeat", "reason"]

    def human(wide: bool = False) -> None:
        if not nodes:
            say("no nodes: start an agent (`python -m fleet_svc.agent --fleet HOST:PORT ...`)")
            return
        cols = [*headers[:-1], "labels", headers[-1]] if wide else headers
        say(table(cols, _node_rows(nodes, wide)))

    printer(opts).show(
        as_data(answer), human, [f"node/{n.name}" for n in nodes], wide=lambda: human(True)
    )
    return 0


def _replica_wide_rows(replicas: list[Replica]) -> list[list[object]]:
    return [
        [*row[:-1], r.revision, r.engine or "-", row[-1]]
        for r, row in zip(replicas, replica_rows(replicas), strict=True)
    ]


def replica_list(opts: argparse.Namespace) -> int:
    """`replica list [--model M]`: the replicas, their phase and why."""
    with fleet_client(opts) as fleet:
        answer = fleet.list_replicas(opts.model or "")
    replicas = list(answer.replicas)

    def human(wide: bool = False) -> None:
        if not replicas:
            say("no replicas" + (f" of {opts.model}" if opts.model else ""))
        elif wide:
            headers = [*REPLICA_HEADERS[:-1], "revision", "engine", REPLICA_HEADERS[-1]]
            say(table(headers, _replica_wide_rows(replicas)))
        else:
            say(table(REPLICA_HEADERS, replica_rows(replicas)))

    printer(opts).show(
        as_data(answer), human, [f"replica/{r.id}" for r in replicas], wide=lambda: human(True)
    )
    return 0


def replica_watch(opts: argparse.Namespace) -> int:
    """`replica watch [--model M]`: follow the ready endpoints, one line per event, and the
    starting replicas' progress (unless --no-progress), until interrupted."""
    out = printer(opts)
    lock = threading.Lock()
    names = out.told is not None and out.told.kind == "name"
    with (
        fleet_client(opts) as fleet,
        contextlib.closing(fleet.watch_replicas(opts.model or "")) as events,
    ):
        follower = None
        if opts.progress and not names:
            follower = ProgressFollower(fleet, opts.model or "", out.event, lock)
            follower.start()
        try:
            for event in events:
                kind = short_name(event, "kind", "KIND_")
                line: str | None
                e = event.endpoint
                if kind == "HEARTBEAT" or (names and kind == "SYNCED"):
                    line = None  # the fleet's keepalive on a quiet stream: nothing to show
                elif kind == "SYNCED":
                    line = "SYNCED   every ready endpoint above; changes follow"
                elif names:
                    line = f"replica/{e.replica_id}"
                else:
                    line = (
                        f"{kind:<8} {e.model}/{e.profile} {e.replica_id} {e.address} "
                        f"node={e.node} revision={e.revision}"
                    )
                    if kind == "REMOVED":
                        line += " reason=" + short_name(event, "reason", "ENDPOINT_REASON_")
                with lock:
                    out.event(as_data(event), line)
        except KeyboardInterrupt:
            return 0
        finally:
            if follower is not None:
                follower.stop()
    return 0


def add_commands(groups: Any) -> None:
    """Add the `node` and `replica` groups and their commands to `ctl`'s groups."""
    node = groups.add_parser(
        "node",
        help="the nodes and their cards",
        description="The nodes whose agents connected to the fleet, and their cards.",
        epilog=example("llmgw ctl node list -o wide"),
    )
    commands = node.add_subparsers(dest="ctl_cmd", metavar="COMMAND", required=True)
    add_ctl_command(
        commands,
        "list",
        "every node: phase, cards, memory, heartbeat",
        node_list,
        "llmgw ctl node list -o name",
    )

    replica = groups.add_parser(
        "replica",
        help="the replicas",
        description="The replicas the fleet runs: list them, or follow the ready endpoints.",
        epilog=example("llmgw ctl replica list --model tiny-llama"),
    )
    commands = replica.add_subparsers(dest="ctl_cmd", metavar="COMMAND", required=True)
    rlist = add_ctl_command(
        commands,
        "list",
        "replicas, their phase and why",
        replica_list,
        "llmgw ctl replica list --model tiny-llama -o wide",
    )
    rlist.add_argument("--model", help="only this model's replicas (default: every model's)")
    watch = add_ctl_command(
        commands,
        "watch",
        "follow ready endpoints (the gateway's view) and starting replicas' progress",
        replica_watch,
        "llmgw ctl replica watch --model tiny-llama -o json",
    )
    watch.add_argument("--model", help="only this model's endpoints (default: every model's)")
    watch.add_argument(
        "--no-progress",
        dest="progress",
        action="store_false",
        help="no PROGRESS lines: only the endpoint stream's events (default: both; the "
        "starting replicas are asked for once a second)",
    )
