"""`llmgw ctl apply -f FILE|DIR` and `llmgw ctl diff -f FILE|DIR`: a folder of model files as
the catalog's desired state, kubectl's way.

Each file holds one model or several YAML documents (`---`), each a catalog model as `ctl
model create` reads it (llmgw.cli.inputs); a folder's `*.yaml`, `*.yml` and `*.json` files are
read in name order (not its sub-folders). Per model, `apply` says what it did:

- `created`: not in the catalog, added (CreateModel);
- `configured`: in the catalog and different, replaced through the rollout path
  (UpdateModel, at the etag read, so a change made meanwhile is refused, not overwritten);
  the rollout it started is named and not waited for (`llmgw ctl rollout watch ID`);
- `unchanged`: the fleet says it already is as asked.

`--dry-run` changes nothing and prints, per model, what would change field by field; `ctl diff`
prints the same and exits 1 when anything would change (as `kubectl diff`). The fields compared
are the fleet's own answer: for a model in the catalog, UpdateModel's dry run returns it as it
would be written. `--prune` also deletes the catalog's models the files no longer name, among
those the selector picks (`--selector name=GLOB`, or `--all`); models declared in the cluster
settings are never pruned (they are the settings file's).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llmgw.cli.common import (
    EXIT_ERROR,
    EXIT_REFUSED,
    UsageError,
    add_canary_flags,
    add_ctl_command,
    canary_of,
    fleet_client,
    refusal_text,
)
from llmgw.cli.inputs import model_of_data
from llmgw.cli.output import printer, say
from llmgw.clients import FleetClient, Refused
from llmgw.clients.convert import CatalogModel, Model, as_data
from llmgw.clients.fleet import STRATEGIES

SUFFIXES = (".yaml", ".yml", ".json")
MAX_FILES = 1000
"""The most files one apply reads."""
MAX_FILE_BYTES = 1 << 20
"""The largest model file read."""
STDIN = "-"
"""`-f -`: the models are read from stdin."""


@dataclass(frozen=True)
class Desired:
    """One model the files name, and where."""

    model: Model
    where: str


def _files(path: Path) -> list[Path]:
    if str(path) == STDIN:
        return [path]
    if path.is_dir():
        found = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())
        if not found:
            raise UsageError(f"-f {path}: no {', '.join(SUFFIXES)} file in the folder")
        return found
    if not path.is_file():
        raise UsageError(f"-f {path}: no such file or folder")
    return [path]


def _read(path: Path) -> str:
    """A file's text, or stdin's for `-`, at most MAX_FILE_BYTES."""
    if str(path) == STDIN:
        text = sys.stdin.read(MAX_FILE_BYTES + 1)
    else:
        if path.stat().st_size > MAX_FILE_BYTES:
            text = "x" * (MAX_FILE_BYTES + 1)
        else:
            text = path.read_text()
    if len(text) > MAX_FILE_BYTES:
        raise UsageError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
    return text


def _documents(path: Path) -> Iterator[tuple[Any, str]]:
    try:
        docs = list(yaml.safe_load_all(_read(path)))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"{path}: cannot read it as YAML or JSON ({exc})") from exc
    docs = [d for d in docs if d is not None]
    for i, doc in enumerate(docs):
        yield doc, f"{path}" + (f" (document {i + 1})" if len(docs) > 1 else "")


def read_desired(paths: list[str]) -> list[Desired]:
    """The models the files or folders name, each once.

    Raises:
        UsageError: a file cannot be read, is not models, or two name the same model.
    """
    files = [f for p in paths for f in _files(Path(p))]
    if len(files) > MAX_FILES:
        raise UsageError(f"-f: {len(files)} files; at most {MAX_FILES}")
    found: dict[str, Desired] = {}
    for file in files:
        for doc, where in _documents(file):
            model = model_of_data(doc, where)
            if model.name in found:
                raise UsageError(
                    f"{where}: model {model.name!r} is also in {found[model.name].where}"
                )
            found[model.name] = Desired(model, where)
    if not found:
        raise UsageError(f"-f {' '.join(paths)}: no model in the files")
    return list(found.values())


def flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested data as `a.b[0].c` -> leaf value."""
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        if not data and prefix:
            out[prefix] = {}
        for key, value in data.items():
            out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
    elif isinstance(data, list):
        if not data and prefix:
            out[prefix] = []
        for i, value in enumerate(data):
            out.update(flat(value, f"{prefix}[{i}]"))
    else:
        out[prefix] = data
    return out


