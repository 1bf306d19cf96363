"""Admission: which replicas the agent refuses to run, and why (pure rules, no I/O).

The fleet sends an engine name, profile arguments and cards, never a command line. This module
holds the line between the two: an engine the agent's config does not name is refused, and so
are arguments that would make an allowed engine run something else — shell syntax (defence in
depth: no shell is ever used, but an argument that carries one is an attack or a mistake
either way) and the engine flags, listed below with why, that load code or files named by the
caller or expose the node.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

# More than this many arguments, or one longer than this, is not a profile but a payload.
MAX_ARGS = 256
MAX_ARG_CHARS = 4096

# Characters a shell would read as syntax: command separators, pipes, substitution,
# redirection, and line breaks (a second command line). NUL cannot be passed to exec at all.
SHELL_CHARS = frozenset(";|&$`<>\n\r\0")


class RejectReason(enum.Enum):
    """Why the agent refuses a replica (the Ack's `Rejection.reason`)."""

    ENGINE_NOT_ALLOWED = "ENGINE_NOT_ALLOWED"
    """The engine is not named in the agent's config."""
    ARGS_REFUSED = "ARGS_REFUSED"
    """An argument carries shell syntax or a flag the refusal table forbids."""
    GPUS_UNKNOWN = "GPUS_UNKNOWN"
    """A card index the node does not have, or the same card twice."""
    GPUS_BUSY = "GPUS_BUSY"
    """A card another replica of the same desired set uses."""
    DUPLICATE_REPLICA = "DUPLICATE_REPLICA"
    """The desired set names the same replica id twice; the first is run."""


@dataclass(frozen=True)
class Rejection:
    """One refused replica, with a message a person can act on."""

    replica_id: str
    revision: int
    reason: RejectReason
    message: str


@dataclass(frozen=True)
class RefusedFlag:
    """A flag an engine must not be given, and why.

    `only_paths`: refused only when its value names a file (contains a path separator), the
    flag being harmless with an inline value.
    """

    names: tuple[str, ...]
    why: str
    only_paths: bool = False


# Flags every engine is refused: the agent chooses the address an engine listens on (it health
# checks it there and reports it to the fleet); a profile that moves it makes the replica
# unreachable, or binds it to every interface.
_ADDRESS = RefusedFlag(
    ("--host", "--port", "--uds"),
    "the agent chooses the address the engine listens on",
)

# vLLM (`vllm serve --help`, vllm/engine/arg_utils.py, vllm/entrypoints/openai/cli_args.py).
# Its FlexibleArgumentParser reads `--a_b` as `--a-b`, so names are matched with "_" as "-".
VLLM_REFUSED: tuple[RefusedFlag, ...] = (
    _ADDRESS,
    RefusedFlag(
        ("--worker-cls", "--worker-extension-cls"),
        "it makes vLLM import and run a Python class the caller names",
    ),
    RefusedFlag(
        ("--trust-remote-code",),
        "it runs Python code shipped with the model repo; allow it in the agent config "
        "(allow_flags) for models you trust",
    ),
    RefusedFlag(
        (
            "--logits-processors",
            "--middleware",
            "--tool-parser-plugin",
            "--reasoning-parser-plugin",
        ),
        "it makes vLLM import Python code from a module or file the caller names",
    ),
    RefusedFlag(
        ("--config",),
        "it reads more arguments from a file, past this refusal table",
    ),
    RefusedFlag(
        ("--allowed-local-media-path",),
        "it lets API callers read files of the node",
    ),
    RefusedFlag(
        ("--chat-template",),
        "a chat template is read from a path the caller names; give the template inline or "
        "ship it with the model",
        only_paths=True,
    ),
)

# SGLang (`python -m sglang.launch_server --help`, sglang/srt/server_args.py).
SGLANG_REFUSED: tuple[RefusedFlag, ...] = (
    _ADDRESS,
    RefusedFlag(
        ("--trust-remote-code",),
        "it runs Python code shipped with the model repo; allow it in the agent config "
        "(allow_flags) for models you trust",
    ),
    RefusedFlag(
        ("--enable-custom-logit-processor",),
        "it lets API callers send serialized Python to run inside the engine",
    ),
    RefusedFlag(
        ("--config",),
        "it reads more arguments from a file, past this refusal table",
    ),
    RefusedFlag(
        ("--chat-template",),
        "a chat template is read from a path the caller names; ship it with the model",
        only_paths=True,
    ),
)

# TensorRT-LLM (`trtllm-serve --help`, tensorrt_llm/commands/serve.py).
TRTLLM_REFUSED: tuple[RefusedFlag, ...] = (
    _ADDRESS,
    RefusedFlag(
        ("--trust-remote-code",),
        "it runs Python code shipped with the model repo; allow it in the agent config "
        "(allow_flags) for models you trust",
    ),
    RefusedFlag(
        ("--extra-llm-api-options", "--config"),
        "it reads engine options from a YAML file the caller names, past this refusal table",
    ),
)

# llama.cpp's llama-server (`llama-server --help`, common/arg.cpp). It parses flags exactly
# (no abbreviations), so the table needs the exact spellings and their short forms.
LLAMACPP_REFUSED: tuple[RefusedFlag, ...] = (
    _ADDRESS,
    RefusedFlag(
        ("--rpc",),
        "it sends the model's tensors to, and runs layers on, servers the caller names",
    ),
    RefusedFlag(
        ("--path",),
        "it serves a folder of the node over HTTP",
    ),
    RefusedFlag(
        ("--slot-save-path", "--log-file"),
        "it makes the engine write files where the caller says",
    ),
    RefusedFlag(
        ("--chat-template-file",),
        "it reads a file the caller names; give the template inline (--chat-template)",
    ),
    RefusedFlag(
        ("-m", "--model", "-mu", "--model-url", "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file"),
        "the agent passes the model from the replica's source",
    ),
)

# The stand-in engine runs nothing; only the address is the agent's.
STANDIN_REFUSED: tuple[RefusedFlag, ...] = (_ADDRESS,)

REFUSAL_TABLES: dict[str, tuple[RefusedFlag, ...]] = {
    "vllm": VLLM_REFUSED,
    "sglang": SGLANG_REFUSED,
    "trtllm": TRTLLM_REFUSED,
    "llamacpp": LLAMACPP_REFUSED,
    "standin": STANDIN_REFUSED,
}

# Engines whose parser (Python argparse) accepts an unambiguous prefix of a long flag as the
# flag itself: `--worker-ext` would be `--worker-extension-cls`.
ABBREVIATING = frozenset({"vllm", "sglang"})


@dataclass(frozen=True)
class ArgRules:
    """The argument rules of one configured engine: its family's refusal table, loosened by
    `allow` (flags the operator trusts) and tightened by `refuse` (more flags, with why)."""

    family: str
    allow: frozenset[str] = frozenset()
    refuse: Mapping[str, str] = field(default_factory=dict)


def _norm(flag: str) -> str:
    # vLLM and TensorRT-LLM accept either spelling; comparing dashed lower-case catches both.
    return flag.lower().replace("_", "-") if flag.startswith("--") else flag


def _flag_of(arg: str) -> tuple[str, str | None]:
    """The flag an argument names and its inline value (`--a=b` -> ("--a", "b"))."""
    if arg.startswith("-") and "=" in arg:
        name, value = arg.split("=", 1)
        return name, value
    return arg, None


def _looks_like_path(value: str) -> bool:
    return "/" in value or "\\" in value or value.startswith("~") or value.startswith(".")


def refused_arg(args: Sequence[str], rules: ArgRules) -> str | None:
    """Why these engine arguments are refused, or None when they may run.

    Args:
        args: the profile's arguments as the fleet sent them.
        rules: the configured engine's rules.
    Returns:
        One sentence naming the offending argument and why; None for acceptable arguments.
    """
    if len(args) > MAX_ARGS:
        return f"{len(args)} arguments is more than the {MAX_ARGS} an engine profile may have"
    for arg in args:
        if len(arg) > MAX_ARG_CHARS:
            return f"an argument of {len(arg)} characters is longer than {MAX_ARG_CHARS}"
        bad = sorted(set(arg) & SHELL_CHARS)
        if bad or "$(" in arg:
            shown = ", ".join(repr(c) for c in bad)
            return f"argument {arg[:60]!r} holds shell syntax ({shown}); engines run with no shell"
    table = REFUSAL_TABLES.get(rules.family, STANDIN_REFUSED)
    refused: dict[str, tuple[str, bool]] = {}
    for entry in table:
        for name in entry.names:
            refused[_norm(name)] = (entry.why, entry.only_paths)
    for name, why in rules.refuse.items():
        refused[_norm(name)] = (why, False)
    allowed = {_norm(a) for a in rules.allow}
    for key in allowed:
        refused.pop(key, None)
    abbreviating = rules.family in ABBREVIATING
    for i, arg in enumerate(args):
        if not arg.startswith("-"):
            continue
        name, inline = _flag_of(arg)
        key = _norm(name)
        hit = refused.get(key)
        full = key
        if hit is None and abbreviating and key.startswith("--") and len(key) > 3:
            prefixed = [k for k in refused if k.startswith(key) and k != key]
            if prefixed:
                full = prefixed[0]
                hit = refused[full]
        if hit is None:
            continue
        why, only_paths = hit
        if only_paths:
            value = inline if inline is not None else (args[i + 1] if i + 1 < len(args) else "")
            if not _looks_like_path(value):
                continue
        shown = name if full == name else f"{name} (read as {full})"
        return f"flag {shown} is refused: {why}"
    return None


def check_gpus(
    gpus: Sequence[int], node_cards: Iterable[int], taken: Mapping[int, str]
) -> tuple[RejectReason, str] | None:
    """Whether a replica may have these cards: the node has each, none twice, none taken by
    another replica of the same desired set (`taken`: card index -> replica id).

    Returns:
        (reason, message) when refused, None when the cards are fine.
    """
    have = set(node_cards)
    unknown = sorted(g for g in gpus if g not in have)
    if unknown:
        listed = ", ".join(str(g) for g in sorted(have)) or "none"
        return (
            RejectReason.GPUS_UNKNOWN,
            f"cards {unknown} are not on this node (it has: {listed})",
        )
    if len(set(gpus)) != len(gpus):
        return RejectReason.GPUS_UNKNOWN, f"cards {list(gpus)} name a card twice"
    busy = sorted(g for g in gpus if g in taken)
    if busy:
        owner = taken[busy[0]]
        return RejectReason.GPUS_BUSY, f"cards {busy} are given to replica {owner} as well"
    return None
