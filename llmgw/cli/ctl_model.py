"""`llmgw ctl model ...`: the catalog's models (list, show, create, update, delete, history)
and the changes applied to them (`update`, and through the planner `gpus`, `context`),
followed as rollouts."""

from __future__ import annotations

import argparse
from typing import Any

from llmgw.cli.common import (
    add_canary_flags,
    add_ctl_command,
    canary_of,
    example,
    fleet_client,
    sequences_flag,
)
from llmgw.cli.ctl_rollout import ended, follow
from llmgw.cli.inputs import read_model_file
from llmgw.cli.output import (
    REPLICA_HEADERS,
    Printer,
    cards_of,
    cell,
    print_batches,
    print_context_change,
    print_gpus_change,
    printer,
    profiles_summary,
    replica_rows,
    say,
    table,
    when,
)
from llmgw.clients import FleetClient
from llmgw.clients.convert import CatalogModel, SetContextAnswer, SetGPUsAnswer, as_data
from llmgw.clients.fleet import STRATEGIES


def _model_row(m: CatalogModel, wide: bool) -> list[object]:
    row: list[object] = [
        m.model.name,
        m.model.source,
        m.model.context_length or "-",
        profiles_summary(m.model),
        m.revision,
        f"yes ({m.declared_in})" if m.declared else "no",
    ]
    if wide:
        row += [m.model.max_output or "-", m.etag, m.updated_by or "?", when(m.updated_at)]
    return row


def model_list(opts: argparse.Namespace) -> int:
    """`model list`: the catalog."""
    with fleet_client(opts) as fleet:
        answer = fleet.list_models()
    headers = ["name", "source", "context", "profiles", "revision", "declared"]

    def human(wide: bool = False) -> None:
        if not answer.models:
            say("no models in the catalog: add one with `llmgw ctl model create FILE.yaml`")
            return
        cols = [*headers, "max output", "etag", "changed by", "changed"] if wide else headers
        say(table(cols, [_model_row(m, wide) for m in answer.models]))

    printer(opts).show(
        as_data(answer),
        human,
        [f"model/{m.model.name}" for m in answer.models],
        wide=lambda: human(True),
    )
    return 0


def model_show(opts: argparse.Namespace) -> int:
    """`model show NAME`: everything about one model, and its replicas."""
    with fleet_client(opts) as fleet:
        cm = fleet.get_model(opts.name)
        replicas = fleet.list_replicas(opts.name).replicas
    data = {"model": as_data(cm), "replicas": [as_data(r) for r in replicas]}
    printer(opts).show(data, lambda: _show_human(cm, list(replicas)), [f"model/{opts.name}"])
    return 0


def _show_human(cm: CatalogModel, replicas: list[Any]) -> None:
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
        say(f"{key + ':':<12} {value}")
    say("profiles:")
    for p in m.profiles:
        say(f"  {p.name}: {p.engine}, {p.replicas} replica(s) on {cards_of(p)}")
        say(f"    args: {cell(' '.join(p.args)) or '(none)'}")
    say("replicas:")
    if replicas:
        for line in table(REPLICA_HEADERS, replica_rows(replicas)).splitlines():
            say(f"  {line}")
    else:
        say("  none")


def model_create(opts: argparse.Namespace) -> int:
    """`model create FILE`: add a model to the catalog."""
    model = read_model_file(opts.file)
    with fleet_client(opts) as fleet:
        answer = fleet.create_model(model, request_id=opts.request_id or "")
    name = answer.model.model.name
    printer(opts).show(
        as_data(answer),
        lambda: say(
            f"created model {name} (revision {answer.model.revision}); "
            f"watch its replicas with `llmgw ctl replica list --model {name}`"
        ),
        [f"model/{name}"],
    )
    return 0


