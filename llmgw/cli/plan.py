"""`llmgw plan describe|context|gpus`: ask a running planner; nothing changes.

The planner's address comes from --planner or $LLMGW_PLANNER; the credentials from
--tls-ca/--tls-cert/--tls-key (or LLMGW_TLS_*) or --token (or LLMGW_TOKEN), else, beside a
default `llmgw up`, from its DATA/tls (llmgw.cli.common). Human output by default,
`--json` for scripts. Exit codes: 0 done, 2 refused by the planner (the reason is printed),
3 the planner could not be reached, 6 answered but not checked (the model's shape could not be
read: verdict NOT_CHECKED, the reason printed), 64 bad usage.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from llmgw.cli.common import DEFAULT_PLANNER, EXIT_NOT_CHECKED, add_client_flags, planner_client
from llmgw.cli.inputs import inventory_from_args, model_from_args
from llmgw.cli.output import print_context_change, print_gpus_change, print_shape
from llmgw.clients.convert import as_json, enum_name


def describe(opts: argparse.Namespace) -> int:
    """`plan describe SOURCE`: a model's resolved shape."""
    with planner_client(opts) as planner:
        answer = planner.describe_model(opts.source)
    if opts.json:
        print(as_json(answer))
    else:
        print_shape(answer.shape, answer.llamacpp_version)
    return 0


def context(opts: argparse.Namespace) -> int:
    """`plan context MODEL TOKENS`: the change a new context would make."""
    model, inventory = model_from_args(opts), inventory_from_args(opts)
    with planner_client(opts) as planner:
        answer = planner.size_context(model, opts.tokens, slots=opts.slots, inventory=inventory)
    if opts.json:
        print(as_json(answer))
    else:
        print_context_change(answer.change)
    return _checked(answer.change)


def gpus(opts: argparse.Namespace) -> int:
    """`plan gpus MODEL N`: the change N cards a replica would make."""
    model, inventory = model_from_args(opts), inventory_from_args(opts)
    with planner_client(opts) as planner:
        answer = planner.plan_gpus(
            model, opts.gpus, profile=opts.profile or "", inventory=inventory
        )
    if opts.json:
        print(as_json(answer))
    else:
        print_gpus_change(answer.change)
    return _checked(answer.change)


def _checked(change: Any) -> int:
    """0 for a checked plan; EXIT_NOT_CHECKED, saying why on stderr, for one whose verdict is
    NOT_CHECKED (a script must not take it for an answer)."""
    if enum_name(change, "verdict") != "FIT_VERDICT_NOT_CHECKED":
        return 0
    print(f"not checked: {change.verdict_note or 'the model could not be read'}", file=sys.stderr)
    return EXIT_NOT_CHECKED


def _model_flags(p: argparse.ArgumentParser) -> None:
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


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `plan` and its commands to the `llmgw` parser's subcommands."""
    plan: argparse.ArgumentParser = sub.add_parser("plan", help="ask the planner (nothing changes)")
    plan.add_argument(
        "--planner",
        default=os.environ.get("LLMGW_PLANNER", DEFAULT_PLANNER),
        help="planner address HOST:PORT (env LLMGW_PLANNER; default %(default)s)",
    )
    plan.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for an answer")
    plan.add_argument("--json", action="store_true", help="print the answer as JSON")
    add_client_flags(plan)
    psub = plan.add_subparsers(dest="plan_cmd", required=True)
    cmd = psub.add_parser("describe", help="a model's resolved shape")
    cmd.add_argument("source", help="GGUF URL or path, or hf://ORG/NAME[@REVISION]")
    cmd.set_defaults(run=describe)
    cmd = psub.add_parser("context", help="size a new context")
    _model_flags(cmd)
    cmd.add_argument("tokens", type=int, help="tokens one request may use")
    cmd.add_argument("--slots", type=int, default=0, help="llama.cpp slots (0 keeps)")
    cmd.add_argument("--profile", help="name of the profile made from the flags")
    cmd.set_defaults(run=context)
    cmd = psub.add_parser("gpus", help="plan N cards a replica")
    _model_flags(cmd)
    cmd.add_argument("gpus", type=int, help="cards each replica uses on each of its nodes")
    cmd.add_argument("--profile", help="only this profile (default: every GPU profile)")
    cmd.set_defaults(run=gpus)
    return plan
