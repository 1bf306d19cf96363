"""A catalog row is the contract's JSON form of a model: written as protobuf's JSON mapping
writes it (so existing databases load and compare equal) and read back to the same entry."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import json_format

from fleet_svc.rpc.convert import entry_in, model_to_proto
from fleet_svc.store.catalog_rows import entry_doc, entry_of_doc
from llmgw.common.v1 import common_pb2
from llmgw.model import Model, Profile, check_nested
from tests.support.filled import fill

MODELS = [
    common_pb2.Model(
        name="llama-3.1-8b",
        source="hf://meta-llama/Llama-3.1-8B-Instruct",
        origin=common_pb2.Origin(
            repo="meta-llama/Llama-3.1-8B-Instruct",
            revision="0e9e39f",
            files=[common_pb2.OriginFile(path="model.safetensors", bytes=16_060_522_496)],
        ),
        context_length=131_072,
        max_output=8192,
        profiles=[
            common_pb2.Profile(
                name="h100",
                engine="vllm",
                args=["--max-model-len", "131072"],
                gpu_class="H100-80GB",
                gpus_per_node=2,
                tp=2,
                replicas=3,
            ),
            common_pb2.Profile(name="cpu", engine="llamacpp", cpu_only=True, min_memory_gb=12),
        ],
    ),
    common_pb2.Model(
        name="qwen",
        source="/models/qwen.gguf",
        shape=common_pb2.ModelShape(
            architecture="qwen2",
            layers=28,
            attention_heads=28,
            kv_heads=4,
            head_dim_k=128,
            head_dim_v=128,
            trained_context=32_768,
            weights_bytes=15_231_233_024,
        ),
        profiles=[common_pb2.Profile(name="gguf", engine="llamacpp", pp=2, nodes=1)],
    ),
    common_pb2.Model(name="bare", profiles=[common_pb2.Profile(name="p", engine="sglang")]),
    # Every field of every message set (from the descriptors).
    fill(common_pb2.Model(), 1),
]


def proto_json(msg: common_pb2.Model) -> dict[str, Any]:
    """The JSON form protobuf itself writes, as earlier fleets stored it."""
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


@pytest.mark.parametrize("msg", MODELS, ids=lambda m: m.name)
def test_a_row_is_protobufs_own_json_form(msg: common_pb2.Model) -> None:
    """The row written for a model equals protobuf's JSON mapping of the model sent."""
    assert entry_doc(entry_in(msg)) == proto_json(msg)


@pytest.mark.parametrize("msg", MODELS, ids=lambda m: m.name)
def test_a_row_written_by_protobuf_reads_back_as_the_model_sent(msg: common_pb2.Model) -> None:
    """A row an earlier fleet wrote reads as the entry the API makes of the same model, and
    goes back to the API as the message first sent (origin, shape and all)."""
    entry = entry_of_doc(proto_json(msg))
    assert entry == entry_in(msg)
    assert model_to_proto(entry) == msg


def test_a_nested_field_no_conversion_lays_out_is_refused_at_import() -> None:
    """A contract dataclass with a nested field the rows do not lay out is a TypeError naming
    it, never a field silently dropped; Model's and Profile's known ones pass."""
    check_nested(Model, frozenset({"files", "profiles", "shape"}), "rows")
    check_nested(Profile, frozenset(), "rows")
    with pytest.raises(TypeError, match="shape"):
        check_nested(Model, frozenset({"files", "profiles"}), "rows")
