"""`llmgw ctl model gpus|context` and `llmgw ctl rollout ...`: apply plans and follow them.

Exit codes: 0 done (or a dry run), 2 refused, 3 the fleet did not answer, 4 the rollout
failed, 5 it was cancelled, 64 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from typing import Any

import grpc
from google.protobuf import json_format

from llmgw.cli.main import EXIT_REFUSED, EXIT_UNREACHABLE, print_change, refusal_text
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc

EXIT_FAILED = 4
EXIT_CANCELLED = 5
DEFAULT_FLEET = "127.0.0.1:50052"
RECONNECT_S = 1.0

_STRATEGIES: dict[str, fleet_pb2.Strategy.ValueType] = {
    "beside": fleet_pb2.STRATEGY_BESIDE,
    "in-place": fleet_pb2.STRATEGY_IN_PLACE,
    "auto": fleet_pb2.STRATEGY_AUTO,
}
_STATE_NAMES = {
    v: k.removeprefix("ROLLOUT_STATE_").lower() for k, v in fleet_pb2.RolloutState.items()
}


def _metadata(opts: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    caller = getattr(opts, "caller", None) or os.environ.get("USER", "")
    return (("x-llmgw-caller", caller),) if caller else ()


def _stub(opts: argparse.Namespace) -> tuple[grpc.Channel, fleet_pb2_grpc.FleetServiceStub]:
    channel = grpc.insecure_channel(opts.fleet)
    return channel, fleet_pb2_grpc.FleetServiceStub(channel)


def _refused(err: grpc.RpcError, opts: argparse.Namespace) -> int:
    code = err.code()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        print(f"llmgw: the fleet at {opts.fleet} did not answer ({code.name})", file=sys.stderr)
        return EXIT_UNREACHABLE
    text, info = refusal_text(err)
    if opts.json:
        print(json.dumps({"error": info}, indent=2))
    else:
        print(text, file=sys.stderr)
    return EXIT_REFUSED


def _event_line(ev: fleet_pb2.WatchRolloutResponse) -> str:
    """One event for people: when, what, which replica on which node and cards."""
    at = time.strftime("%H:%M:%S", time.localtime(ev.at.seconds))
    where = ""
    if ev.node:
        where = f" on {ev.node}"
        if ev.gpus:
            where += f" cards {','.join(map(str, ev.gpus))}"
    who = f" {ev.replica_id}" if ev.replica_id else ""
    how = f" ({ev.mode})" if ev.mode else ""
    profile = f" [{ev.profile}]" if ev.profile else ""
    msg = f": {ev.message}" if ev.message else ""
    return f"{at} {ev.kind.replace('_', ' ')}{profile}{who}{where}{how}{msg}"


def follow(
    stub: fleet_pb2_grpc.FleetServiceStub, rollout_id: str, as_json: bool, after_seq: int = 0
) -> fleet_pb2.Rollout:
    """Print a rollout's events until it ends, resuming after a dropped stream."""
    seq = after_seq
    while True:
        try:
            for ev in stub.WatchRollout(
                fleet_pb2.WatchRolloutRequest(id=rollout_id, after_seq=seq)
            ):
                seq = ev.seq
                if as_json:
                    print(json_format.MessageToJson(ev, indent=None), flush=True)
                else:
                    print(_event_line(ev), flush=True)
            break
        except grpc.RpcError as err:
            if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL):
                raise
            time.sleep(RECONNECT_S)  # the stream dropped: resume after the last event seen
    return stub.GetRollout(fleet_pb2.GetRolloutRequest(id=rollout_id)).rollout


def _ended(ro: fleet_pb2.Rollout, as_json: bool) -> int:
    """Print how a rollout ended; its exit code."""
    if as_json:
        print(json_format.MessageToJson(ro, indent=None))
    else:
        print_rollout(ro)
    if ro.state == fleet_pb2.ROLLOUT_STATE_FAILED:
        if not as_json:
            print(f"undo it with: llmgw ctl rollout undo {ro.id}")
        return EXIT_FAILED
    if ro.state == fleet_pb2.ROLLOUT_STATE_CANCELLED:
        return EXIT_CANCELLED
    return 0


