"""PlanGPUs on a replica spanning nodes: tp × pp re-split over nodes × cards a node (tensor
parallel within a node, one stage a node; tp across nodes when the profile ran it so; smaller
tp and more stages when the heads say no), refused with the counts that split."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from fleet_svc.standin.gang import read_role
from llmgw.engines import registry
from llmgw.engines.tensor_parallel import TensorParallelEngine
from llmgw.model import Inventory, Model, Node, Profile
from llmgw.shape import ModelShape
from planner_svc.domain import errors, gang_split
from planner_svc.domain.gpus import plan_gpus
from tests.support.shapes import LLAMA_31_8B, LLAMA_31_70B, QWEN25_7B, dense

H100 = "H100-80GB"
CLUSTER = Inventory(
    nodes=tuple(
        Node(f"n{i}", H100, gpus=8, free_gpus=8, gpu_memory_bytes=81559 << 20) for i in range(4)
    )
)

# Three heads and two layers: tensor parallel only 1 or 3, at most two stages.
TINY = dense(
    "tiny", layers=2, heads=3, kv_heads=3, head_dim=64, trained=4096, weights_bytes=1 << 20
)


def gang(
    engine: str, args: Sequence[str], *, gpn: int = 2, nodes: int = 2, tp: int = 0, pp: int = 0
) -> Model:
    """Model `m` with one H100 profile `g` of `engine` over `nodes` nodes."""
    p = Profile(
        "g", engine, tuple(args), gpu_class=H100, gpus_per_node=gpn, nodes=nodes, tp=tp, pp=pp
    )
    return Model(name="m", source="hf://x/y", context_length=8192, profiles=(p,))


def engine_named(name: str) -> TensorParallelEngine:
    """The registered tensor-parallel engine `name`."""
    found = registry.find(name)
    assert isinstance(found, TensorParallelEngine)
    return found


@pytest.mark.parametrize(
    ("nodes", "gpn", "across", "want"),
    [
        (2, 4, False, [(4, 2), (2, 4), (1, 8)]),
        (2, 4, True, [(8, 1), (4, 2), (2, 4), (1, 8)]),
        (3, 3, False, [(3, 3), (1, 9)]),
        (2, 1, False, [(1, 2)]),
    ],
)
def test_candidates_keep_tp_within_a_node_unless_it_spanned_them(
    nodes: int, gpn: int, across: bool, want: list[tuple[int, int]]
) -> None:
    """The splits tried, best first: tp across nodes only when asked, then tp = the node's
    cards, then each smaller divisor of them with more stages."""
    got = gang_split.candidates(nodes, gpn, tp_across=across)
    assert [(s.tp, s.pp) for s in got] == want
    assert all(s.world == nodes * gpn for s in got)


CASES = [
    # (engine, args, extra profile fields, shape, gpus) -> (args, tp, pp, noted)
    pytest.param(
        "vllm", ("-tp", "2", "-pp", "2"), {}, LLAMA_31_8B, 4,
        ("-tp", "4", "-pp", "2"), 4, 2, False, id="vllm-one-stage-a-node-grows",
    ),
    pytest.param(
        "vllm", ("-tp", "2", "-pp", "2"), {}, LLAMA_31_8B, 1,
        ("-tp", "1", "-pp", "2"), 1, 2, False, id="vllm-one-card-a-node",
    ),
    pytest.param(
        "vllm", ("-tp", "4"), {}, LLAMA_31_8B, 4,
        ("-tp", "8"), 8, 1, False, id="vllm-tp-across-nodes-kept",
    ),
    pytest.param(
        "vllm", ("-tp", "4"), {}, QWEN25_7B, 4,
        ("-tp", "4", "--pipeline-parallel-size", "2"), 4, 2, True,
        id="vllm-tp-across-fails-heads-falls-back-to-stages",
    ),
    pytest.param(
        "vllm", ("--tensor-parallel-size", "2", "-pp", "2"), {}, QWEN25_7B, 8,
        ("--tensor-parallel-size", "4", "-pp", "4"), 4, 4, True,
        id="vllm-28-heads-on-8-cards-two-stages-a-node",
    ),
    pytest.param(
        "vllm", ("-tp", "2", "-pp", "2"), {}, LLAMA_31_8B, 3,
        ("-tp", "1", "-pp", "6"), 1, 6, True, id="vllm-3-cards-do-not-split-32-heads",
    ),
    pytest.param(
        "sglang", ("--tp-size", "4"), {}, LLAMA_31_8B, 4,
        ("--tp-size", "8"), 8, 1, False, id="sglang-tp-over-nnodes-kept",
    ),
    pytest.param(
        "sglang", ("--tp-size", "2", "--pp-size", "2"), {}, LLAMA_31_8B, 4,
        ("--tp-size", "4", "--pp-size", "2"), 4, 2, False, id="sglang-stages",
    ),
    pytest.param(
        "vllm", ("-tp", "2", "-pp", "2"), {"gpn": 0, "nodes": 0, "tp": 2, "pp": 2},
        LLAMA_31_8B, 4, ("-tp", "4", "-pp", "2"), 4, 2, False,
        id="vllm-nodes-unset-pp-across-nodes",
    ),
    pytest.param(
        "vllm", ("-tp", "2", "-pp", "2"), {}, None, 3,
        ("-tp", "3", "-pp", "2"), 3, 2, False, id="vllm-heads-unknown-unchecked",
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("engine", "args", "extra", "shape", "gpus", "want_args", "tp", "pp", "noted"), CASES
)
def test_a_gang_is_re_split_over_its_nodes(
    engine: str,
    args: Sequence[str],
    extra: dict[str, int],
    shape: ModelShape | None,
    gpus: int,
    want_args: Sequence[str],
    tp: int,
    pp: int,
    noted: bool,
) -> None:
    """tp × pp becomes nodes × the cards asked, the profile records it, and the stand-in
    (checking as the engine does) accepts every member's arguments."""
    model = gang(
        engine,
        args,
        gpn=extra.get("gpn", 2),
        nodes=extra.get("nodes", 2),
        tp=extra.get("tp", 0),
        pp=extra.get("pp", 0),
    )
    change = plan_gpus(
        model,
        shape,
        gpus=gpus,
        profile="",
        inventory=CLUSTER,
    )
    (p,) = change.updated
    assert p.args == tuple(want_args)
    assert (p.nodes, p.gpus_per_node, p.tp, p.pp) == (2, gpus, tp, pp)
    assert p.cards == 2 * gpus
    assert ("runs tp" in change.note) == noted
    for rank in (0, 1):
        flags = ["--nnodes", "2", "--node-rank", str(rank)]
        if engine == "vllm":
            flags += ["--master-addr", "h", "--master-port", "29500"]
            flags += ["--headless"] if rank else []
        else:
            flags += ["--dist-init-addr", "h:29500"]
        role = read_role(engine, [*p.args, *flags], gpus, {})
        assert role is not None and role.nnodes == 2


