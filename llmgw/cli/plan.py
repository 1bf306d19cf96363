"""`llmgw plan describe|context|gpus`: ask a running planner; nothing changes.

The planner's address comes from --planner or $LLMGW_PLANNER; the credentials from
--tls-ca/--tls-cert/--tls-key (or LLMGW_TLS_*) or --token (or LLMGW_TOKEN), else, beside a
default `llmgw up`, from its DATA/tls (llmgw.cli.common). Human output by default, `-o
json|yaml|wide|name|jsonpath=...` (or `--json`) for scripts. Exit codes: llmgw.cmdline (6: the
planner answered but could not read the model's shape, verdict NOT_CHECKED).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from llmgw.cli.common import (
    DEFAULT_PLANNER,
    EXIT_NOT_CHECKED,
    add_client_flags,
    add_env_argument,
    add_output_flags,
    count,
    example,
    planner_client,
    sequences_flag,
)
from llmgw.cli.inputs import inventory_from_args, model_from_args
from llmgw.cli.output import (
    print_batches,
    print_context_change,
    print_gpus_change,
    print_shape,
    printer,
)
from llmgw.clients.convert import as_data, enum_name


def describe(opts: argparse.Namespace) -> int:
    """`plan describe SOURCE`: a model's resolved shape."""
    with planner_client(opts) as planner:
        answer = planner.describe_model(opts.source)
    printer(opts).show(
        as_data(answer),
        lambda: print_shape(answer.shape, answer.llamacpp_version),
        [f"shape/{opts.source}"],
    )
    return 0


def context(opts: argparse.Namespace) -> int:
    """`plan context MODEL TOKENS`: the change a new context would make."""
    model, inventory = model_from_args(opts), inventory_from_args(opts)
    with planner_client(opts) as planner:
        answer = planner.size_context(
            model, opts.tokens, slots=opts.slots, sequences=opts.sequences, inventory=inventory
        )
    printer(opts).show(
        as_data(answer),
        lambda: _human(print_context_change, answer),
        [f"model/{model.name}"],
    )
    return _checked(answer.change)


def gpus(opts: argparse.Namespace) -> int:
    """`plan gpus MODEL N`: the change N cards a replica would make."""
    model, inventory = model_from_args(opts), inventory_from_args(opts)
    with planner_client(opts) as planner:
        answer = planner.plan_gpus(
            model,
            opts.gpus,
            profile=opts.profile or "",
            sequences=opts.sequences,
            inventory=inventory,
        )
    printer(opts).show(
        as_data(answer),
        lambda: _human(print_gpus_change, answer),
        [f"model/{model.name}"],
    )
    return _checked(answer.change)


def _human(change_printer: Callable[[Any], None], answer: Any) -> None:
    """An answer for people: its change, then any batch it was asked to size."""
    change_printer(answer.change)
    print_batches(answer.batches)


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
        metavar="MODEL",
        help="a model file (YAML/JSON, the catalog's shape) or a source (GGUF URL/path, hf://)",
    )
    p.add_argument("--name", help="the model's name (default: from the source)")
    p.add_argument(
        "--engine", default="vllm", help="the engine of the one profile made from a source"
    )
    p.add_argument("--gpu-class", default="H100-80GB", help="the card class of that profile")
    p.add_argument("--cards", type=int, default=1, help="cards a replica uses now")
    p.add_argument("--cpu", action="store_true", help="the profile runs on CPUs, not cards")
    p.add_argument("--arg", action="append", help="an engine argument of the profile (repeat)")
    p.add_argument(
        "--context", type=int, help="the context served now, in tokens (default: the engine's)"
    )
    p.add_argument(
        "--node",
        action="append",
        help="an inventory node COUNTxCLASS[:MEMGiB], e.g. 8xH100-80GB (repeat)",
    )
    p.add_argument("--inventory", help="an inventory file (YAML/JSON: {nodes: [...]})")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `plan` and its commands to the `llmgw` parser's subcommands."""
    plan: argparse.ArgumentParser = sub.add_parser(
        "plan",
        help="ask the planner (nothing changes)",
        description="Ask a running planner what a model is and what a change would make; "
        "nothing changes.",
        epilog=example("llmgw plan describe hf://llmgw-demo/tiny-llama"),
    )
    add_env_argument(
        plan,
        "--planner",
        env="LLMGW_PLANNER",
        default=DEFAULT_PLANNER,
        help="the planner's address HOST:PORT",
    )
    plan.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for an answer")
    add_output_flags(plan)
    add_client_flags(plan)
    psub = plan.add_subparsers(dest="plan_cmd", metavar="COMMAND", required=True)
    cmd = psub.add_parser(
        "describe",
        help="a model's resolved shape",
        description="A model's resolved shape: layers, heads, weights, KV bytes per token.",
        epilog=example("llmgw plan describe hf://llmgw-demo/tiny-llama -o yaml"),
    )
    cmd.add_argument(
        "source", metavar="SOURCE", help="a GGUF URL or path, or hf://ORG/NAME[@REVISION]"
    )
    add_output_flags(cmd, hidden=True)
    cmd.set_defaults(run=describe)
    cmd = psub.add_parser(
        "context",
        help="size a new context",
        description="What serving a new context would change: memory per card and the "
        "engine's arguments, per profile.",
        epilog=example(
            "llmgw plan context hf://llmgw-demo/tiny-llama 16384 --engine vllm --node 8xH100-80GB"
        ),
    )
    _model_flags(cmd)
    cmd.add_argument("tokens", metavar="TOKENS", type=int, help="tokens one request may use")
    cmd.add_argument(
        "--slots", type=count, default=0, help="llama.cpp slots (default 0: keep them)"
    )
    sequences_flag(cmd)
    cmd.add_argument("--profile", help="the name of the profile made from the flags")
    add_output_flags(cmd, hidden=True)
    cmd.set_defaults(run=context)
    cmd = psub.add_parser(
        "gpus",
        help="plan N cards a replica",
        description="What N cards a replica would change: tensor parallelism, memory per "
        "card and the engine's arguments, per profile.",
        epilog=example("llmgw plan gpus hf://llmgw-demo/tiny-llama 2 --node 8xH100-80GB"),
    )
    _model_flags(cmd)
    cmd.add_argument(
        "gpus", metavar="N", type=int, help="cards each replica uses on each of its nodes"
    )
    cmd.add_argument("--profile", help="only this profile (default: every GPU profile)")
    sequences_flag(cmd)
    add_output_flags(cmd, hidden=True)
    cmd.set_defaults(run=gpus)
    return plan