def field_changes(before: Model | None, after: Model) -> list[tuple[str, Any, Any]]:
    """(field path, before, after) for each field that differs; `before` None: a new model,
    every field of `after` (at its default too) added."""
    old = flat(as_data(before)) if before is not None else {}
    new = flat(as_data(after))
    missing = object()
    changes = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, missing), new.get(key, missing)
        if a != b:
            changes.append((key, None if a is missing else a, None if b is missing else b))
    return changes


def _value(v: Any) -> str:
    return json.dumps(v) if v is not None else "(none)"


def diff_lines(name: str, changes: list[tuple[str, Any, Any]]) -> list[str]:
    """A model's changes for people: `~ field: before -> after`, `+`/`-` for a field only
    one side has."""
    lines = []
    for key, a, b in changes:
        if a is None:
            lines.append(f"  + {key}: {_value(b)}")
        elif b is None:
            lines.append(f"  - {key}: {_value(a)}")
        else:
            lines.append(f"  ~ {key}: {_value(a)} -> {_value(b)}")
    return [f"model/{name}:", *lines] if lines else []


@dataclass
class Outcome:
    """What applying one model did (or would do)."""

    name: str
    action: str
    """created, configured, unchanged, pruned, or refused (by the fleet: `error` says why)."""
    changes: list[tuple[str, Any, Any]]
    rollout_id: str = ""
    restarted: int = 0
    error: dict[str, Any] | None = None
    """The fleet's refusal (code, message, reason, metadata) when action is "refused"."""

    def data(self) -> dict[str, Any]:
        """As data for -o json|yaml."""
        return {
            "name": self.name,
            "action": self.action,
            "changes": [{"field": k, "before": a, "after": b} for k, a, b in self.changes],
            "rollout_id": self.rollout_id,
            "restarted": self.restarted,
            "error": self.error,
        }


def _one(
    fleet: FleetClient, opts: argparse.Namespace, d: Desired, current: CatalogModel | None
) -> Outcome:
    name = d.model.name
    if current is None:
        changes = field_changes(None, d.model)
        if not opts.dry_run:
            fleet.create_model(d.model)
        return Outcome(name, "created", changes)
    change = {
        "strategy": opts.strategy or "",
        "supersede": opts.supersede,
        "surge": opts.surge,
        "canary": canary_of(opts),
    }
    preview = fleet.update_model(d.model, etag=current.etag, dry_run=True, **change)
    if preview.unchanged:
        return Outcome(name, "unchanged", [])
    changes = field_changes(current.model, preview.model.model)
    if opts.dry_run:
        return Outcome(name, "configured", changes, restarted=preview.restarted)
    done = fleet.update_model(d.model, etag=current.etag, **change)
    action = "unchanged" if done.unchanged else "configured"
    return Outcome(name, action, changes, done.rollout_id, done.restarted)


def _pruned(
    opts: argparse.Namespace, catalog: dict[str, CatalogModel], named: set[str]
) -> list[str]:
    if not opts.prune:
        return []
    if opts.all:
        return sorted(n for n, cm in catalog.items() if n not in named and not cm.declared)
    pattern = opts.selector.partition("=")[2]
    return sorted(
        n
        for n, cm in catalog.items()
        if n not in named and not cm.declared and fnmatch.fnmatchcase(n, pattern)
    )


def _check_prune_flags(opts: argparse.Namespace) -> None:
    if not opts.prune:
        if opts.selector or opts.all:
            raise UsageError("--selector and --all choose what --prune deletes: add --prune")
        return
    if bool(opts.selector) == bool(opts.all):
        raise UsageError("--prune needs --selector name=GLOB or --all (not both)")
    if opts.selector:
        key, sep, pattern = opts.selector.partition("=")
        if key != "name" or not sep or not pattern:
            raise UsageError(
                f"--selector {opts.selector!r}: write name=GLOB (models have no labels; "
                "their names are what selects)"
            )


