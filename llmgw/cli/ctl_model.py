"""`llmgw ctl model ...`: the catalog's models (list, show, create, update, delete, history)
and the changes applied to them (`update`, and through the planner `gpus`, `context`),
followed as rollouts."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from llmgw.cli.common import add_ctl_command, fleet_client
from llmgw.cli.ctl_rollout import ended, follow
from llmgw.cli.inputs import read_model_file
from llmgw.cli.output import (
    REPLICA_HEADERS,
    cards_of,
    cell,
    print_context_change,
    print_gpus_change,
    profiles_summary,
    replica_rows,
    table,
    when,
)
from llmgw.clients import FleetClient
from llmgw.clients.convert import Message, SetContextAnswer, SetGPUsAnswer, as_data, as_json
from llmgw.clients.fleet import STRATEGIES


def emit(opts: argparse.Namespace, answer: Message, human: Callable[[], None]) -> int:
    """Print `answer` as JSON with --json (the proto's field names), else call `human`; 0."""
    if opts.json:
        print(as_json(answer))
    else:
        human()
    return 0


def model_list(opts: argparse.Namespace) -> int:
    """`model list`: the catalog."""
    with fleet_client(opts) as fleet:
        answer = fleet.list_models()

    def human() -> None:
        if not answer.models:
            print("no models in the catalog: add one with `llmgw ctl model create FILE.yaml`")
            return
        rows = [
            [
                m.model.name,
                m.model.source,
                m.model.context_length or "-",
                profiles_summary(m.model),
                m.revision,
                f"yes ({m.declared_in})" if m.declared else "no",
            ]
            for m in answer.models
        ]
        print(table(("name", "source", "context", "profiles", "revision", "declared"), rows))

    return emit(opts, answer, human)


def model_show(opts: argparse.Namespace) -> int:
    """`model show NAME`: everything about one model, and its replicas."""
    with fleet_client(opts) as fleet:
        cm = fleet.get_model(opts.name)
        replicas = fleet.list_replicas(opts.name).replicas
    if opts.json:
        out = {
            "model": as_data(cm),
            "replicas": [as_data(r) for r in replicas],
        }
        print(json.dumps(out, indent=2))
        return 0
    m = cm.model
    rows: list[tuple[str, object]] = [
        ("name", m.name),
        ("source", m.source),
        ("context", f"{m.context_length} tokens" if m.context_length else "-"),
        ("max output", f"{m.max_output} tokens" if m.max_output else "-"),
        ("revision", f"{cm.revision} (etag {cm.etag})"),
        ("changed", f"{when(cm.updated_at)} by {cm.updated_by or '?'}"),
        ("declared", f"yes, in {cm.declared_in} (change it there)" if cm.declared else "no"),
    ]
    if m.HasField("origin") and (m.origin.repo or m.origin.files):
        origin = m.origin.repo + (f"@{m.origin.revision}" if m.origin.revision else "")
        rows.append(("origin", origin or "-"))
        rows += [("  file", f"{f.path} ({f.bytes} bytes)") for f in m.origin.files]
    for key, value in rows:
        print(f"{key + ':':<12} {value}")
    print("profiles:")
    for p in m.profiles:
        print(f"  {p.name}: {p.engine}, {p.replicas} replica(s) on {cards_of(p)}")
        print(f"    args: {cell(' '.join(p.args)) or '(none)'}")
    print("replicas:")
    if replicas:
        for line in table(REPLICA_HEADERS, replica_rows(replicas)).splitlines():
            print(f"  {line}")
    else:
        print("  none")
    return 0


def model_create(opts: argparse.Namespace) -> int:
    """`model create FILE`: add a model to the catalog."""
    model = read_model_file(opts.file)
    with fleet_client(opts) as fleet:
        answer = fleet.create_model(model, request_id=opts.request_id or "")
    name = answer.model.model.name
    return emit(
        opts,
        answer,
        lambda: print(
            f"created model {name} (revision {answer.model.revision}); "
            f"watch its replicas with `llmgw ctl replica list --model {name}`"
        ),
    )


def model_update(opts: argparse.Namespace) -> int:
    """`model update FILE`: replace a model; what its replicas run differently rolls out."""
    model = read_model_file(opts.file)
    with fleet_client(opts) as fleet:
        answer = fleet.update_model(
            model,
            etag=opts.etag or "",
            request_id=opts.request_id or "",
            dry_run=opts.dry_run,
            strategy=opts.strategy or "",
            supersede=opts.supersede,
            surge=opts.surge,
        )
        name = answer.model.model.name
        if opts.json:
            print(as_json(answer, indent=None), flush=True)
        elif answer.unchanged:
            print(f"model {name} is already as asked (revision {answer.model.revision})")
        elif opts.dry_run:
            n = answer.restarted
            print(f"dry run: nothing changed; {n} replica{'s' if n != 1 else ''} would restart")
        elif answer.rollout_id:
            n = answer.restarted
            print(
                f"updated model {name} (revision {answer.model.revision}); rollout "
                f"{answer.rollout_id} started ({n} replica{'s' if n != 1 else ''})"
            )
        else:
            print(
                f"updated model {name} (revision {answer.model.revision}); no replica needs "
                "starting again"
            )
        if opts.dry_run or not answer.rollout_id or opts.no_wait:
            return 0
        return ended(follow(fleet, answer.rollout_id, opts.json), opts.json)


def model_delete(opts: argparse.Namespace) -> int:
    """`model delete NAME`: remove a model; its replicas are drained and stopped."""
    with fleet_client(opts) as fleet:
        answer = fleet.delete_model(
            opts.name, etag=opts.etag or "", request_id=opts.request_id or ""
        )
    return emit(
        opts,
        answer,
        lambda: print(
            f"deleted model {opts.name} (revision {answer.model.revision}); "
            "its replicas are drained and stopped"
        ),
    )


def model_history(opts: argparse.Namespace) -> int:
    """`model history NAME`: every revision, who made it and when."""
    with fleet_client(opts) as fleet:
        answer = fleet.list_model_revisions(opts.name)

    def human() -> None:
        rows = [
            [
                r.revision,
                when(r.updated_at),
                r.updated_by or "?",
                r.model.context_length or "-",
                profiles_summary(r.model),
                " ".join(a for p in r.model.profiles for a in p.args) or "-",
            ]
            for r in answer.revisions
        ]
        print(table(("revision", "when", "by", "context", "profiles", "args"), rows))

    return emit(opts, answer, human)


def _ask(opts: argparse.Namespace, fleet: FleetClient) -> SetGPUsAnswer | SetContextAnswer:
    """Send the change; print it for people (not with --json)."""
    common = {
        "dry_run": opts.dry_run,
        "request_id": opts.request_id or "",
        "etag": opts.etag or "",
        "strategy": opts.strategy or "",
        "supersede": opts.supersede,
        "surge": opts.surge,
    }
    if opts.change == "gpus":
        answer = fleet.set_gpus(
            opts.model, opts.gpus, profile=opts.profile or "", in_place=opts.in_place, **common
        )
        if not opts.json:
            print_gpus_change(answer.change)
        return answer
    answer_c = fleet.set_context(opts.model, opts.tokens, slots=opts.slots, **common)
    if not opts.json:
        print_context_change(answer_c.change)
    return answer_c


def model_change(opts: argparse.Namespace) -> int:
    """`model gpus` / `model context`: ask, print the change, follow the rollout."""
    with fleet_client(opts) as fleet:
        answer = _ask(opts, fleet)
        if opts.json:
            print(as_json(answer, indent=None), flush=True)
        elif answer.unchanged:
            print(f"{opts.model} is already as asked: nothing written, nothing to roll out")
        elif opts.dry_run:
            print("dry run: nothing changed")
        elif answer.rollout_id:
            n = answer.change.restarted
            print(f"rollout {answer.rollout_id} started ({n} replica{'s' if n != 1 else ''})")
        else:
            print("no replica needs starting again")
        if opts.dry_run or not answer.rollout_id or opts.no_wait:
            return 0
        return ended(follow(fleet, answer.rollout_id, opts.json), opts.json)


def _change_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dry-run", action="store_true", help="answer what would change; change nothing"
    )
    p.add_argument("--no-wait", action="store_true", help="return once the rollout started")
    p.add_argument(
        "--strategy",
        choices=sorted(STRATEGIES),
        help="beside (default), in-place, or auto (beside where there is room)",
    )
    p.add_argument("--surge", type=int, default=0, help="replicas replaced at once (default 1)")
    p.add_argument("--supersede", action="store_true", help="cancel a rollout in progress")
    p.add_argument("--etag", help="the etag read; refused if the model changed since")
    p.add_argument("--request-id", help="retry-safe id (default: a new one)")