def print_rollout(ro: fleet_pb2.Rollout) -> None:
    """A rollout for people: state, revisions, a line per step, why it ended."""
    strategy = fleet_pb2.Strategy.Name(ro.strategy).removeprefix("STRATEGY_").lower()
    print(
        f"rollout {ro.id} of {ro.model} ({ro.kind}, {strategy}): {_STATE_NAMES[ro.state]}, "
        f"revision {ro.from_revision} -> {ro.to_revision}"
    )
    for s in ro.steps:
        where = f" on {s.node} cards {','.join(map(str, s.gpus))}" if s.node else ""
        print(
            f"  [{s.profile}] {s.old_replica or '(new)'} -> {s.new_replica or '?'}"
            f"{where}: {s.stage}{' ' + s.mode if s.mode else ''}"
        )
    if ro.reason:
        print(f"  reason: {ro.reason}")
    for line in ro.log_tail:
        print(f"  | {line}")


def run_change(opts: argparse.Namespace) -> int:
    """`model gpus` / `model context`: ask, print the change, follow the rollout."""
    channel, stub = _stub(opts)
    with channel:
        request_id = opts.request_id or uuid.uuid4().hex
        strategy = _STRATEGIES.get(opts.strategy or "", fleet_pb2.STRATEGY_UNSPECIFIED)
        try:
            if opts.change == "gpus":
                answer: Any = stub.SetGPUs(
                    fleet_pb2.SetGPUsRequest(
                        name=opts.model,
                        gpus=opts.gpus,
                        profile=opts.profile or "",
                        in_place=opts.in_place,
                        dry_run=opts.dry_run,
                        request_id=request_id,
                        etag=opts.etag or "",
                        strategy=strategy,
                        supersede=opts.supersede,
                        surge=opts.surge,
                    ),
                    metadata=_metadata(opts),
                    timeout=opts.timeout,
                )
            else:
                answer = stub.SetContext(
                    fleet_pb2.SetContextRequest(
                        name=opts.model,
                        tokens=opts.tokens,
                        slots=opts.slots,
                        dry_run=opts.dry_run,
                        request_id=request_id,
                        etag=opts.etag or "",
                        strategy=strategy,
                        supersede=opts.supersede,
                        surge=opts.surge,
                    ),
                    metadata=_metadata(opts),
                    timeout=opts.timeout,
                )
        except grpc.RpcError as err:
            return _refused(err, opts)
        if opts.json:
            print(json_format.MessageToJson(answer, indent=None), flush=True)
        else:
            print_change(answer.change)
            if opts.dry_run:
                print("dry run: nothing changed")
            elif answer.rollout_id:
                n = answer.change.restarted
                print(f"rollout {answer.rollout_id} started ({n} replica{'s' if n != 1 else ''})")
            else:
                print("no replica needs starting again")
        if opts.dry_run or not answer.rollout_id or opts.no_wait:
            return 0
        try:
            ro = follow(stub, answer.rollout_id, opts.json)
        except grpc.RpcError as err:
            return _refused(err, opts)
        return _ended(ro, opts.json)


