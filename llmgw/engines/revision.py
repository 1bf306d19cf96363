"""The Hugging Face revision an engine loads: the flag each engine takes it by, and the check
that a profile's arguments never pin another revision than the model's source."""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.engines import registry
from llmgw.engines.args import fold, split_flag
from llmgw.engines.grammar import Flag
from llmgw.sources import HubSource, SourceRefused, parse_source

MIN_ABBREVIATION = 5
"""The shortest prefix of `--revision` an abbreviating (argparse) engine is taken to read as
it (`--rev`, `--revi`, ...): shorter ones are ambiguous in every engine's parser."""


def revision_flag(engine: str) -> Flag:
    """The flag `engine` takes a revision by (vLLM, SGLang and trtllm-serve: `--revision`);
    () for an engine without one (llama.cpp's -hf takes none) or an unknown engine."""
    found = registry.find(engine)
    flag = getattr(found, "revision_flag", ()) if found is not None else ()
    return tuple(flag) if isinstance(flag, tuple) else ()


def source_revision(source: str) -> str:
    """The revision an `hf://ORG/NAME@REV` source pins ("" for none, another kind of source, or
    a source that does not parse: its own check refuses that)."""
    try:
        parsed = parse_source(source, allow_paths=True)
    except SourceRefused:
        return ""
    return (parsed.revision or "") if isinstance(parsed, HubSource) else ""


def args_revision(engine: str, args: Sequence[str]) -> tuple[str, str] | None:
    """(the flag as written, its value) of the last revision flag in `args`, read as the
    engine reads it (`--flag=value`, `_` for `-`, an abbreviation argparse would take); None
    when the arguments pin none."""
    names = revision_flag(engine)
    found = registry.find(engine)
    if not names or found is None:
        return None
    grammar = found.grammar
    wanted = {grammar.normalise(n) for n in names}
    hit: tuple[str, str] | None = None
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        flag, inline = split_flag(arg)
        key = grammar.normalise(flag)
        prefix = (
            grammar.abbreviates
            and len(key) >= MIN_ABBREVIATION
            and any(fold(n).startswith(fold(key)) for n in wanted)
        )
        if key in wanted or prefix:
            value = inline if inline is not None else (args[i + 1] if i + 1 < len(args) else "")
            hit = (flag, value)
    return hit


def revision_conflict(engine: str, args: Sequence[str], source: str) -> str:
    """Why a profile's arguments pin another revision than its source ("" when they pin none
    or the same): the planner sizes the source's revision, so the engine must load it. A
    revision in the arguments beside a source that pins none is a conflict too: give it in
    the source (`hf://ORG/NAME@REV`), where the planner sees it."""
    hit = args_revision(engine, args)
    if hit is None:
        return ""
    flag, value = hit
    pinned = source_revision(source)
    if value == pinned:
        return ""
    if not pinned:
        return (
            f"{flag} {value!r} in the arguments pins a revision the source {source[:120]!r} does "
            f"not: write it in the source (hf://ORG/NAME@{value}) so the planner sizes what "
            "loads, and drop the flag"
        )
    return (
        f"{flag} {value!r} in the arguments differs from the revision the source pins "
        f"({pinned}): the planner sized {pinned}; drop the flag (the agent passes the "
        "source's revision itself)"
    )
