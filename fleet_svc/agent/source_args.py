"""How a replica's source reaches an engine's command line: the source's kind and value, the
items a template's `{source_args}` gives for it, and how a pinned revision follows it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llmgw.engines.revision import args_revision, revision_flag

# How a replica's source is written: a local path, an http(s) URL, or hf://ORG/NAME[@REV].
SOURCE_KINDS = ("path", "url", "hf")
# llama-server takes a file with -m, a URL with -mu (downloaded to its cache) and a Hugging
# Face repo with -hf (common/arg.cpp).
LLAMACPP_SOURCE_ARGS: dict[str, tuple[str, ...]] = {
    "path": ("-m", "{value}"),
    "url": ("-mu", "{value}"),
    "hf": ("-hf", "{value}"),
}


def source_parts(source: str) -> tuple[str, str]:
    """A source's kind (one of SOURCE_KINDS) and the value an engine is given for it:
    `hf://ORG/NAME[@REV]` -> ("hf", "ORG/NAME") (the revision goes by the engine's revision
    flag: `EngineConfig.command`), a URL as it is, anything else a path."""
    if source.startswith("hf://"):
        return "hf", source[len("hf://") :].split("@", 1)[0]
    if source.startswith(("http://", "https://")):
        return "url", source
    return "path", source


def pin_items(
    items: Sequence[str], revision: str, flag: Sequence[str], args: Sequence[str], family: str
) -> list[str] | None:
    """What follows an hf source's items so the engine loads `revision`: nothing when there is
    none to pin, when the items carry `{revision}` themselves, or when the profile's arguments
    pin it already (the fleet refuses any other revision there); else the family's revision
    flag and the revision. None: the engine has no way to be given it."""
    if not revision or any("{revision}" in item for item in items):
        return []
    if args_revision(family, args) is not None:
        return []
    if not flag:
        return None
    return [flag[0], revision]


def not_a_flag(value: str) -> None:
    """A source in an argument slot of its own never reads as a flag (admission refuses such
    sources; this is the last line before exec)."""
    if value.startswith("-"):
        raise ValueError(f"refusing to pass the source {value[:80]!r}: it would read as a flag")


def uses_source(template: tuple[str, ...]) -> bool:
    """Whether a template passes the replica's source to the engine."""
    return any("{source}" in part or part == "{source_args}" for part in template)


def pins_revision(
    template: tuple[str, ...], source_args: Mapping[str, tuple[str, ...]], family: str
) -> bool:
    """Whether a revision an hf:// source pins reaches the engine (`ArgRules.pins_revision`):
    a template passing the whole `{source}` (pin included) or none at all does; one passing
    `{source_args}` does when its hf items carry `{revision}` or the family has a revision
    flag (vLLM, SGLang, TensorRT-LLM: `--revision`; llama.cpp's -hf takes none)."""
    if "{source_args}" not in template:
        return True
    hf_items = source_args.get("hf", ("{value}",))
    return any("{revision}" in item for item in hf_items) or bool(revision_flag(family))
