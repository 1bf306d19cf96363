"""`llmgw`: the operators' command line.

`llmgw plan describe|context|gpus` call a running planner (address from --planner or
$LLMGW_PLANNER). Human output by default, `--json` for scripts. Exit codes: 0 done,
2 refused by the planner (the reason is printed), 3 the planner could not be reached,
64 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import yaml
from google.protobuf import json_format
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from llmgw.common.v1 import common_pb2
from llmgw.planner.v1 import planner_pb2, planner_pb2_grpc

DEFAULT_PLANNER = "127.0.0.1:50051"
EXIT_REFUSED = 2
EXIT_UNREACHABLE = 3
EXIT_USAGE = 64
GIB = 1 << 30

_NODE = re.compile(
    r"^(?:(?P<count>\d+)x)?(?P<cls>[A-Za-z0-9._-]+?)(?::(?P<mem>\d+(?:\.\d+)?)GiB)?$"
)


class UsageError(Exception):
    """The command line cannot be turned into a request."""


def node_from_text(text: str, index: int) -> common_pb2.InventoryNode:
    """An inventory node from `8xH100-80GB` (or `8xH100-80GB:79.6GiB` with card memory)."""
    match = _NODE.match(text.strip())
    if not match:
        raise UsageError(f"--node {text!r}: write COUNTxCLASS, e.g. 8xH100-80GB[:79.6GiB]")
    count = int(match.group("count") or 1)
    mem = match.group("mem")
    return common_pb2.InventoryNode(
        name=f"node-{index}",
        gpu_class=match.group("cls"),
        gpus=count,
        free_gpus=count,
        gpu_memory_bytes=int(float(mem) * GIB) if mem else 0,
    )


def model_from_args(opts: argparse.Namespace) -> common_pb2.Model:
    """The model of a request: a YAML/JSON file in the catalog's shape, or a source with one
    profile made from the flags."""
    spec = opts.model
    path = Path(spec)
    if path.suffix in (".yaml", ".yml", ".json") and path.is_file():
        try:
            data = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"{spec}: cannot read it as YAML or JSON ({exc})") from exc
        if not isinstance(data, dict):
            raise UsageError(f"{spec}: a model file holds one mapping (name, source, profiles)")
        try:
            return json_format.ParseDict(data, common_pb2.Model())
        except json_format.ParseError as exc:
            raise UsageError(f"{spec}: {exc}") from exc
    profile = common_pb2.Profile(
        name=opts.profile or "default",
        engine=opts.engine,
        args=list(opts.arg or []),
        gpu_class="" if opts.cpu else opts.gpu_class,
        gpus_per_node=opts.cards if not opts.cpu else 0,
        cpu_only=opts.cpu,
    )
    name = opts.name or spec.rstrip("/").rsplit("/", 1)[-1]
    return common_pb2.Model(
        name=name,
        source=spec,
        context_length=opts.context or 0,
        profiles=[profile],
    )


def inventory_from_args(opts: argparse.Namespace) -> common_pb2.Inventory:
    """The inventory of a request, from --node flags or an --inventory file."""
    if opts.inventory:
        try:
            data = yaml.safe_load(Path(opts.inventory).read_text())
            return json_format.ParseDict(data, common_pb2.Inventory())
        except (OSError, yaml.YAMLError, json_format.ParseError) as exc:
            raise UsageError(f"--inventory {opts.inventory}: {exc}") from exc
    return common_pb2.Inventory(nodes=[node_from_text(t, i) for i, t in enumerate(opts.node or [])])


def refusal_text(err: grpc.aio.AioRpcError | grpc.RpcError) -> tuple[str, dict[str, Any]]:
    """A refusal for people, and as data for --json."""
    status = rpc_status.from_call(err)
    code = err.code().name if err.code() is not None else "UNKNOWN"
    info: dict[str, Any] = {"code": code, "message": err.details() or ""}
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                ei = error_details_pb2.ErrorInfo()
                detail.Unpack(ei)
                info["reason"] = ei.reason
                info["metadata"] = dict(ei.metadata)
    text = f"refused ({info.get('reason', code)}): {info['message']}"
    for key, value in sorted(info.get("metadata", {}).items()):
        text += f"\n  {key}: {value}"
    return text, info


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def print_change(change: common_pb2.ContextChange | common_pb2.GPUsChange) -> None:
    """A change for people: per profile, args before -> after and memory per card."""
    if isinstance(change, common_pb2.ContextChange):
        print(f"{change.model}: context {change.before} -> {change.after} tokens", end="")
        print(f" (max output {change.max_output}", end="")
        print(f", trained {change.trained})" if change.trained else ")")
    else:
        print(f"{change.model}: {change.gpus} cards a replica")
    for p in change.profiles:
        print(f"  profile {p.profile} ({p.engine})")
        if p.before or p.after:
            print(f"    memory: {p.before or '?'} -> {p.after or '?'}")
        if p.HasField("memory") and p.memory.cards:
            m = p.memory
            print(
                f"    per card: {_gib(m.per_card_bytes)} of {_gib(m.budget_bytes)} budget "
                f"(weights {_gib(m.weights_bytes)}, KV {_gib(m.kv_bytes)} a replica, "
                f"{m.cards} card{'s' if m.cards != 1 else ''})"
            )
        print(f"    args: {' '.join(p.args_before) or '(none)'}")
        print(f"       -> {' '.join(p.args) or '(none)'}")
    if change.note:
        print(f"  note: {change.note}")


def print_shape(shape: common_pb2.ModelShape, version: str) -> None:
    """A resolved shape for people."""
    kinds: dict[str, int] = {}
    for k in shape.layer_kinds:
        name = common_pb2.LayerKind.Name(k).removeprefix("LAYER_KIND_").lower()
        kinds[name] = kinds.get(name, 0) + 1
    rows = [
        ("architecture", shape.architecture),
        ("format", shape.format),
        ("layers", f"{shape.layers} ({', '.join(f'{v} {k}' for k, v in kinds.items())})"),
        ("attention heads", shape.attention_heads),
        ("KV heads", shape.kv_heads),
        ("head dims (K/V)", f"{shape.head_dim_k}/{shape.head_dim_v}"),
        ("sliding window", shape.sliding_window or "-"),
        ("trained context", shape.trained_context or "unknown"),
        ("weights", f"{shape.weights_bytes} B ({_gib(shape.weights_bytes)})"),
        ("KV per token", f"{shape.kv_bytes_per_token} B"),
        ("KV fixed (windows)", f"{shape.kv_bytes_fixed} B"),
        ("state per sequence", f"{shape.state_bytes_per_sequence} B"),
        ("llama.cpp modelled", version),
    ]
    for key, value in rows:
        print(f"{key:>20}: {value}")
    for note in shape.notes:
        print(f"{'note':>20}: {note}")


def run_plan(opts: argparse.Namespace) -> int:
    """Send one planner request and print its answer or refusal."""
    address = opts.planner
    with grpc.insecure_channel(address) as channel:
        stub = planner_pb2_grpc.PlannerServiceStub(channel)
        try:
            if opts.plan_cmd == "describe":
                d = stub.DescribeModel(
                    planner_pb2.DescribeModelRequest(source=opts.source), timeout=opts.timeout
                )
                if opts.json:
                    print(json_format.MessageToJson(d))
                else:
                    print_shape(d.shape, d.llamacpp_version)
                return 0
            model = model_from_args(opts)
            inventory = inventory_from_args(opts)
            if opts.plan_cmd == "context":
                c = stub.SizeContext(
                    planner_pb2.SizeContextRequest(
                        model=model, tokens=opts.tokens, slots=opts.slots, inventory=inventory
                    ),
                    timeout=opts.timeout,
                )
                change: common_pb2.ContextChange | common_pb2.GPUsChange = c.change
                answer: Any = c
            else:
                g = stub.PlanGPUs(
                    planner_pb2.PlanGPUsRequest(
                        model=model, gpus=opts.gpus, profile=opts.profile or "", inventory=inventory
                    ),
                    timeout=opts.timeout,
                )
                change, answer = g.change, g
        except grpc.RpcError as err:
            code = err.code()
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                print(
                    f"llmgw: the planner at {address} did not answer ({code.name})", file=sys.stderr
                )
                return EXIT_UNREACHABLE
            text, info = refusal_text(err)
            if opts.json:
                print(json.dumps({"error": info}, indent=2))
            else:
                print(text, file=sys.stderr)
            return EXIT_REFUSED
    if opts.json:
        print(json_format.MessageToJson(answer))
    else:
        print_change(change)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line's grammar."""
    parser = argparse.ArgumentParser(prog="llmgw", description="llmgw's control plane")
    sub = parser.add_subparsers(dest="cmd", required=True)
    plan = sub.add_parser("plan", help="ask the planner (nothing changes)")
    plan.add_argument(
        "--planner",
        default=os.environ.get("LLMGW_PLANNER", DEFAULT_PLANNER),
        help="planner address HOST:PORT (env LLMGW_PLANNER; default %(default)s)",
    )
    plan.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for an answer")
    plan.add_argument("--json", action="store_true", help="print the answer as JSON")
    psub = plan.add_subparsers(dest="plan_cmd", required=True)
    describe = psub.add_parser("describe", help="a model's resolved shape")
    describe.add_argument("source", help="GGUF URL or path, or hf://ORG/NAME[@REVISION]")

    def model_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "model",
            help="a model file (YAML/JSON, the catalog's shape) or a source (GGUF URL/path, hf://)",
        )
        p.add_argument("--name", help="the model's name (default: from the source)")
        p.add_argument("--engine", default="vllm", help="engine of the one profile (with a source)")
        p.add_argument("--gpu-class", default="H100-80GB", help="card class of the profile")
        p.add_argument("--cards", type=int, default=1, help="cards a replica uses now")
        p.add_argument("--cpu", action="store_true", help="the profile runs on CPUs")
        p.add_argument("--arg", action="append", help="an engine argument (repeat)")
        p.add_argument("--context", type=int, help="the context served now, in tokens")
        p.add_argument("--node", action="append", help="inventory node COUNTxCLASS[:MEMGiB]")
        p.add_argument("--inventory", help="inventory file (YAML/JSON: {nodes: [...]})")

    context = psub.add_parser("context", help="size a new context")
    model_flags(context)
    context.add_argument("tokens", type=int, help="tokens one request may use")
    context.add_argument("--slots", type=int, default=0, help="llama.cpp slots (0 keeps)")
    context.add_argument("--profile", help="name of the profile made from the flags")
    gpus = psub.add_parser("gpus", help="plan N cards a replica")
    model_flags(gpus)
    gpus.add_argument("gpus", type=int, help="cards of one node each replica uses")
    gpus.add_argument("--profile", help="only this profile (default: every GPU profile)")
    # `llmgw ctl ...` and `llmgw up` live in their own modules; each sets `run`.
    from llmgw.cli import ctl, up

    ctl.add_parser(sub)
    up.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `llmgw` command."""
    parser = build_parser()
    opts = parser.parse_args(argv)
    run = getattr(opts, "run", None)
    if run is not None:
        return int(run(opts))
    try:
        if opts.cmd == "plan":
            return run_plan(opts)
    except UsageError as exc:
        print(f"llmgw: {exc}", file=sys.stderr)
        return EXIT_USAGE
    parser.print_help()
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
