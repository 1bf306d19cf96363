"""The example settings in deploy/ are what they say they are: a cluster settings file the
fleet loads and a model file `llmgw ctl model create` sends, both passing the fleet's checks."""

from __future__ import annotations

from pathlib import Path

from fleet_svc.rpc.convert import entry_in as validate
from fleet_svc.rpc.settings import read_settings
from llmgw.cli.inputs import read_model_file

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_cluster_example_declares_valid_models() -> None:
    """cluster.example.yaml declares models the fleet accepts, each with replicas wanted."""
    models = read_settings(DEPLOY / "cluster.example.yaml")
    assert [m.name for m in models] == ["qwen3-8b", "llama-3.1-70b"]
    for model in models:
        validate(model)
        assert all(p.replicas >= 1 and p.engine == "vllm" for p in model.profiles)


def test_model_example_is_a_valid_catalog_model() -> None:
    """model.example.yaml reads as one model the fleet accepts: a llama.cpp GGUF profile."""
    model = read_model_file(str(DEPLOY / "model.example.yaml"))
    validate(model)
    assert model.profiles[0].engine == "llamacpp"
    assert model.source.endswith(".gguf")
