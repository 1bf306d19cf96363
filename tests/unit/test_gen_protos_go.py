"""scripts/gen_protos.py's Go side refuses what cannot produce the committed code, saying why:
no go, a go older than gen/go's go.mod needs, a plugin of another version than the pinned one.
The stand-in programs are shell scripts answering as the real ones would; the real tools are
exercised by `make proto-check` and `make go-test`."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def gen_protos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_protos"] = module
    spec.loader.exec_module(module)
    return module


def script(folder: Path, name: str, answer: str) -> Path:
    path = folder / name
    path.write_text(f"#!/bin/sh\necho '{answer}'\n")
    path.chmod(0o755)
    return path


def test_a_go_older_than_the_module_needs_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script(tmp_path, "go", "go1.19.8")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SystemExit, match=r"go1\.19\.8: gen/go needs Go 1\.26\+"):
        gen_protos().go_tool()


def test_a_plugin_of_another_version_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script(tmp_path, "protoc-gen-go", "protoc-gen-go v1.28.1")
    script(tmp_path, "protoc-gen-go-grpc", "protoc-gen-go-grpc 1.6.2")
    monkeypatch.setenv("LLMGW_GO_TOOLS", str(tmp_path))
    with pytest.raises(SystemExit, match=r"answers 'protoc-gen-go v1\.28\.1'.*v1\.36\.12"):
        gen_protos().go_plugins()


def test_missing_plugins_name_the_make_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMGW_GO_TOOLS", str(tmp_path / "none"))
    with pytest.raises(SystemExit, match="make go-tools"):
        gen_protos().go_plugins()


def test_the_pins_agree_with_what_the_plugins_answer() -> None:
    """Each pinned version is the one its --version answer names."""
    module = gen_protos()
    for tool, (_, version) in module.GO_PLUGINS.items():
        assert module.GO_PLUGIN_ANSWERS[tool].endswith(version.removeprefix("v")), tool
    assert os.path.basename(module.GO_MODULE) == "go"