def reconcile(opts: argparse.Namespace) -> tuple[list[Outcome], int]:
    """Apply (or, with --dry-run, preview) the files; the outcomes and the exit code."""
    _check_prune_flags(opts)
    desired = read_desired(opts.filename)
    outcomes: list[Outcome] = []
    with fleet_client(opts) as fleet:
        catalog = {cm.model.name: cm for cm in fleet.list_models().models}
        for d in desired:
            try:
                outcomes.append(_one(fleet, opts, d, catalog.get(d.model.name)))
            except Refused as exc:  # the others are still applied, as kubectl's apply does
                outcomes.append(Outcome(d.model.name, "refused", [], error=refusal_text(exc)[1]))
        for name in _pruned(opts, catalog, {d.model.name for d in desired}):
            changes = field_changes(None, catalog[name].model)
            changes = [(k, b, None) for k, _a, b in changes]
            try:
                if not opts.dry_run:
                    fleet.delete_model(name, etag=catalog[name].etag)
                outcomes.append(Outcome(name, "pruned", changes))
            except Refused as exc:
                outcomes.append(Outcome(name, "refused", [], error=refusal_text(exc)[1]))
    refused = any(o.action == "refused" for o in outcomes)
    return outcomes, EXIT_REFUSED if refused else 0


def apply(opts: argparse.Namespace) -> int:
    """`ctl apply -f FILE|DIR`: create or update each model; prune what the files dropped."""
    outcomes, code = reconcile(opts)
    suffix = " (dry run)" if opts.dry_run else ""

    def human() -> None:
        for o in outcomes:
            extra = ""
            if o.rollout_id:
                n = o.restarted
                extra = f"; rollout {o.rollout_id} ({n} replica{'s' if n != 1 else ''})"
            if o.error is not None:
                why = o.error.get("reason", o.error["code"])
                say(f"model/{o.name} refused ({why}): {o.error['message']}")
                continue
            say(f"model/{o.name} {o.action}{suffix}{extra}")
            if opts.dry_run:
                for line in diff_lines(o.name, o.changes)[1:]:
                    say(line)

    printer(opts).show(
        {"dry_run": opts.dry_run, "models": [o.data() for o in outcomes]},
        human,
        [f"model/{o.name}" for o in outcomes],
    )
    return code


def diff(opts: argparse.Namespace) -> int:
    """`ctl diff -f FILE|DIR`: what apply would change, field by field; exit 1 if anything."""
    opts.dry_run = True
    outcomes, code = reconcile(opts)
    changed = [o for o in outcomes if o.action != "unchanged"]

    def human() -> None:
        for o in changed:
            if o.error is not None:
                why = o.error.get("reason", o.error["code"])
                say(f"model/{o.name} refused ({why}): {o.error['message']}")
                continue
            say(f"model/{o.name} ({'would be ' + o.action})")
            for line in diff_lines(o.name, o.changes)[1:]:
                say(line)

    printer(opts).show(
        {"models": [o.data() for o in changed]}, human, [f"model/{o.name}" for o in changed]
    )
    return code or (EXIT_ERROR if changed else 0)


def _file_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="FILE|DIR",
        help="a model file (YAML documents or JSON) or a folder of them (repeat)",
    )
    p.add_argument(
        "--prune",
        action="store_true",
        help="also delete the catalog's models the files do not name (with --selector or --all)",
    )
    p.add_argument(
        "--selector",
        "-l",
        default="",
        metavar="name=GLOB",
        help="with --prune: only models whose name matches GLOB may be deleted",
    )
    p.add_argument(
        "--all", action="store_true", help="with --prune: any model not declared in settings"
    )


def add_commands(groups: Any) -> None:
    """Add `apply` and `diff` to `ctl`'s groups."""
    ap = add_ctl_command(
        groups,
        "apply",
        "make the catalog's models as a file or folder says (created, configured, unchanged)",
        apply,
        "llmgw ctl apply -f models/ --prune --selector 'name=team-a-*' --dry-run",
    )
    _file_flags(ap)
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="change nothing; print what would change, field by field",
    )
    ap.add_argument(
        "--strategy",
        choices=sorted(STRATEGIES),
        help="how changed replicas are replaced: beside (the default), in-place, auto (beside "
        "where there is room), or canary (beside, judged by the gateway's traffic)",
    )
    ap.add_argument(
        "--surge",
        type=int,
        default=0,
        help="replicas replaced at once (default 0: the fleet's, one at a time)",
    )
    ap.add_argument(
        "--supersede", action="store_true", help="cancel a rollout in progress of a changed model"
    )
    add_canary_flags(ap)
    df = add_ctl_command(
        groups,
        "diff",
        "what `apply -f` would change, field by field (exit 1 when anything would)",
        diff,
        "llmgw ctl diff -f models/",
    )
    _file_flags(df)
    df.set_defaults(strategy="", supersede=False, surge=0)