def model_update(opts: argparse.Namespace) -> int:
    """`model update FILE`: replace a model; what its replicas run differently rolls out."""
    model = read_model_file(opts.file)
    out = printer(opts)
    with fleet_client(opts) as fleet:
        answer = fleet.update_model(
            model,
            etag=opts.etag or "",
            request_id=opts.request_id or "",
            dry_run=opts.dry_run,
            strategy=opts.strategy or "",
            supersede=opts.supersede,
            surge=opts.surge,
            canary=canary_of(opts),
        )
        name = answer.model.model.name
        n = answer.restarted
        replicas = f"{n} replica{'s' if n != 1 else ''}"
        if answer.unchanged:
            line = f"model {name} is already as asked (revision {answer.model.revision})"
        elif opts.dry_run:
            line = f"dry run: nothing changed; {replicas} would restart"
        elif answer.rollout_id:
            line = (
                f"updated model {name} (revision {answer.model.revision}); rollout "
                f"{answer.rollout_id} started ({replicas})"
            )
        else:
            line = (
                f"updated model {name} (revision {answer.model.revision}); no replica needs "
                "starting again"
            )
        _said(out, as_data(answer), line, f"model/{name}")
        if opts.dry_run or not answer.rollout_id or opts.no_wait:
            return 0
        return ended(follow(fleet, answer.rollout_id, out), out)


def _said(out: Printer, data: Any, line: str, name: str) -> None:
    """The first answer of a change that may be followed: one line (JSON: on one line, a YAML
    document), or its kind/name for `-o name`."""
    if out.told is not None and out.told.kind == "name":
        out.event(data, name)
    else:
        out.event(data, line)


def model_delete(opts: argparse.Namespace) -> int:
    """`model delete NAME`: remove a model; its replicas are drained and stopped."""
    with fleet_client(opts) as fleet:
        answer = fleet.delete_model(
            opts.name, etag=opts.etag or "", request_id=opts.request_id or ""
        )
    printer(opts).show(
        as_data(answer),
        lambda: say(
            f"deleted model {opts.name} (revision {answer.model.revision}); "
            "its replicas are drained and stopped"
        ),
        [f"model/{opts.name}"],
    )
    return 0


def model_history(opts: argparse.Namespace) -> int:
    """`model history NAME`: every revision, who made it and when."""
    with fleet_client(opts) as fleet:
        answer = fleet.list_model_revisions(opts.name)

    def human() -> None:
        rows: list[list[object]] = [
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
        say(table(("revision", "when", "by", "context", "profiles", "args"), rows))

    printer(opts).show(
        as_data(answer), human, [f"model/{opts.name}@{r.revision}" for r in answer.revisions]
    )
    return 0


def _ask(
    opts: argparse.Namespace, fleet: FleetClient, out: Printer
) -> SetGPUsAnswer | SetContextAnswer:
    """Send the change; print it for people (not as data)."""
    common = {
        "dry_run": opts.dry_run,
        "request_id": opts.request_id or "",
        "etag": opts.etag or "",
        "strategy": opts.strategy or "",
        "supersede": opts.supersede,
        "surge": opts.surge,
        "allow_unchecked": opts.allow_unchecked,
        "canary": canary_of(opts),
        "sequences": opts.sequences,
    }
    if opts.change == "gpus":
        answer = fleet.set_gpus(
            opts.model, opts.gpus, profile=opts.profile or "", in_place=opts.in_place, **common
        )
        if not out.machine:
            print_gpus_change(answer.change)
            print_batches(answer.batches)
        return answer
    answer_c = fleet.set_context(opts.model, opts.tokens, slots=opts.slots, **common)
    if not out.machine:
        print_context_change(answer_c.change)
        print_batches(answer_c.batches)
    return answer_c


def model_change(opts: argparse.Namespace) -> int:
    """`model gpus` / `model context`: ask, print the change, follow the rollout."""
    out = printer(opts)
    with fleet_client(opts) as fleet:
        answer = _ask(opts, fleet, out)
        if answer.unchanged:
            line = f"{opts.model} is already as asked: nothing written, nothing to roll out"
        elif opts.dry_run:
            line = "dry run: nothing changed"
        elif answer.rollout_id:
            n = answer.change.restarted
            line = f"rollout {answer.rollout_id} started ({n} replica{'s' if n != 1 else ''})"
        else:
            line = "no replica needs starting again"
        _said(out, as_data(answer), line, f"model/{opts.model}")
        if opts.dry_run or not answer.rollout_id or opts.no_wait:
            return 0
        return ended(follow(fleet, answer.rollout_id, out, model=opts.model), out)


def _change_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dry-run", action="store_true", help="answer what would change; change nothing"
    )
    p.add_argument(
        "--no-wait", action="store_true", help="return once the rollout started, not when it ends"
    )
    p.add_argument(
        "--strategy",
        choices=sorted(STRATEGIES),
        help="how replicas are replaced: beside (the default), in-place, auto (beside "
        "where there is room), or canary (beside, judged by the gateway's traffic)",
    )
    p.add_argument(
        "--surge",
        type=int,
        default=0,
        help="replicas replaced at once (default 0: the fleet's, one at a time)",
    )
    p.add_argument("--supersede", action="store_true", help="cancel a rollout in progress first")
    add_canary_flags(p)
    p.add_argument(
        "--allow-unchecked",
        action="store_true",
        help="apply the plan even when the planner could not read the model (NOT_CHECKED)",
    )
    p.add_argument("--etag", help="the etag read; refused if the model changed since")
    p.add_argument(
        "--request-id", help="a retry-safe id: the same id again returns the first answer"
    )


