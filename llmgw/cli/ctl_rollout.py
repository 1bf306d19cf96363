"""`llmgw ctl rollout list|status|watch|cancel|undo|promote|abort`: the rollouts of applied
changes, following one until it ends (also after `ctl model gpus|context`), a canary's steps
as a live table.

Exit codes beyond `ctl`'s: 4 the rollout failed, 5 it was cancelled.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

from llmgw.cli.common import (
    EXIT_ROLLOUT_CANCELLED,
    EXIT_ROLLOUT_FAILED,
    add_canary_flags,
    add_ctl_command,
    canary_of,
    example,
    fleet_client,
)
from llmgw.cli.output import (
    Printer,
    event_line,
    print_rollout,
    printer,
    rollout_state,
    say,
    stage_name,
    table,
)
from llmgw.clients import ClientError, FleetClient
from llmgw.clients.convert import Rollout, RolloutEvent, as_data, enum_name

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
                say(f"{at} waiting [{r.profile}] {r.id}: pending: {r.reason}")


def follow(
    fleet: FleetClient, rollout_id: str, out: Printer, after_seq: int = 0, model: str = ""
) -> Rollout:
    """Print a rollout's events until it ends (the client resumes a dropped stream); the
    rollout as it ended. Given the `model` (and printing for people), also say why a replica
    the rollout created waits PENDING, each time the reason changes."""
    created: set[str] = set()
    stop = threading.Event()
    if model and not out.machine:
        threading.Thread(
            target=_say_waiting, args=(fleet, model, created, stop), daemon=True
        ).start()
    canary_rows = 0
    try:
        for ev in fleet.watch_rollout(rollout_id, after_seq):
            if enum_name(ev, "kind") == "ROLLOUT_EVENT_KIND_REPLICA_CREATED" and ev.replica_id:
                created.add(ev.replica_id)
            if ev.HasField("canary") and not out.machine:
                # A canary's steps and verdicts as a live table: a header, then a row each.
                if canary_rows % 20 == 0:
                    say(CANARY_HEADER)
                canary_rows += 1
                say(canary_row(ev))
                continue
            out.event(as_data(ev), event_line(ev))
    finally:
        stop.set()
    return fleet.get_rollout(rollout_id)


CANARY_COLUMNS = (
    ("time", 8),
    ("step", 5),
    ("new/old %", 9),
    ("verdict", 7),
    ("canary req", 10),
    ("err %", 6),
    ("ctx %", 6),
    ("ttft99", 7),
    ("itl99", 6),
    ("base req", 9),
    ("err %", 6),
)
CANARY_HEADER = "  ".join(name.rjust(width) for name, width in CANARY_COLUMNS) + "  findings"
"""The live table's header (printed again every 20 rows)."""


def canary_row(ev: RolloutEvent) -> str:
    """One canary event as a row of the live table: its step, weights, verdict and figures
    of the canary and the old revision (the baseline); findings or the message last."""
    c = ev.canary
    at = time.strftime("%H:%M:%S", time.localtime(ev.at.seconds))
    steps = len(c.policy.steps)
    step = "done" if c.promoted else f"{min(c.step + 1, steps)}/{steps}"
    verdict = enum_name(c, "verdict").removeprefix("CANARY_VERDICT_").lower()
    if verdict == "unspecified":
        verdict = "-"
    cells = (
        at,
        step,
        f"{c.weight_percent}/{100 - c.weight_percent}" if not c.promoted else "-",
        verdict,
        str(c.canary.requests),
        f"{100 * c.canary.error_ratio:.2f}",
        f"{100 * c.canary.context_refusal_ratio:.2f}",
        f"{c.canary.p99_ttft_ms:.0f}",
        f"{c.canary.p99_itl_ms:.0f}",
        str(c.baseline.requests),
        f"{100 * c.baseline.error_ratio:.2f}",
    )
    row = "  ".join(v.rjust(w) for v, (_n, w) in zip(cells, CANARY_COLUMNS, strict=True))
    return f"{row}  {'; '.join(c.findings) or ev.message}"


def ended(ro: Rollout, out: Printer) -> int:
    """Print how a rollout ended; its exit code."""
    if out.machine:
        out.event(as_data(ro), None)
    else:
        print_rollout(ro)
    state = enum_name(ro, "state")
    if state == "ROLLOUT_STATE_FAILED":
        if not out.machine:
            say(f"undo it with: llmgw ctl rollout undo {ro.id}")
        return EXIT_ROLLOUT_FAILED
    if state == "ROLLOUT_STATE_CANCELLED":
        return EXIT_ROLLOUT_CANCELLED
    return 0


def _rows(rollouts: list[Rollout], wide: bool) -> list[list[object]]:
    rows: list[list[object]] = []
    for r in rollouts:
        done = sum(1 for s in r.steps if stage_name(s) == "done")
        row: list[object] = [
            r.id,
            r.model,
            r.kind,
            rollout_state(r),
            f"{r.from_revision}->{r.to_revision}",
            f"{done}/{len(r.steps)}",
            r.created_by,
        ]
        if wide:
            row[-1:-1] = [enum_name(r, "strategy").removeprefix("STRATEGY_").lower()]
            row.append(r.reason or "")
        rows.append(row)
    return rows


def rollout_list(opts: argparse.Namespace) -> int:
    """`rollout list [--model M]`: rollouts, newest first."""
    with fleet_client(opts) as fleet:
        rollouts = fleet.list_rollouts(opts.model or "")
    headers = ("id", "model", "kind", "state", "rev", "steps", "by")
    wide_headers = ("id", "model", "kind", "state", "rev", "steps", "strategy", "by", "reason")
    printer(opts).show(
        [as_data(r) for r in rollouts],
        lambda: say(table(headers, _rows(rollouts, False))),
        [f"rollout/{r.id}" for r in rollouts],
        wide=lambda: say(table(wide_headers, _rows(rollouts, True))),
    )
    return 0


