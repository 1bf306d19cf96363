"""`llmgw ctl rollout list|status|watch|cancel|undo`: the rollouts of applied changes, and
following one until it ends (also after `ctl model gpus|context`).

Exit codes beyond `ctl`'s: 4 the rollout failed, 5 it was cancelled.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

from llmgw.cli.common import (
    EXIT_ROLLOUT_CANCELLED,
    EXIT_ROLLOUT_FAILED,
    add_ctl_command,
    fleet_client,
)
from llmgw.cli.output import event_line, print_rollout, rollout_state, stage_name
from llmgw.clients import ClientError, FleetClient
from llmgw.clients.convert import Rollout, as_data, as_json, enum_name

WAITING_POLL_S = 2.0
"""How often a followed rollout's new replicas are looked at for why they wait (a PENDING
replica makes no rollout event: without this the CLI says nothing until it is placed)."""


def _say_waiting(fleet: FleetClient, model: str, created: set[str], stop: threading.Event) -> None:
    """Until `stop`, print each new reason a replica of `created` is PENDING for."""
    said: dict[str, str] = {}
    while not stop.wait(WAITING_POLL_S):
        try:
            found = fleet.list_replicas(model).replicas
        except ClientError:
            continue  # the watch itself reports a fleet that went away
        for r in found:
            pending = enum_name(r, "phase") == "REPLICA_PHASE_PENDING"
            if r.id in created and pending and r.reason and said.get(r.id) != r.reason:
                said[r.id] = r.reason
                at = time.strftime("%H:%M:%S")
                print(f"{at} waiting [{r.profile}] {r.id}: pending: {r.reason}", flush=True)


def follow(
    fleet: FleetClient, rollout_id: str, as_json_lines: bool, after_seq: int = 0, model: str = ""
) -> Rollout:
    """Print a rollout's events until it ends (the client resumes a dropped stream); the
    rollout as it ended. Given the `model` (and not printing JSON), also say why a replica
    the rollout created waits PENDING, each time the reason changes."""
    created: set[str] = set()
    stop = threading.Event()
    if model and not as_json_lines:
        threading.Thread(
            target=_say_waiting, args=(fleet, model, created, stop), daemon=True
        ).start()
    try:
        for ev in fleet.watch_rollout(rollout_id, after_seq):
            if enum_name(ev, "kind") == "ROLLOUT_EVENT_KIND_REPLICA_CREATED" and ev.replica_id:
                created.add(ev.replica_id)
            print(as_json(ev, indent=None) if as_json_lines else event_line(ev), flush=True)
    finally:
        stop.set()
    return fleet.get_rollout(rollout_id)


def ended(ro: Rollout, as_json_line: bool) -> int:
    """Print how a rollout ended; its exit code."""
    if as_json_line:
        print(as_json(ro, indent=None))
    else:
        print_rollout(ro)
    state = enum_name(ro, "state")
    if state == "ROLLOUT_STATE_FAILED":
        if not as_json_line:
            print(f"undo it with: llmgw ctl rollout undo {ro.id}")
        return EXIT_ROLLOUT_FAILED
    if state == "ROLLOUT_STATE_CANCELLED":
        return EXIT_ROLLOUT_CANCELLED
    return 0


def rollout_list(opts: argparse.Namespace) -> int:
    """`rollout list [--model M]`: rollouts, newest first."""
    with fleet_client(opts) as fleet:
        rollouts = fleet.list_rollouts(opts.model or "")
    if opts.json:
        print(json.dumps([as_data(r) for r in rollouts], indent=2))
        return 0
    print(f"{'ID':<14} {'MODEL':<20} {'KIND':<8} {'STATE':<10} {'REV':<9} {'STEPS':<6} BY")
    for r in rollouts:
        done = sum(1 for s in r.steps if stage_name(s) == "done")
        print(
            f"{r.id:<14} {r.model:<20} {r.kind:<8} {rollout_state(r):<10} "
            f"{f'{r.from_revision}->{r.to_revision}':<9} {f'{done}/{len(r.steps)}':<6} "
            f"{r.created_by}"
        )
    return 0


def rollout_status(opts: argparse.Namespace) -> int:
    """`rollout status ID`: one rollout and its steps."""
    with fleet_client(opts) as fleet:
        ro = fleet.get_rollout(opts.id)
    if opts.json:
        print(as_json(ro))
    else:
        print_rollout(ro)
    return 0


def rollout_watch(opts: argparse.Namespace) -> int:
    """`rollout watch ID [--after SEQ]`: follow a rollout until it ends."""
    with fleet_client(opts) as fleet:
        return ended(follow(fleet, opts.id, opts.json, opts.after), opts.json)


def rollout_cancel(opts: argparse.Namespace) -> int:
    """`rollout cancel ID`: stop a running rollout; old replicas keep serving."""
    with fleet_client(opts) as fleet:
        ro = fleet.cancel_rollout(opts.id)
    if opts.json:
        print(as_json(ro))
    else:
        print_rollout(ro)
    return 0


def rollout_undo(opts: argparse.Namespace) -> int:
    """`rollout undo ID`: roll a model back to the revision before a rollout, and follow the
    rollout that does it."""
    with fleet_client(opts) as fleet:
        u = fleet.undo_rollout(opts.id, dry_run=opts.dry_run)
        if not opts.json:
            name, rev = u.model.model.name, u.model.revision
            print(f"{name} back to its earlier settings as revision {rev}")
        if opts.dry_run or not u.rollout.id or opts.no_wait:
            if opts.json:
                print(as_json(u))
            return 0
        return ended(follow(fleet, u.rollout.id, opts.json), opts.json)


def add_commands(groups: Any) -> None:
    """Add the `rollout` group and its commands to `ctl`'s groups."""
    rollout = groups.add_parser("rollout", help="rollouts of applied changes")
    commands = rollout.add_subparsers(dest="ctl_cmd", metavar="COMMAND", required=True)
    lst = add_ctl_command(commands, "list", "rollouts, newest first", rollout_list)
    lst.add_argument("--model", help="only this model's")
    status = add_ctl_command(commands, "status", "one rollout and its steps", rollout_status)
    status.add_argument("id")
    watch = add_ctl_command(commands, "watch", "follow a rollout until it ends", rollout_watch)
    watch.add_argument("id")
    watch.add_argument("--after", type=int, default=0, help="resume after this event seq")
    cancel = add_ctl_command(
        commands, "cancel", "stop a running rollout; old replicas keep serving", rollout_cancel
    )
    cancel.add_argument("id")
    undo = add_ctl_command(
        commands, "undo", "roll a model back to the revision before a rollout", rollout_undo
    )
    undo.add_argument("id")
    undo.add_argument("--dry-run", action="store_true")
    undo.add_argument("--no-wait", action="store_true")
