"""`llmgw ctl replica list` shows a gang's nodes and cards by rank, the head first."""

from __future__ import annotations

from llmgw.cli.output import REPLICA_HEADERS, replica_rows
from llmgw.fleet.v1 import fleet_pb2


def test_a_gang_row_lists_every_member_and_a_one_node_row_its_node() -> None:
    """node-a+node-b and 0,1+2,3 for a gang; the node and cards as before otherwise."""
    gang = fleet_pb2.Replica(
        id="g",
        node="node-a",
        gpus=[0, 1],
        members=[
            fleet_pb2.ReplicaMember(rank=0, node="node-a", gpus=[0, 1]),
            fleet_pb2.ReplicaMember(rank=1, node="node-b", gpus=[2, 3]),
        ],
    )
    single = fleet_pb2.Replica(id="r", node="node-c", gpus=[4])
    node, cards = REPLICA_HEADERS.index("node"), REPLICA_HEADERS.index("cards")
    rows = replica_rows([gang, single])
    assert (rows[0][node], rows[0][cards]) == ("node-a+node-b", "0,1+2,3")
    assert (rows[1][node], rows[1][cards]) == ("node-c", "4")