def add_commands(groups: Any) -> None:
    """Add the `model` group and its commands to `ctl`'s groups."""
    model = groups.add_parser(
        "model",
        help="the catalog's models",
        description="The catalog's models: list, show, create, update, delete, their history, "
        "and the changes the planner sizes (gpus, context).",
        epilog=example("llmgw ctl model list"),
    )
    commands = model.add_subparsers(dest="ctl_cmd", metavar="COMMAND", required=True)
    add_ctl_command(
        commands,
        "list",
        "every model of the catalog",
        model_list,
        "llmgw ctl model list -o jsonpath='{.models[*].model.name}'",
    )
    show = add_ctl_command(
        commands,
        "show",
        "one model: profiles, revision, who and when, replicas",
        model_show,
        "llmgw ctl model show tiny-llama -o yaml",
    )
    show.add_argument("name", metavar="NAME", help="the model's name")
    create = add_ctl_command(
        commands,
        "create",
        "add a model from a YAML or JSON file",
        model_create,
        "llmgw ctl model create deploy/model.example.yaml",
    )
    create.add_argument(
        "file", metavar="FILE", help="a catalog model: name, source, context_length, profiles"
    )
    create.add_argument(
        "--request-id", help="a retry-safe id: the same id again returns the first answer"
    )
    update = add_ctl_command(
        commands,
        "update",
        "replace a model from a YAML or JSON file; changed replicas roll out",
        model_update,
        "llmgw ctl model update deploy/model.example.yaml --dry-run",
    )
    update.add_argument(
        "file", metavar="FILE", help="a catalog model: name, source, context_length, profiles"
    )
    _change_flags(update)
    delete = add_ctl_command(
        commands,
        "delete",
        "remove a model and stop its replicas",
        model_delete,
        "llmgw ctl model delete tiny-llama",
    )
    delete.add_argument("name", metavar="NAME", help="the model's name")
    delete.add_argument("--etag", help="refuse unless the model still has this etag")
    delete.add_argument(
        "--request-id", help="a retry-safe id: the same id again returns the first answer"
    )
    history = add_ctl_command(
        commands,
        "history",
        "every revision of a model: who and when",
        model_history,
        "llmgw ctl model history tiny-llama",
    )
    history.add_argument("name", metavar="NAME", help="the model's name")

    gpus = add_ctl_command(
        commands,
        "gpus",
        "cards each replica uses on each of its nodes",
        model_change,
        "llmgw ctl model gpus tiny-llama 2 --dry-run",
    )
    gpus.add_argument("model", metavar="MODEL", help="the model's name")
    gpus.add_argument(
        "gpus", metavar="N", type=int, help="cards a replica uses on each of its nodes"
    )
    gpus.add_argument("--profile", help="only this profile (default: every GPU profile)")
    gpus.add_argument(
        "--in-place", action="store_true", help="stop each replica before its new one starts"
    )
    _change_flags(gpus)
    sequences_flag(gpus)
    gpus.set_defaults(change="gpus")
    context = add_ctl_command(
        commands,
        "context",
        "tokens one request may use",
        model_change,
        "llmgw ctl model context tiny-llama 16384",
    )
    context.add_argument("model", metavar="MODEL", help="the model's name")
    context.add_argument("tokens", metavar="TOKENS", type=int, help="tokens one request may use")
    context.add_argument(
        "--slots", type=int, default=0, help="llama.cpp slots (default 0: keep them)"
    )
    _change_flags(context)
    sequences_flag(context)
    context.set_defaults(change="context")
