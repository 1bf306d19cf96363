"""Every entry point's parser, built as a fresh process would (no LLMGW_* variable set, a
100-column terminal), and the walk over a parser's command tree the help tests share."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Iterator

import pytest

ENTRY_POINTS: dict[str, str] = {
    "llmgw": "llmgw.cli.main",
    "planner": "planner_svc.__main__",
    "fleet": "fleet_svc.__main__",
    "agent": "fleet_svc.agent.__main__",
    "demo": "llmgw.demo.__main__",
}
"""An entry point's short name -> the module whose build_parser() makes its parser."""

MODULES = {
    "llmgw": ["-m", "llmgw.cli.main"],
    "planner": ["-m", "planner_svc"],
    "fleet": ["-m", "fleet_svc"],
    "agent": ["-m", "fleet_svc.agent"],
    "demo": ["-m", "llmgw.demo"],
    "standin": ["-m", "fleet_svc.standin"],
}
"""How a child process runs each entry point (`python ARGS...`); the stand-in engine has
--version, its other conventions an engine's."""


def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No variable a flag's default is read from, and a fixed terminal width."""
    import os

    for name in list(os.environ):
        if name.startswith(("LLMGW_", "OTEL_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("COLUMNS", "100")


def parser_of(name: str) -> argparse.ArgumentParser:
    """A fresh parser of entry point `name` (build it after clean_environment)."""
    build: Callable[[], argparse.ArgumentParser] = importlib.import_module(
        ENTRY_POINTS[name]
    ).build_parser
    return build()


def walk(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Each command of the tree (the root first) with its path of names."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, child in action.choices.items():
                yield from walk(child, (*path, sub_name))
