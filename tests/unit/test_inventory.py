"""An inventory's nodes by card class, sizing's memo beside a shape and a profile's copy with
other args: each made without changing the value it comes from."""

from __future__ import annotations

import gc
from dataclasses import fields, replace

from llmgw.engines.memo import _MEMOS, sizing_memo
from llmgw.model import Inventory, Node, Profile
from tests.support.shapes import LLAMA_31_8B

NODES = (
    Node(name="a", gpu_class="H100-80GB", gpus=8),
    Node(name="b", gpu_class=" h100-80gb ", gpus=4, engine_versions=(("vllm", "0.11.0"),)),
    Node(name="c", gpu_class="H100-80GB", gpus=0),
    Node(name="d", gpu_class="L4", gpus=1),
)


def test_nodes_of_a_class_are_found_whatever_its_spelling_and_only_with_cards() -> None:
    """A class matches case and blanks aside, in the order the nodes came; a node with no
    cards is of no class; an unknown class has no nodes."""
    inv = Inventory(NODES)
    for spelled in ("H100-80GB", "h100-80gb", " h100-80gb ", "H100-80gb"):
        assert [n.name for n in inv.of_class(spelled)] == ["a", "b"]
    assert [n.name for n in inv.of_class("l4")] == ["d"]
    assert inv.of_class("A100") == () and inv.largest_count("h100-80GB") == 8
    assert inv.reports_versions and not Inventory(NODES[:1]).reports_versions


def test_an_inventory_is_a_value_its_index_follows_its_nodes() -> None:
    """Two inventories of the same nodes are equal; one made from another with other nodes
    answers for its own."""
    inv = Inventory(NODES)
    assert inv == Inventory(NODES)
    fewer = replace(inv, nodes=NODES[2:])
    assert fewer.of_class("H100-80GB") == () and not fewer.reports_versions


def test_a_shape_s_memo_is_its_own_and_goes_with_it() -> None:
    """A shape and an equal copy have memos of their own, the same one each time asked; the
    memo is gone once its shape is."""
    shape = replace(LLAMA_31_8B)
    memo = sizing_memo(shape)
    memo["k"] = 1
    assert sizing_memo(shape) is memo and sizing_memo(replace(shape)) == {}
    assert shape == LLAMA_31_8B
    key = id(shape)
    del shape, memo
    gc.collect()
    assert key not in _MEMOS


def test_a_profile_with_other_args_is_the_profile_replace_would_make() -> None:
    """Profile.with_args (the sizing path's copy) equals dataclasses.replace with those args,
    every other field kept; it stays right only while a Profile derives nothing."""
    p = Profile(
        name="gpu",
        engine="vllm",
        args=("--max-model-len", "8192"),
        gpu_class="H100-80GB",
        gpus_per_node=2,
        tp=2,
        pp=1,
        nodes=1,
        min_memory_gb=3,
        cpu_only=False,
        replicas=4,
        engine_version="0.11.0",
    )
    assert {f.name for f in fields(Profile)} <= set(vars(p))
    new = p.with_args(("--max-model-len", "4096"))
    assert new == replace(p, args=("--max-model-len", "4096")) and new is not p
    assert p.args == ("--max-model-len", "8192")
    assert not hasattr(Profile, "__post_init__")
