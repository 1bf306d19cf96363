"""Engine versions from outside are bounded: a Hello's are kept only within the limits, and a
planner request's past them are refused naming the field."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from fleet_svc.rpc.agent_stream import engine_versions_of
from llmgw.common.v1 import common_pb2
from llmgw.model import InvalidValue
from llmgw.rpc.common import inventory_from_proto


def test_a_hellos_versions_past_the_limits_are_dropped_and_logged() -> None:
    """A version too long, or an empty one, is dropped (and logged); the rest are kept."""
    with capture_logs() as logs:
        kept = engine_versions_of("n1", {"vllm": "0.10.2", "sglang": "x" * 65, "trtllm": ""})
    assert kept == {"vllm": "0.10.2"}
    assert [e["engine"] for e in logs if e["event"] == "engine_version_dropped"] == [
        "sglang",
        "trtllm",
    ]
    many = {f"e{i}": "1.0" for i in range(100)}
    assert len(engine_versions_of("n1", many)) == 64


def test_a_requests_inventory_versions_are_read_and_bounded() -> None:
    """An inventory's versions come back sorted; too many, or too long, are refused."""
    node = common_pb2.InventoryNode(name="n", engine_versions={"vllm": "0.10.2", "sglang": "0.4"})
    inventory = inventory_from_proto(common_pb2.Inventory(nodes=[node]))
    assert inventory.nodes[0].engine_versions == (("sglang", "0.4"), ("vllm", "0.10.2"))
    long = common_pb2.InventoryNode(name="n", engine_versions={"vllm": "9" * 65})
    with pytest.raises(InvalidValue) as caught:
        inventory_from_proto(common_pb2.Inventory(nodes=[long]))
    assert caught.value.field == "inventory.nodes[0].engine_versions"
    many = common_pb2.InventoryNode(name="n", engine_versions={f"e{i}": "1" for i in range(65)})
    with pytest.raises(InvalidValue, match="at most 64"):
        inventory_from_proto(common_pb2.Inventory(nodes=[many]))
