"""SetGPUs on a replica spanning nodes, end to end: the real planner re-splits its tp × pp over
nodes × the cards asked, the real fleet rolls the gang out, and real agents start stand-in
members that check the world size as vLLM does (tp × pp = nodes × the cards each sees)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest

from llmgw.fleet.v1 import fleet_pb2
from tests.integration.test_gangs import gang_cluster, gang_model, one_ready_gang
from tests.integration.test_rollouts import reason_and_meta, wait_rollout
from tests.support.shapes import dense, inline

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("engine", "args", "want"),
    [
        # tp already spanned both nodes (4 ranks over 2 × 2 cards): it keeps spanning them.
        ("vllm", ("--max-model-len", "8192", "-tp", "4"), '"-tp", "2"'),
        # One pipeline stage a node, tp within it.
        ("vllm", ("--max-model-len", "8192", "-tp", "2", "-pp", "2"), '"-tp", "1", "-pp", "2"'),
        # SGLang's tp_size is the whole replica's, over --nnodes.
        ("sglang", ("--context-length", "8192", "--tp-size", "4"), '"--tp-size", "2"'),
    ],
    ids=["vllm-tp-across-nodes", "vllm-stage-a-node", "sglang-tp-over-nnodes"],
)
async def test_set_gpus_on_a_gang_rolls_out_what_the_engine_accepts(
    tmp_path: Path, engine: str, args: Sequence[str], want: str
) -> None:
    """SetGPUs 1 on a 2-node vLLM (or SGLang) gang of 2 cards a node: the rollout succeeds, the new
    gang takes one card on each node, and both members run the re-split tp × pp."""
    async with gang_cluster(tmp_path, nodes=2) as (stub, _agents):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=gang_model(engine, args)))
        old = await one_ready_gang(stub)
        assert all(len(m.gpus) == 2 for m in old.members)
        answer = await stub.SetGPUs(fleet_pb2.SetGPUsRequest(name="big", gpus=1, in_place=True))
        (profile,) = answer.model.model.profiles
        assert (profile.nodes, profile.gpus_per_node) == (2, 1)
        assert profile.tp * max(profile.pp, 1) == 2
        ro = await wait_rollout(stub, answer.rollout_id)
        assert ro.state == fleet_pb2.ROLLOUT_STATE_SUCCEEDED, ro.reason
        new = await one_ready_gang(stub, exclude=old.id)
        assert all(len(m.gpus) == 1 for m in new.members)
        for m in new.members:
            log = (tmp_path / m.node / "logs" / f"{new.id}.log").read_text()
            assert want in log, log[-2000:]
            assert "world size" not in log


async def test_set_gpus_with_no_split_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    """Three heads and two layers over two nodes: 2 cards a node split no heads with tp 2 and
    need four stages with tp 1, so SetGPUs 2 is refused with both reasons and the cards a
    node that split (1); the model's revision and its gang stay."""
    tiny = dense(
        "tiny", layers=2, heads=3, kv_heads=3, head_dim=64, trained=8192, weights_bytes=1 << 20
    )
    model = gang_model("vllm", ("--max-model-len", "8192", "-tp", "1", "-pp", "2"), gpus_per_node=1)
    model.shape.CopyFrom(inline(tiny))
    async with gang_cluster(tmp_path, nodes=2) as (stub, _agents):
        created = await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model))
        old = await one_ready_gang(stub)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SetGPUs(fleet_pb2.SetGPUsRequest(name="big", gpus=2, in_place=True))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        reason, meta = reason_and_meta(caught.value)
        assert reason == "HEADS_NOT_DIVISIBLE"
        assert meta["valid_counts"] == "1"
        message = caught.value.details() or ""
        assert (
            "tp 2 x pp 2:" in message and "4 pipeline stages is more than its 2 layers" in message
        )
        got = await stub.GetModel(fleet_pb2.GetModelRequest(name="big"))
        assert got.model.revision == created.model.revision
        assert (await one_ready_gang(stub)).id == old.id
