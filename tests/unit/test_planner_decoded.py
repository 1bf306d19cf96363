"""The planner's memory of converted request sub-messages: the same bytes give the same
value, a refusal is never kept, and what is held stays bounded."""

from __future__ import annotations

import pytest

from llmgw.common.v1 import common_pb2
from llmgw.model import InvalidValue
from planner_svc.rpc.decoded import KEPT_MESSAGE_BYTES, KEPT_MESSAGES, Decoded, decoders


def _model(name: str = "m", context_length: int = 8192) -> common_pb2.Model:
    profile = common_pb2.Profile(name="gpu", engine="vllm", gpu_class="H100-80GB")
    return common_pb2.Model(name=name, context_length=context_length, profiles=[profile])


def test_the_same_bytes_convert_once_and_other_bytes_anew() -> None:
    """A message asked again returns the value converted the first time; another message is
    converted on its own."""
    model_of, _ = decoders()
    first = model_of(_model())
    assert model_of(_model()) is first
    other = model_of(_model(context_length=4096))
    assert other is not first
    assert (first.context_length, other.context_length) == (8192, 4096)
    assert len(model_of) == 2


def test_a_refusal_is_raised_each_time_and_never_kept() -> None:
    """A message the conversion refuses is refused again when asked again; nothing is kept."""
    model_of, _ = decoders()
    bad = _model(name="")
    for _ in range(2):
        with pytest.raises(InvalidValue):
            model_of(bad)
    assert len(model_of) == 0


def test_the_kept_values_are_bounded_in_count_and_size() -> None:
    """Past KEPT_MESSAGES the least recently used goes; a message longer than
    KEPT_MESSAGE_BYTES is converted but not kept."""
    calls: list[bytes] = []

    def convert(msg: object) -> bytes:
        assert isinstance(msg, common_pb2.Inventory)
        calls.append(msg.SerializeToString())
        return calls[-1]

    kept = Decoded(convert)
    for i in range(KEPT_MESSAGES + 5):
        kept(common_pb2.Inventory(nodes=[common_pb2.InventoryNode(name=f"n{i}")]))
    assert len(kept) == KEPT_MESSAGES
    big = common_pb2.Inventory(nodes=[common_pb2.InventoryNode(name="x" * KEPT_MESSAGE_BYTES)])
    kept(big)
    kept(big)
    assert len(kept) == KEPT_MESSAGES
    assert len(calls) == KEPT_MESSAGES + 5 + 2
    kept(common_pb2.Inventory(nodes=[common_pb2.InventoryNode(name="n0")]))  # forgotten first
    assert len(calls) == KEPT_MESSAGES + 5 + 3


def test_an_inventory_with_versions_converts_alike_in_any_map_order() -> None:
    """Inventories whose engine-version maps were filled in another order are one entry."""
    _, inventory_of = decoders()
    a = common_pb2.InventoryNode(name="n", gpu_class="H100-80GB", gpus=8)
    a.engine_versions["vllm"] = "0.10.1"
    a.engine_versions["sglang"] = "0.4.9"
    b = common_pb2.InventoryNode(name="n", gpu_class="H100-80GB", gpus=8)
    b.engine_versions["sglang"] = "0.4.9"
    b.engine_versions["vllm"] = "0.10.1"
    first = inventory_of(common_pb2.Inventory(nodes=[a]))
    assert inventory_of(common_pb2.Inventory(nodes=[b])) is first
    assert len(inventory_of) == 1
