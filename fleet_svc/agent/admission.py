"""Admission: which replicas the agent refuses to run, and why (pure rules, no I/O).

The fleet sends an engine name, profile arguments and cards, never a command line. This module
holds the line between the two: an engine the agent's config does not name is refused, and so
are arguments that would make an allowed engine run something else — shell syntax (defence in
depth: no shell is ever used, but an argument that carries one is an attack or a mistake
either way) and the engine flags, listed with why in each engine's module (llmgw.engines), that
load code or files named by the caller or expose the node.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from llmgw.engines import registry
from llmgw.engines.args import fold, split_flag
from llmgw.engines.grammar import ADDRESS_FLAGS, RefusedFlag

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


# The flags each engine is refused are its module's (llmgw.engines.<engine>.REFUSED), read
# with its grammar (llmgw.engines.grammar): the aliases it lists, `--flag=value`, and the
# prefixes an argparse engine takes for the flag.

# The stand-in engine runs nothing; only the address is the agent's.
STANDIN_REFUSED: tuple[RefusedFlag, ...] = (ADDRESS_FLAGS,)


def _refusal_tables() -> dict[str, tuple[RefusedFlag, ...]]:
    """The refusal table of every registered engine the agent may run, and the stand-in's."""
    tables: dict[str, tuple[RefusedFlag, ...]] = {}
    for name in registry.names():
        refused = registry.get(name).refused_flags
        if refused is not None:
            tables[name] = refused
    tables["standin"] = STANDIN_REFUSED
    return tables


REFUSAL_TABLES: dict[str, tuple[RefusedFlag, ...]] = _refusal_tables()
"""Refused flags by engine family (the names an agent config's `family` may take)."""


@dataclass(frozen=True)
class ArgRules:
    """The argument rules of one configured engine: its family's refusal table, loosened by
    `allow` (flags the operator trusts) and tightened by `refuse` (more flags, with why)."""

    family: str
    allow: frozenset[str] = frozenset()
    refuse: Mapping[str, str] = field(default_factory=dict)


def _norm(flag: str) -> str:
    """A long flag compared as the engines that fold spellings read it (`_` as `-`), and in
    lower case, for every engine: refusing a spelling an engine would reject anyway costs
    nothing. Short flags are compared exactly."""
    return fold(flag.lower()) if flag.startswith("--") else flag


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
    engine = registry.find(rules.family)
    table = REFUSAL_TABLES.get(rules.family, STANDIN_REFUSED)
    if engine is not None and engine.refused_flags is not None:
        table = engine.refused_flags
    refused: dict[str, tuple[str, bool]] = {}
    for entry in table:
        for name in entry.names:
            refused[_norm(name)] = (entry.why, entry.only_paths)
    for name, why in rules.refuse.items():
        refused[_norm(name)] = (why, False)
    allowed = {_norm(a) for a in rules.allow}
    for key in allowed:
        refused.pop(key, None)
    abbreviating = engine is not None and engine.grammar.abbreviates
    for i, arg in enumerate(args):
        if not arg.startswith("-"):
            continue
        name, inline = split_flag(arg)
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