def _show_rollout(opts: argparse.Namespace, ro: Rollout) -> int:
    printer(opts).show(as_data(ro), lambda: print_rollout(ro), [f"rollout/{ro.id}"])
    return 0


def rollout_status(opts: argparse.Namespace) -> int:
    """`rollout status ID`: one rollout and its steps."""
    with fleet_client(opts) as fleet:
        return _show_rollout(opts, fleet.get_rollout(opts.id))


def rollout_watch(opts: argparse.Namespace) -> int:
    """`rollout watch ID [--after SEQ]`: follow a rollout until it ends."""
    out = printer(opts)
    with fleet_client(opts) as fleet:
        return ended(follow(fleet, opts.id, out, opts.after), out)


def rollout_cancel(opts: argparse.Namespace) -> int:
    """`rollout cancel ID`: stop a running rollout; old replicas keep serving."""
    with fleet_client(opts) as fleet:
        return _show_rollout(opts, fleet.cancel_rollout(opts.id))


def rollout_promote(opts: argparse.Namespace) -> int:
    """`rollout promote ID [--full]`: move a canary on without waiting for its analysis."""
    with fleet_client(opts) as fleet:
        return _show_rollout(opts, fleet.promote_rollout(opts.id, full=opts.full))


def rollout_abort(opts: argparse.Namespace) -> int:
    """`rollout abort ID`: end a rollout now (a canary: the old revision back at its full
    weight, the new replicas retired); the same request as cancel."""
    with fleet_client(opts) as fleet:
        return _show_rollout(opts, fleet.cancel_rollout(opts.id))


def rollout_undo(opts: argparse.Namespace) -> int:
    """`rollout undo ID`: roll a model back to the revision before a rollout, and follow the
    rollout that does it."""
    out = printer(opts)
    with fleet_client(opts) as fleet:
        u = fleet.undo_rollout(opts.id, dry_run=opts.dry_run, canary=canary_of(opts))
        name, rev = u.model.model.name, u.model.revision
        if opts.dry_run or not u.rollout.id or opts.no_wait:
            out.show(
                as_data(u),
                lambda: say(f"{name} back to its earlier settings as revision {rev}"),
                [f"model/{name}"],
            )
            return 0
        out.event(as_data(u), f"{name} back to its earlier settings as revision {rev}")
        return ended(follow(fleet, u.rollout.id, out), out)


def add_commands(groups: Any) -> None:
    """Add the `rollout` group and its commands to `ctl`'s groups."""
    rollout = groups.add_parser(
        "rollout",
        help="rollouts of applied changes",
        description="The rollouts of applied changes: list them, follow, cancel or undo one; "
        "promote or abort a canary.",
        epilog=example("llmgw ctl rollout list"),
    )
    commands = rollout.add_subparsers(dest="ctl_cmd", metavar="COMMAND", required=True)
    lst = add_ctl_command(
        commands,
        "list",
        "rollouts, newest first",
        rollout_list,
        "llmgw ctl rollout list --model tiny-llama -o wide",
    )
    lst.add_argument("--model", help="only this model's rollouts (default: every model's)")
    status = add_ctl_command(
        commands,
        "status",
        "one rollout and its steps",
        rollout_status,
        "llmgw ctl rollout status ro-1a2b3c4d -o yaml",
    )
    status.add_argument(
        "id", metavar="ID", help="the rollout's id (`llmgw ctl rollout list` shows them)"
    )
    watch = add_ctl_command(
        commands,
        "watch",
        "follow a rollout until it ends",
        rollout_watch,
        "llmgw ctl rollout watch ro-1a2b3c4d",
    )
    watch.add_argument("id", metavar="ID", help="the rollout's id")
    watch.add_argument(
        "--after", type=int, default=0, help="resume after this event's seq (0: from the start)"
    )
    cancel = add_ctl_command(
        commands,
        "cancel",
        "stop a running rollout; old replicas keep serving",
        rollout_cancel,
        "llmgw ctl rollout cancel ro-1a2b3c4d",
    )
    cancel.add_argument("id", metavar="ID", help="the rollout's id")
    undo = add_ctl_command(
        commands,
        "undo",
        "roll a model back to the revision before a rollout",
        rollout_undo,
        "llmgw ctl rollout undo ro-1a2b3c4d --dry-run",
    )
    undo.add_argument("id", metavar="ID", help="the rollout whose change to undo")
    undo.add_argument(
        "--dry-run", action="store_true", help="answer what would change; change nothing"
    )
    undo.add_argument(
        "--no-wait", action="store_true", help="return once the undoing rollout started"
    )
    add_canary_flags(undo)
    promote = add_ctl_command(
        commands,
        "promote",
        "move a canary to its next step without waiting for its analysis",
        rollout_promote,
        "llmgw ctl rollout promote ro-1a2b3c4d --full",
    )
    promote.add_argument("id", metavar="ID", help="the canary rollout's id")
    promote.add_argument("--full", action="store_true", help="past every remaining step at once")
    abort = add_ctl_command(
        commands,
        "abort",
        "end a rollout now: a canary's old revision gets its full weight back",
        rollout_abort,
        "llmgw ctl rollout abort ro-1a2b3c4d",
    )
    abort.add_argument("id", metavar="ID", help="the rollout's id")
