"""The help of every command, as people read it, against a committed golden file per command
(tests/golden/help/): a changed flag, default or sentence shows in review as a diff of text.

Regenerate after a deliberate change with
`LLMGW_UPDATE_GOLDEN=1 .venv/bin/pytest -q tests/unit/test_help_golden.py` and review the diff.
The texts are argparse's for the Python this project pins (3.11); another Python lays help out
differently.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.parsers import ENTRY_POINTS, clean_environment, parser_of, walk

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "help"


def _helps(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    clean_environment(monkeypatch)
    out: dict[str, str] = {}
    for name in sorted(ENTRY_POINTS):
        for path, parser in walk(parser_of(name)):
            key = "-".join((name, *path)) if path or name != "llmgw" else "llmgw"
            out[key] = parser.format_help()
    return out


def test_help_texts_match_their_golden_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each command's --help equals tests/golden/help/NAME.txt; no golden file is stale."""
    update = os.environ.get("LLMGW_UPDATE_GOLDEN") == "1"
    helps = _helps(monkeypatch)
    if update:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for old in GOLDEN.glob("*.txt"):
            old.unlink()
        for key, text in helps.items():
            (GOLDEN / f"{key}.txt").write_text(text)
    files = {p.stem: p.read_text() for p in GOLDEN.glob("*.txt")}
    assert sorted(files) == sorted(helps), "commands and golden files differ: regenerate"
    for key, text in helps.items():
        assert text == files[key], f"{key}: help changed; regenerate and review the diff"