def run_rollout(opts: argparse.Namespace) -> int:
    """`rollout list|status|watch|cancel|undo`."""
    channel, stub = _stub(opts)
    with channel:
        try:
            if opts.rollout_cmd == "list":
                rollouts = stub.ListRollouts(
                    fleet_pb2.ListRolloutsRequest(model=opts.model or ""), timeout=opts.timeout
                ).rollouts
                if opts.json:
                    print(json.dumps([json_format.MessageToDict(r) for r in rollouts], indent=2))
                    return 0
                print(
                    f"{'ID':<14} {'MODEL':<20} {'KIND':<8} {'STATE':<10} {'REV':<9} {'STEPS':<6} BY"
                )
                for r in rollouts:
                    done = sum(1 for s in r.steps if s.stage == "done")
                    print(
                        f"{r.id:<14} {r.model:<20} {r.kind:<8} {_STATE_NAMES[r.state]:<10} "
                        f"{f'{r.from_revision}->{r.to_revision}':<9} {f'{done}/{len(r.steps)}':<6} "
                        f"{r.created_by}"
                    )
                return 0
            if opts.rollout_cmd == "status":
                ro = stub.GetRollout(fleet_pb2.GetRolloutRequest(id=opts.id), timeout=opts.timeout)
                if opts.json:
                    print(json_format.MessageToJson(ro.rollout))
                else:
                    print_rollout(ro.rollout)
                return 0
            if opts.rollout_cmd == "watch":
                return _ended(follow(stub, opts.id, opts.json, opts.after), opts.json)
            if opts.rollout_cmd == "cancel":
                c = stub.CancelRollout(
                    fleet_pb2.CancelRolloutRequest(id=opts.id, request_id=uuid.uuid4().hex),
                    metadata=_metadata(opts),
                    timeout=opts.timeout,
                )
                if opts.json:
                    print(json_format.MessageToJson(c.rollout))
                else:
                    print_rollout(c.rollout)
                return 0
            u = stub.UndoRollout(
                fleet_pb2.UndoRolloutRequest(
                    id=opts.id, request_id=uuid.uuid4().hex, dry_run=opts.dry_run
                ),
                metadata=_metadata(opts),
                timeout=opts.timeout,
            )
            if not opts.json:
                name, rev = u.model.model.name, u.model.revision
                print(f"{name} back to its earlier settings as revision {rev}")
            if opts.dry_run or not u.rollout.id or opts.no_wait:
                if opts.json:
                    print(json_format.MessageToJson(u))
                return 0
            return _ended(follow(stub, u.rollout.id, opts.json), opts.json)
        except grpc.RpcError as err:
            return _refused(err, opts)


def add_change_commands(model_sub: Any, common: argparse.ArgumentParser) -> None:
    """`model gpus` and `model context` under `llmgw ctl model`."""

    def change_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--dry-run", action="store_true", help="answer what would change; change nothing"
        )
        p.add_argument("--no-wait", action="store_true", help="return once the rollout started")
        p.add_argument(
            "--strategy",
            choices=sorted(_STRATEGIES),
            help="beside (default), in-place, or auto (beside where there is room)",
        )
        p.add_argument("--surge", type=int, default=0, help="replicas replaced at once (default 1)")
        p.add_argument("--supersede", action="store_true", help="cancel a rollout in progress")
        p.add_argument("--etag", help="the revision read; refused if the model changed since")
        p.add_argument("--request-id", help="retry-safe id (default: a new one)")

    gpus = model_sub.add_parser(
        "gpus", parents=[common], help="cards of one node each replica uses"
    )
    gpus.add_argument("model")
    gpus.add_argument("gpus", type=int)
    gpus.add_argument("--profile", help="only this profile (default: every GPU profile)")
    gpus.add_argument("--in-place", action="store_true", help="stop each replica first")
    change_flags(gpus)
    gpus.set_defaults(func=run_change, change="gpus")
    context = model_sub.add_parser("context", parents=[common], help="tokens one request may use")
    context.add_argument("model")
    context.add_argument("tokens", type=int)
    context.add_argument("--slots", type=int, default=0, help="llama.cpp slots (0 keeps)")
    change_flags(context)
    context.set_defaults(func=run_change, change="context")


def add_rollout_commands(ctl_sub: Any, common: argparse.ArgumentParser) -> None:
    """`llmgw ctl rollout list|status|watch|cancel|undo`."""
    rollout = ctl_sub.add_parser("rollout", help="rollouts of applied changes")
    sub = rollout.add_subparsers(dest="rollout_cmd", required=True)
    lst = sub.add_parser("list", parents=[common], help="rollouts, newest first")
    lst.add_argument("--model", help="only this model's")
    lst.set_defaults(func=run_rollout)
    for name, text in (
        ("status", "one rollout and its steps"),
        ("watch", "follow a rollout until it ends"),
        ("cancel", "stop a running rollout; old replicas keep serving"),
        ("undo", "roll a model back to the revision before a rollout"),
    ):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("id")
        if name == "watch":
            p.add_argument("--after", type=int, default=0, help="resume after this event seq")
        if name == "undo":
            p.add_argument("--dry-run", action="store_true")
            p.add_argument("--no-wait", action="store_true")
        p.set_defaults(func=run_rollout)