def test_no_split_is_refused_with_each_reason_and_the_counts_that_split() -> None:
    """Three heads, two layers, two nodes of 2 cards: tp 2 splits no heads, tp 1 needs four
    stages of two layers: refused, naming both and the cards a node that would work."""
    with pytest.raises(errors.HeadsNotDivisible) as caught:
        plan_gpus(
            gang("vllm", ("-tp", "1", "-pp", "2"), gpn=1),
            TINY,
            gpus=2,
            profile="",
            inventory=CLUSTER,
        )
    e = caught.value
    assert "tp 2 x pp 2:" in e.message and "tp 1 x pp 4:" in e.message
    assert "4 pipeline stages is more than its 2 layers" in e.message
    assert e.valid_counts == (1, 3)
    assert e.metadata()["valid_counts"] == "1,3"


@pytest.mark.parametrize("gpus", range(1, 9))
@pytest.mark.parametrize("shape", [LLAMA_31_8B, QWEN25_7B], ids=["llama8b", "qwen7b"])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_split_chosen_fills_the_world_and_passes_the_heads(
    engine: str, shape: ModelShape, gpus: int
) -> None:
    """Whatever count is asked, the split chosen runs nodes × cards ranks and its tp passes
    the engine's tensor-parallel checks."""
    eng = engine_named(engine)
    answer = gang_split.choose(eng, shape, (), nodes=3, gpus_per_node=gpus, tp_across=False)
    assert answer.split is not None
    assert answer.split.world == 3 * gpus
    assert eng.tp_failure(answer.split.tp, shape, ()) is None
    assert not answer.split.tp_across_nodes


def test_a_llamacpp_gang_keeps_its_nodes_and_splits_layers() -> None:
    """llama.cpp's RPC gang has no tp/pp: its cards a node change, its nodes stay."""
    change = plan_gpus(
        gang("llamacpp", ("-c", "8192")), LLAMA_31_8B, gpus=4, profile="", inventory=CLUSTER
    )
    (p,) = change.updated
    assert (p.nodes, p.gpus_per_node) == (2, 4)
    assert "--split-mode" in p.args


def test_too_few_nodes_with_the_cards_is_refused_with_what_a_gang_could_take() -> None:
    """A 3-node gang asking 8 cards a node where only two nodes have 8 is refused, naming 4
    (the third largest node's cards) as the most it could take."""
    inventory = Inventory(
        nodes=tuple(
            Node(n, H100, gpus=g, free_gpus=g, gpu_memory_bytes=81559 << 20)
            for n, g in (("a", 8), ("b", 8), ("c", 4))
        )
    )
    m = gang("vllm", ("-tp", "2", "-pp", "3"), nodes=3)
    with pytest.raises(errors.GPUCountUnavailable) as caught:
        plan_gpus(m, LLAMA_31_8B, gpus=8, profile="", inventory=inventory)
    assert caught.value.largest == 4
    assert "2 H100-80GB node(s) have 8 cards" in caught.value.message
    (p,) = plan_gpus(m, LLAMA_31_8B, gpus=4, profile="", inventory=inventory).updated
    assert (p.tp, p.pp) == (4, 3)


def test_cards_too_small_on_a_gang_names_the_cards_a_node_that_hold_it() -> None:
    """Llama 3.1 70B over 2 nodes of 1 H100 does not fit at 65536 tokens: the refusal names the
    cards a node (2, re-split) that hold it, not a count of one node."""
    m = gang("vllm", ("--max-model-len", "65536", "-tp", "2", "-pp", "2"))
    with pytest.raises(errors.CardsTooSmall) as caught:
        plan_gpus(m, LLAMA_31_70B, gpus=1, profile="", inventory=CLUSTER)
    assert caught.value.fewest_cards == 2
    assert "2 cards on each of 2 nodes for 65536 tokens" in caught.value.message
    (p,) = plan_gpus(m, LLAMA_31_70B, gpus=2, profile="", inventory=CLUSTER).updated
    assert (p.tp, p.pp, p.cards) == (2, 2, 4)