def add_commands(groups: Any) -> None:
    """Add the `model` group and its commands to `ctl`'s groups."""
    model = groups.add_parser("model", help="the catalog's models")
    commands = model.add_subparsers(dest="ctl_cmd", metavar="COMMAND", required=True)
    add_ctl_command(commands, "list", "every model of the catalog", model_list)
    show = add_ctl_command(
        commands, "show", "one model: profiles, revision, who and when, replicas", model_show
    )
    show.add_argument("name")
    create = add_ctl_command(
        commands, "create", "add a model from a YAML or JSON file", model_create
    )
    create.add_argument("file", help="a catalog model: name, source, context_length, profiles")
    create.add_argument("--request-id", help="retrying with the same id returns the first answer")
    update = add_ctl_command(
        commands,
        "update",
        "replace a model from a YAML or JSON file; changed replicas roll out",
        model_update,
    )
    update.add_argument("file", help="a catalog model: name, source, context_length, profiles")
    _change_flags(update)
    delete = add_ctl_command(
        commands, "delete", "remove a model and stop its replicas", model_delete
    )
    delete.add_argument("name")
    delete.add_argument("--etag", help="refuse unless the model still has this etag")
    delete.add_argument("--request-id", help="retrying with the same id returns the first answer")
    history = add_ctl_command(
        commands, "history", "every revision of a model: who and when", model_history
    )
    history.add_argument("name")

    gpus = add_ctl_command(
        commands, "gpus", "cards each replica uses on each of its nodes", model_change
    )
    gpus.add_argument("model")
    gpus.add_argument("gpus", type=int)
    gpus.add_argument("--profile", help="only this profile (default: every GPU profile)")
    gpus.add_argument("--in-place", action="store_true", help="stop each replica first")
    _change_flags(gpus)
    gpus.set_defaults(change="gpus")
    context = add_ctl_command(commands, "context", "tokens one request may use", model_change)
    context.add_argument("model")
    context.add_argument("tokens", type=int)
    context.add_argument("--slots", type=int, default=0, help="llama.cpp slots (0 keeps)")
    _change_flags(context)
    context.set_defaults(change="context")
