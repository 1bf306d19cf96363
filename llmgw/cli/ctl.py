"""`llmgw ctl`: operate a running fleet (its catalog, nodes and replicas).

Every command calls the fleet at `--fleet HOST:PORT` (or $LLMGW_FLEET) and names its caller
in the `x-llmgw-caller` metadata (`--as NAME`, else $USER) for the catalog's audit trail.
Human tables by default, `--json` for scripts. Exit codes: 0 done, 2 refused by the fleet (the
reason and its metadata are printed), 3 the fleet could not be reached, 64 bad usage.
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import grpc
import yaml
from google.protobuf import json_format
from google.protobuf.message import Message

from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc

DEFAULT_FLEET = "127.0.0.1:50052"
CALLER_KEY = "x-llmgw-caller"
"""Metadata naming who makes a call (the fleet records it on every revision)."""
EXIT_REFUSED = 2
EXIT_UNREACHABLE = 3
EXIT_USAGE = 64
GIB = 1 << 30
_UNREACHABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class UsageError(Exception):
    """The command line cannot be turned into a request."""


class UsageParser(argparse.ArgumentParser):
    """An argument parser whose errors exit with 64 (EX_USAGE), not argparse's 2, which
    `llmgw` keeps for refusals."""

    def error(self, message: str) -> NoReturn:
        """Print the usage and the error; exit 64."""
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


class Ctl:
    """One `llmgw ctl` invocation: the fleet's stub, the caller's metadata and the output."""

    def __init__(self, opts: argparse.Namespace, stub: fleet_pb2_grpc.FleetServiceStub) -> None:
        self.opts = opts
        self.stub = stub
        self.metadata = ((CALLER_KEY, caller_name(opts.as_name)),)
        self.timeout_s: float = opts.timeout

    def emit(self, message: Message, human: Callable[[], None]) -> int:
        """Print `message` as JSON with --json, else call `human`; exit code 0."""
        if self.opts.json:
            print(json_format.MessageToJson(message, preserving_proto_field_name=True))
        else:
            human()
        return 0


def caller_name(told: str | None) -> str:
    """Who runs the command: `--as`, else $USER, else the login name."""
    if told:
        return told
    user = os.environ.get("USER") or os.environ.get("LOGNAME")
    if user:
        return user
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return "unknown"


# -- formatting ------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Rows in left-aligned columns under upper-case headers; the last column is not padded."""
    cells = [[str(h).upper() for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [c.ljust(w) for c, w in zip(row[:-1], widths[:-1], strict=True)]
        lines.append("  ".join([*parts, row[-1]]).rstrip())
    return "\n".join(lines)


def phase_name(value: int, enum: Any, prefix: str) -> str:
    """An enum value's name without its prefix: REPLICA_PHASE_READY -> READY."""
    return str(enum.Name(value)).removeprefix(prefix)


def age(ts: Any, now_s: float | None = None) -> str:
    """How long ago a protobuf Timestamp was, for people: 42s, 3m, 5h, 2d; '-' when unset."""
    seconds = ts.seconds + ts.nanos / 1e9
    if seconds <= 0:
        return "-"
    delta = max(0.0, (time.time() if now_s is None else now_s) - seconds)
    if delta < 120:
        return f"{delta:.0f}s"
    if delta < 7200:
        return f"{delta / 60:.0f}m"
    if delta < 172800:
        return f"{delta / 3600:.0f}h"
    return f"{delta / 86400:.0f}d"


def when(ts: Any) -> str:
    """A protobuf Timestamp as local ISO time to the second; '-' when unset."""
    seconds = ts.seconds + ts.nanos / 1e9
    if seconds <= 0:
        return "-"
    return dt.datetime.fromtimestamp(seconds).astimezone().isoformat(timespec="seconds")


def gib(n: int) -> str:
    """Bytes as GiB with one decimal."""
    return f"{n / GIB:.1f}"


def profiles_summary(model: common_pb2.Model) -> str:
    """Each profile as name=engine×replicas."""
    return ", ".join(f"{p.name}={p.engine}×{p.replicas}" for p in model.profiles) or "-"


def cards_of(p: common_pb2.Profile) -> str:
    """A profile's cards for people: `2×H100-80GB (tp 2)` or `CPU, 16 GB RAM`."""
    if p.cpu_only or not p.gpu_class:
        return f"CPU, {p.min_memory_gb} GB RAM" if p.min_memory_gb else "CPU"
    count = max(p.gpus_per_node, p.tp, 1)
    extra = [f"tp {p.tp}"] if p.tp else []
    extra += [f"pp {p.pp}"] if p.pp else []
    extra += [f"{p.nodes} nodes"] if p.nodes > 1 else []
    return f"{count}×{p.gpu_class}" + (f" ({', '.join(extra)})" if extra else "")


def replica_rows(replicas: Sequence[fleet_pb2.Replica]) -> list[list[object]]:
    """Replica table rows: id, model, profile, node, cards, phase, address, restarts, age,
    reason."""
    return [
        [
            r.id,
            r.model,
            r.profile,
            r.node or "-",
            ",".join(str(g) for g in r.gpus) or "-",
            phase_name(r.phase, fleet_pb2.ReplicaPhase, "REPLICA_PHASE_"),
            r.address or "-",
            r.restarts,
            age(r.since),
            r.reason or "",
        ]
        for r in replicas
    ]


REPLICA_HEADERS = (
    "id",
    "model",
    "profile",
    "node",
    "cards",
    "phase",
    "address",
    "restarts",
    "age",
    "reason",
)


# -- reading a model file -------------------------------------------------------------------


def read_model_file(path: str) -> common_pb2.Model:
    """A catalog model from a YAML or JSON file (the shape of `llmgw.common.v1.Model`: name,
    source, context_length, profiles[] {name, engine, args, gpu_class, gpus_per_node,
    replicas, ...}).

    Raises:
        UsageError: the file cannot be read or is not one model.
    """
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"{path}: cannot read it as YAML or JSON ({exc})") from exc
    if isinstance(data, dict) and set(data) == {"model"} and isinstance(data["model"], dict):
        data = data["model"]
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a model file holds one mapping (name, source, profiles)")
    try:
        return json_format.ParseDict(data, common_pb2.Model())
    except json_format.ParseError as exc:
        raise UsageError(f"{path}: {exc}") from exc


# -- commands --------------------------------------------------------------------------------


def model_list(c: Ctl) -> int:
    """`model list`: the catalog."""
    answer = c.stub.ListModels(
        fleet_pb2.ListModelsRequest(), timeout=c.timeout_s, metadata=c.metadata
    )

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

    return c.emit(answer, human)


def model_show(c: Ctl) -> int:
    """`model show NAME`: everything about one model, and its replicas."""
    got = c.stub.GetModel(
        fleet_pb2.GetModelRequest(name=c.opts.name), timeout=c.timeout_s, metadata=c.metadata
    )
    reps = c.stub.ListReplicas(
        fleet_pb2.ListReplicasRequest(model=c.opts.name), timeout=c.timeout_s, metadata=c.metadata
    )
    if c.opts.json:
        out = {
            "model": json_format.MessageToDict(got.model, preserving_proto_field_name=True),
            "replicas": [
                json_format.MessageToDict(r, preserving_proto_field_name=True)
                for r in reps.replicas
            ],
        }
        print(json.dumps(out, indent=2))
        return 0
    cm, m = got.model, got.model.model
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
        print(f"    args: {' '.join(p.args) or '(none)'}")
    print("replicas:")
    if reps.replicas:
        for line in table(REPLICA_HEADERS, replica_rows(reps.replicas)).splitlines():
            print(f"  {line}")
    else:
        print("  none")
    return 0


def model_create(c: Ctl) -> int:
    """`model create FILE`: add a model to the catalog."""
    model = read_model_file(c.opts.file)
    answer = c.stub.CreateModel(
        fleet_pb2.CreateModelRequest(model=model, request_id=c.opts.request_id or new_id()),
        timeout=c.timeout_s,
        metadata=c.metadata,
    )
    return c.emit(
        answer,
        lambda: print(
            f"created model {answer.model.model.name} (revision {answer.model.revision}); "
            f"watch its replicas with `llmgw ctl replica list --model {answer.model.model.name}`"
        ),
    )


def model_delete(c: Ctl) -> int:
    """`model delete NAME`: remove a model; its replicas are drained and stopped."""
    answer = c.stub.DeleteModel(
        fleet_pb2.DeleteModelRequest(
            name=c.opts.name, etag=c.opts.etag or "", request_id=c.opts.request_id or new_id()
        ),
        timeout=c.timeout_s,
        metadata=c.metadata,
    )
    return c.emit(
        answer,
        lambda: print(
            f"deleted model {c.opts.name} (revision {answer.model.revision}); "
            "its replicas are drained and stopped"
        ),
    )


def model_history(c: Ctl) -> int:
    """`model history NAME`: every revision, who made it and when."""
    answer = c.stub.ListModelRevisions(
        fleet_pb2.ListModelRevisionsRequest(name=c.opts.name),
        timeout=c.timeout_s,
        metadata=c.metadata,
    )

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

    return c.emit(answer, human)


def node_list(c: Ctl) -> int:
    """`node list`: the nodes whose agents connected, their cards and phase."""
    answer = c.stub.ListNodes(
        fleet_pb2.ListNodesRequest(), timeout=c.timeout_s, metadata=c.metadata
    )

    def human() -> None:
        if not answer.nodes:
            print("no nodes: start an agent (`python -m fleet_svc.agent --fleet HOST:PORT ...`)")
            return
        rows = []
        for n in answer.nodes:
            used = sum(card.memory_used_bytes for card in n.cards)
            total = sum(card.memory_total_bytes for card in n.cards)
            rows.append(
                [
                    n.name,
                    phase_name(n.phase, fleet_pb2.NodePhase, "NODE_PHASE_"),
                    n.gpu_class or "CPU",
                    f"{n.free_gpus}/{len(n.cards)}",
                    f"{gib(used)}/{gib(total)} GiB" if n.cards else "-",
                    age(n.last_heartbeat),
                    n.reason or "",
                ]
            )
        print(
            table(
                ("name", "phase", "class", "cards free", "card memory", "heartbeat", "reason"),
                rows,
            )
        )

    return c.emit(answer, human)


def replica_list(c: Ctl) -> int:
    """`replica list [--model M]`: the replicas, their phase and why."""
    answer = c.stub.ListReplicas(
        fleet_pb2.ListReplicasRequest(model=c.opts.model or ""),
        timeout=c.timeout_s,
        metadata=c.metadata,
    )

    def human() -> None:
        if not answer.replicas:
            print("no replicas" + (f" of {c.opts.model}" if c.opts.model else ""))
            return
        print(table(REPLICA_HEADERS, replica_rows(answer.replicas)))

    return c.emit(answer, human)


def replica_watch(c: Ctl) -> int:
    """`replica watch [--model M]`: follow the ready endpoints, one line per event, until
    interrupted."""
    stream = c.stub.WatchReplicas(
        fleet_pb2.WatchReplicasRequest(model=c.opts.model or ""), metadata=c.metadata
    )
    kind = fleet_pb2.WatchReplicasResponse.Kind
    try:
        for event in stream:
            if c.opts.json:
                print(
                    json.dumps(
                        json_format.MessageToDict(event, preserving_proto_field_name=True),
                        separators=(",", ":"),
                    ),
                    flush=True,
                )
                continue
            if event.kind == fleet_pb2.WatchReplicasResponse.KIND_SYNCED:
                print("SYNCED   every ready endpoint above; changes follow", flush=True)
                continue
            e = event.endpoint
            print(
                f"{kind.Name(event.kind).removeprefix('KIND_'):<8} {e.model}/{e.profile} "
                f"{e.replica_id} {e.address} node={e.node} revision={e.revision}",
                flush=True,
            )
    except KeyboardInterrupt:
        stream.cancel()
        return 0
    return 0


def new_id() -> str:
    """A fresh request id: the fleet answers a retry of it with the first answer."""
    return uuid.uuid4().hex


# -- grammar and dispatch ------------------------------------------------------------------


def common_flags() -> argparse.ArgumentParser:
    """The flags every `ctl` command also takes after its name (`llmgw ctl model list --json`);
    SUPPRESS keeps the value given before the command when they are not repeated after it."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--fleet", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("--as", dest="as_name", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("--timeout", type=float, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the answer as JSON"
    )
    return common


_COMMON = common_flags()


def add_command(group: Any, name: str, what: str, fn: Callable[[Ctl], int]) -> Any:
    """Add a command to a `ctl` group (the subparsers of `model`, `node`, `replica`, ...):
    `fn(ctl)` runs it and returns the exit code; gRPC errors become exit codes 2/3."""
    leaf = group.add_parser(name, help=what, description=what, parents=[_COMMON])
    leaf.set_defaults(ctl_run=fn)
    return leaf


@dataclass
class CtlGroups:
    """`ctl`'s parser and its groups' subparsers, for commands defined elsewhere to join."""

    ctl: argparse.ArgumentParser
    groups: Any
    model: Any
    node: Any
    replica: Any


def add_parser(sub: Any) -> CtlGroups:
    """Add `ctl` and its commands to the `llmgw` parser's subcommands."""
    ctl = sub.add_parser(
        "ctl",
        help="operate a running fleet: models, nodes, replicas",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ctl.add_argument(
        "--fleet",
        default=os.environ.get("LLMGW_FLEET", DEFAULT_FLEET),
        help="fleet address HOST:PORT (env LLMGW_FLEET; default %(default)s)",
    )
    ctl.add_argument(
        "--as",
        dest="as_name",
        metavar="NAME",
        help="who you are, for the audit trail (default $USER)",
    )
    ctl.add_argument("--timeout", type=float, default=15.0, help="seconds to wait for an answer")
    ctl.add_argument("--json", action="store_true", help="print the answer as JSON")
    ctl.set_defaults(run=run)
    # Bad usage exits 64 (argparse's own code, 2, means "refused" here).
    setattr(ctl, "error", UsageParser.error.__get__(ctl))  # noqa: B010
    groups = ctl.add_subparsers(
        dest="ctl_group", metavar="GROUP", required=True, parser_class=UsageParser
    )

    model = groups.add_parser("model", help="the catalog's models")
    msub = model.add_subparsers(dest="ctl_cmd", metavar="COMMAND", required=True)
    add_command(msub, "list", "every model of the catalog", model_list)
    show = add_command(
        msub, "show", "one model: profiles, revision, who and when, replicas", model_show
    )
    show.add_argument("name")
    create = add_command(msub, "create", "add a model from a YAML or JSON file", model_create)
    create.add_argument("file", help="a catalog model: name, source, context_length, profiles")
    create.add_argument("--request-id", help="retrying with the same id returns the first answer")
    delete = add_command(msub, "delete", "remove a model and stop its replicas", model_delete)
    delete.add_argument("name")
    delete.add_argument("--etag", help="refuse unless the model is still at this revision")
    delete.add_argument("--request-id", help="retrying with the same id returns the first answer")
    history = add_command(msub, "history", "every revision of a model: who and when", model_history)
    history.add_argument("name")

    node = groups.add_parser("node", help="the nodes and their cards")
    nsub = node.add_subparsers(dest="ctl_cmd", metavar="COMMAND", required=True)
    add_command(nsub, "list", "every node: phase, cards, memory, heartbeat", node_list)

    replica = groups.add_parser("replica", help="the replicas")
    rsub = replica.add_subparsers(dest="ctl_cmd", metavar="COMMAND", required=True)
    rlist = add_command(rsub, "list", "replicas, their phase and why", replica_list)
    rlist.add_argument("--model", help="only this model's")
    watch = add_command(rsub, "watch", "follow ready endpoints (the gateway's view)", replica_watch)
    watch.add_argument("--model", help="only this model's")

    # Applying plans (`model gpus|context`, `rollout ...`) lives in its own module; its
    # commands set `func(opts)` rather than `ctl_run`.
    from llmgw.cli import apply

    apply.add_change_commands(msub, _COMMON)
    apply.add_rollout_commands(groups, _COMMON)
    return CtlGroups(ctl=ctl, groups=groups, model=msub, node=nsub, replica=rsub)


@contextmanager
def fleet_stub(address: str) -> Iterator[fleet_pb2_grpc.FleetServiceStub]:
    """A stub of the fleet at `address`, its channel closed after."""
    with grpc.insecure_channel(address) as channel:
        yield fleet_pb2_grpc.FleetServiceStub(channel)


def run(opts: argparse.Namespace) -> int:
    """Run one `llmgw ctl` command; its exit code."""
    from llmgw.cli.main import refusal_text

    # The caller's name for modules that read `opts.caller` (llmgw.cli.apply).
    opts.caller = caller_name(opts.as_name)
    if getattr(opts, "ctl_run", None) is None:
        return int(opts.func(opts))
    try:
        with fleet_stub(opts.fleet) as stub:
            return int(opts.ctl_run(Ctl(opts, stub)))
    except UsageError as exc:
        print(f"llmgw: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except grpc.RpcError as err:
        code = err.code()
        if code in _UNREACHABLE:
            print(
                f"llmgw: the fleet at {opts.fleet} did not answer ({code.name}): start it "
                "(`llmgw up`) or point --fleet / LLMGW_FLEET at it",
                file=sys.stderr,
            )
            return EXIT_UNREACHABLE
        text, info = refusal_text(err)
        if opts.json:
            print(json.dumps({"error": info}, indent=2))
        else:
            print(text, file=sys.stderr)
        return EXIT_REFUSED
