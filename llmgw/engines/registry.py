"""The engines llmgw knows, by name: one line per engine, each engine one module."""

from __future__ import annotations

from llmgw.engines.base import Engine
from llmgw.engines.errors import UnknownEngine
from llmgw.engines.llamacpp import LLAMACPP
from llmgw.engines.one_card import EMBEDDINGS, INFINITY, TEI
from llmgw.engines.sglang import SGLANG
from llmgw.engines.trtllm import TRTLLM
from llmgw.engines.vllm import VLLM

_ENGINES: dict[str, Engine] = {}
_ALIASES: dict[str, str] = {}


def register(engine: Engine) -> None:
    """Make `engine` known under its name and aliases (a name already known is replaced)."""
    unregister(engine.name)
    _ENGINES[engine.name] = engine
    for alias in engine.aliases:
        _ALIASES[alias] = engine.name


def unregister(name: str) -> None:
    """Forget the engine of that name and its aliases (nothing when unknown)."""
    gone = _ENGINES.pop(name, None)
    if gone is not None:
        for alias in gone.aliases:
            _ALIASES.pop(alias, None)


def find(name: str) -> Engine | None:
    """The engine of that name or alias (case and surrounding space ignored), None when
    unknown."""
    key = name.strip().lower()
    return _ENGINES.get(_ALIASES.get(key, key))


def get(name: str) -> Engine:
    """The engine of that name or alias.

    Raises:
        UnknownEngine: no engine of that name is registered.
    """
    engine = find(name)
    if engine is None:
        raise UnknownEngine(
            f"the planner does not know the engine {name!r}: use one of " + ", ".join(names()),
            engine=name,
        )
    return engine


def names() -> list[str]:
    """The registered engines' names, sorted."""
    return sorted(_ENGINES)


for _engine in (VLLM, SGLANG, TRTLLM, LLAMACPP, TEI, INFINITY, EMBEDDINGS):
    register(_engine)
