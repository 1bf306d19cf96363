"""Admission: which replicas the agent refuses to run, and why (pure rules; the file system is
asked only through the `realpath` its caller gives).

The fleet sends an engine name, profile arguments, a source and cards, never a command line.
This module holds the line between the two: an engine the agent's config does not name is
refused, and so are arguments that would make an allowed engine run something else. Arguments
pass an allow-list per engine (llmgw.engines.<engine>.ALLOWED: the flags that size and tune
it); flags that load code or other models or reach the node's files (REFUSED, GATED, with why)
pass only where the agent's config allows them, and shell syntax never (defence in depth: no
shell is ever used, but an argument that carries one is an attack or a mistake either way).
The source is checked again as the fleet checks it, and a local path must be under the roots
the agent's config names.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from fleet_svc.standin import options as standin_options
from llmgw.engines import registry, sglang, trtllm, vllm
from llmgw.engines.args import fold, split_flag
from llmgw.engines.grammar import ADDRESS_FLAGS, AllowedFlag, RefusedFlag, switch
from llmgw.engines.llamacpp import engine as llamacpp_engine
from llmgw.engines.revision import revision_conflict, source_revision
from llmgw.sources import (
    PathSource,
    SourceRefused,
    check_path_under,
    parse_source,
    path_is_under,
)

# More than this many arguments, or one longer than this, is not a profile but a payload.
MAX_ARGS = 256
MAX_ARG_CHARS = 4096

# Characters a shell would read as syntax: command separators, pipes, substitution,
# redirection, and line breaks (a second command line). NUL cannot be passed to exec at all.
SHELL_CHARS = frozenset(";|&$`<>\n\r\0")


class RejectReason(enum.Enum):
    """Why the agent refuses a replica: a `llmgw.rejection.Rejection`'s `reason` is one
    of these values (the Ack's `Rejection.reason` on the wire)."""

    ENGINE_NOT_ALLOWED = "ENGINE_NOT_ALLOWED"
    """The engine is not named in the agent's config."""
    ARGS_REFUSED = "ARGS_REFUSED"
    """An argument carries shell syntax, a flag the engine's allow-list lacks or one that
    loads code or other models, or a word that is no flag's value."""
    SOURCE_REFUSED = "SOURCE_REFUSED"
    """The model source is not of an accepted form, or a path outside the allowed roots."""
    GPUS_UNKNOWN = "GPUS_UNKNOWN"
    """A card index the node does not have, or the same card twice."""
    GPUS_BUSY = "GPUS_BUSY"
    """A card another replica of the same desired set uses."""
    DUPLICATE_REPLICA = "DUPLICATE_REPLICA"
    """The desired set names the same replica id twice; the first is run."""


# Each engine's flags come from its module (llmgw.engines.<engine>): ALLOWED, the flags that
# size and tune it, passed; REFUSED and GATED, the flags that load code or other models or
# reach the node's files, refused unless the agent config's `allow_flags` names them; any other
# flag is refused with its name. The address flags are never passed (the agent sets them).
# Flags are read with the engine's grammar: its aliases, `--flag=value`, `_` for `-`, and the
# prefixes an argparse engine takes for a flag.

STANDIN_FLAGS: tuple[AllowedFlag, ...] = (
    AllowedFlag(("--load-s",)),
    switch("--fail-on-start"),
    switch("--serve-no-model"),
    AllowedFlag(("--fail-after-s",)),
    AllowedFlag(("--memory-bytes",)),
    AllowedFlag(("--kv-capacity-tokens",)),
    AllowedFlag(standin_options.TP_FLAGS),
    AllowedFlag(standin_options.CONTEXT_FLAGS),
)
"""The stand-in engine's own knobs (fleet_svc/standin/options.py), passed to it whichever
engine it stands in for; `--host`, `--port`, `--model` and `--engine` its template sets."""

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

ALLOW_TABLES: dict[str, tuple[AllowedFlag, ...]] = {
    "vllm": vllm.ALLOWED,
    "sglang": sglang.ALLOWED,
    "trtllm": trtllm.ALLOWED,
    "llamacpp": llamacpp_engine.ALLOWED,
    "standin": STANDIN_FLAGS,
}
"""The flags each engine family is passed."""

GATED_TABLES: dict[str, tuple[RefusedFlag, ...]] = {
    "vllm": vllm.GATED,
    "sglang": sglang.GATED,
    "trtllm": trtllm.GATED,
    "llamacpp": llamacpp_engine.GATED,
    "standin": (),
}
"""Flags of each family that load code or other models, beside its refusal table."""


def allow_list(family: str) -> tuple[AllowedFlag, ...]:
    """The flags an engine family is passed: its module's ALLOWED for the built-in engines;
    for another registered engine its `allowed_flags`, else the flags it declares it reads
    (`context_flag`, `tp_flag`, `pp_flag`, ...: the ones the planner writes), each taking a
    value."""
    if family in ALLOW_TABLES:
        return ALLOW_TABLES[family]
    engine = registry.find(family)
    if engine is None:
        return ()
    declared = getattr(engine, "allowed_flags", None)
    if declared is not None:
        return tuple(declared)
    flags = []
    for attr in sorted(dir(engine)):
        value = getattr(engine, attr, None) if attr.endswith("_flag") else None
        if isinstance(value, tuple) and value and all(isinstance(n, str) for n in value):
            flags.append(AllowedFlag(value))
    return tuple(flags)


# A negative number is a value (`-ngl -1`), not a flag.
_NUMBER = re.compile(r"^-\d+(\.\d+)?$")


@dataclass(frozen=True)
class ArgRules:
    """The argument rules of one configured engine: its family's allow-list and refusals,
    loosened by `allow` (flags the operator trusts on this node: a refusal lifted, or a flag
    added to the allow-list), tightened by `refuse` (more flags, with why). `extra`: flags of
    the program itself passed on top of the family's (the stand-in's knobs)."""

    family: str
    allow: frozenset[str] = frozenset()
    refuse: Mapping[str, str] = field(default_factory=dict)
    extra: tuple[AllowedFlag, ...] = ()
    needs_source: bool = False
    """The engine's template passes the source (`{source}` or `{source_args}`)."""
    pins_revision: bool = True
    """A revision an hf:// source pins reaches the engine's command line (by its family's
    revision flag, `{revision}` in its source_args, or the whole `{source}`), or the engine is
    given no source at all; False: such a replica is refused."""


@dataclass(frozen=True)
class SourceRules:
    """Where local sources may be: the agent config's `source_roots` (real paths), and how a
    path's real location is found (os.path.realpath, given by the caller). No roots: no
    local path is run."""

    roots: tuple[str, ...] = ()
    realpath: Callable[[str], str] = str


def _norm(flag: str) -> str:
    """A long flag compared as the engines that fold spellings read it (`_` as `-`), and in
    lower case, for every engine: refusing a spelling an engine would reject anyway costs
    nothing. Short flags are compared exactly."""
    return fold(flag.lower()) if flag.startswith("--") else flag


def _looks_like_path(value: str) -> bool:
    return "/" in value or "\\" in value or value.startswith("~") or value.startswith(".")


@dataclass(frozen=True)
class _Refusal:
    why: str
    only_paths: bool
    liftable: bool


def _tables(
    rules: ArgRules,
) -> tuple[dict[str, _Refusal], dict[str, bool]]:
    """(refused flag -> why, allowed flag -> takes a value) for one engine's rules."""
    family = rules.family
    engine = registry.find(family)
    table = REFUSAL_TABLES.get(family, STANDIN_REFUSED)
    if engine is not None and engine.refused_flags is not None:
        table = engine.refused_flags
    refused: dict[str, _Refusal] = {}
    for entry in (*table, *GATED_TABLES.get(family, ())):
        never = entry is ADDRESS_FLAGS
        for name in entry.names:
            refused[_norm(name)] = _Refusal(entry.why, entry.only_paths, not never)
    for name in ADDRESS_FLAGS.names:
        refused[_norm(name)] = _Refusal(ADDRESS_FLAGS.why, False, False)
    allowed: dict[str, bool] = {}
    for flag in (*allow_list(family), *rules.extra):
        for name in flag.names:
            allowed[_norm(name)] = flag.value
    for name in rules.allow:
        key = _norm(name)
        hit = refused.get(key)
        if hit is not None and hit.liftable:
            del refused[key]
        allowed.setdefault(key, True)
    for name, why in rules.refuse.items():
        refused[_norm(name)] = _Refusal(why, False, False)
    return refused, allowed


def refused_arg(args: Sequence[str], rules: ArgRules) -> str | None:
    """Why these engine arguments are refused, or None when they may run.

    Every argument is a flag on the engine's allow-list, or the value of the flag before it;
    nothing else passes (a stray word could be read as a second model by an engine that
    takes one positionally: the agent places the source itself).

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
    family = rules.family
    engine = registry.find(family)
    refused, allowed = _tables(rules)
    abbreviating = engine is not None and engine.grammar.abbreviates
    wants_value = False
    for i, arg in enumerate(args):
        if wants_value and (not arg.startswith("-") or _NUMBER.match(arg)):
            wants_value = False
            continue
        wants_value = False
        if not arg.startswith("-") or arg == "-":
            return (
                f"argument {arg[:60]!r} is not the value of a flag before it: profiles carry "
                "flags and their values only (the agent places the model source itself)"
            )
        name, inline = split_flag(arg)
        key = _norm(name)
        full = key
        hit = refused.get(key)
        if hit is None and key not in allowed and abbreviating and key.startswith("--"):
            prefixed = sorted(k for k in refused if k.startswith(key) and len(key) > 3)
            if prefixed:
                full = prefixed[0]
                hit = refused[full]
        if hit is not None:
            value = inline if inline is not None else (args[i + 1] if i + 1 < len(args) else "")
            if not (hit.only_paths and not _looks_like_path(value)):
                shown = name if full == name else f"{name} (read as {full})"
                how = (
                    f"; allow it in this agent's config (allow_flags of the {family} engine) "
                    "only for models and code you trust"
                    if hit.liftable and "allow_flags" not in hit.why
                    else ""
                )
                return f"flag {shown} is refused: {hit.why}{how}"
        if key in allowed:
            wants_value = allowed[key] and inline is None
            continue
        return (
            f"flag {name} is not on the {family} allow-list (the flags that size and tune "
            f"it: llmgw.engines); add it to this agent's allow_flags if it is safe here"
        )
    return None


def check_source(source: str, rules: SourceRules, *, needs_source: bool) -> str | None:
    """Why a replica's source is refused here, or None: the fleet's grammar again
    (llmgw.sources: a URL, `hf://ORG/NAME[@REV]`, an absolute path, never anything starting
    with `-`), and, for an engine that is given it, a local path only when its real location
    (symlinks followed) is under one of `rules.roots`. An engine whose template passes no
    source runs with none."""
    if not source:
        return "the replica has no source, and this engine is given one" if needs_source else None
    try:
        parsed = parse_source(source, allow_paths=True)
        if isinstance(parsed, PathSource) and needs_source:
            check_path_under(parsed.path, rules.roots)
            if not path_is_under(rules.realpath(parsed.path), rules.roots):
                # Said without the real location: where a link leads is not the fleet's to learn.
                return (
                    f"source {source[:200]!r} is refused: its real location (symlinks followed) "
                    "is outside the folders allowed"
                )
    except SourceRefused as exc:
        return exc.message
    return None


def check_pin(
    source: str, args: Sequence[str], rules: ArgRules, engine: str
) -> tuple[RejectReason, str] | None:
    """Why a replica's pinned revision would not be what its engine loads, or None: the
    arguments pin another revision than the source (ARGS_REFUSED; the fleet refuses that
    already, checked again here), or the source pins one and this engine cannot be given it
    (SOURCE_REFUSED)."""
    why = revision_conflict(rules.family, args, source)
    if why:
        return RejectReason.ARGS_REFUSED, why
    revision = source_revision(source)
    if revision and not rules.pins_revision:
        return RejectReason.SOURCE_REFUSED, (
            f"source {source[:200]!r} pins revision {revision}, and engine {engine} "
            f"({rules.family}) has no way here to be given a revision: it would load the "
            "repo's default branch, not what the planner sized"
            + (
                "; give a GGUF resolve URL at that commit "
                "(https://huggingface.co/ORG/NAME/resolve/COMMIT/FILE.gguf) instead"
                if rules.family == "llamacpp"
                else "; add {revision} to its source_args in this agent's config"
            )
        )
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
