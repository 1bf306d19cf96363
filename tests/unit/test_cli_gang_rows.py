"""`llmgw ctl replica list` shows a gang's nodes and cards by rank, the head first; a gang
profile shows its cards a node."""

from __future__ import annotations

import pytest

from llmgw.cli.output import REPLICA_HEADERS, cards_of, replica_rows
from llmgw.common.v1 import common_pb2
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


@pytest.mark.parametrize(
    ("profile", "shown"),
    [
        (
            common_pb2.Profile(
                name="g", engine="vllm", gpu_class="H100", gpus_per_node=1, tp=2, pp=1, nodes=2
            ),
            "1×H100",
        ),
        (
            common_pb2.Profile(
                name="g", engine="vllm", gpu_class="H100", gpus_per_node=8, tp=4, pp=4, nodes=2
            ),
            "8×H100",
        ),
        (common_pb2.Profile(name="s", engine="vllm", gpu_class="H100", tp=4), "4×H100 (tp 4)"),
    ],
)
def test_a_gang_profile_shows_its_cards_a_node_even_when_tp_spans_nodes(
    profile: common_pb2.Profile, shown: str
) -> None:
    """A gang's cards are those on each node, not its tp (which may span them)."""
    assert cards_of(profile).startswith(shown)
