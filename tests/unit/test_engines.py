"""Each engine's flag grammar: a context and a card count are written where the flag already
stands, under whichever alias and spelling the profile used, never a second time."""

from __future__ import annotations

import pytest

from llmgw.engines import registry
from llmgw.engines.errors import UnknownEngine
from llmgw.model import Inventory, Model, Node, Profile
from planner_svc.domain.context import size_context
from planner_svc.domain.gpus import plan_gpus
from tests.support.shapes import LLAMA_31_8B

NODES = Inventory(
    nodes=(Node("a", "H100-80GB", gpus=8, free_gpus=8, gpu_memory_bytes=81559 << 20),)
)


@pytest.mark.parametrize(
    ("engine", "args", "want"),
    [
        # vLLM's FlexibleArgumentParser reads `_` as `-`: the underscore spelling is the flag.
        ("vllm", ["--tensor_parallel_size", "2"], ["--tensor_parallel_size", "4"]),
        ("vllm", ["--tensor_parallel_size=2"], ["--tensor_parallel_size=4"]),
        ("vllm", ["--tensor-parallel-size=2"], ["--tensor-parallel-size=4"]),
        ("vllm", ["-tp", "2", "--dtype", "auto"], ["-tp", "4", "--dtype", "auto"]),
        ("vllm", ["-tp=2"], ["-tp=4"]),
        ("vllm", ["-tp", "2", "--tensor_parallel_size", "2"], ["-tp", "4"]),
        ("vllm", [], ["--tensor-parallel-size", "4"]),
        # SGLang: --tensor-parallel-size and --tp-size are one flag; --tp reaches it.
        ("sglang", ["--tensor-parallel-size", "2"], ["--tensor-parallel-size", "4"]),
        ("sglang", ["--tensor-parallel-size=2"], ["--tensor-parallel-size=4"]),
        ("sglang", ["--tp", "2"], ["--tp", "4"]),
        ("sglang", ["--tp-size=2", "--tp", "2"], ["--tp-size=4"]),
        ("sglang", [], ["--tp-size", "4"]),
        ("trtllm", ["--tp_size", "2"], ["--tp_size", "4"]),
        ("trtllm", ["--tp-size=2"], ["--tp-size=4"]),
        ("trtllm", [], ["--tp_size", "4"]),
    ],
)
def test_card_count_rewrites_the_tensor_parallel_flag_in_place(
    engine: str, args: list[str], want: list[str]
) -> None:
    """Moving to 4 cards rewrites the tensor parallel flag where and as it was written."""
    assert registry.get(engine).with_cards(args, 4) == want


@pytest.mark.parametrize(
    ("args", "cards", "want"),
    [
        (["-ts", "3,1", "-ngl", "99"], 2, ["-ngl", "99", "--split-mode", "layer"]),
        (["--tensor_split", "3,1", "-sm", "row"], 2, ["-sm", "layer"]),
        (["--split_mode=row"], 4, ["--split_mode", "layer"]),  # llama-server takes no `=`
        (["-ts", "1,1"], 1, []),
    ],
)
def test_llamacpp_cards_split_layers_written_apart(
    args: list[str], cards: int, want: list[str]
) -> None:
    """llama.cpp loses its old tensor split and gets a layer split, never as `--flag=value`."""
    assert registry.get("llamacpp").with_cards(args, cards) == want


@pytest.mark.parametrize(
    ("engine", "args", "want"),
    [
        ("vllm", ["--max_model_len=4096"], ["--max_model_len=8192"]),
        ("vllm", ["--max-model-len", "4096"], ["--max-model-len", "8192"]),
        ("sglang", ["--context-length=4096"], ["--context-length=8192"]),
        ("trtllm", ["--max-seq-len", "4096"], ["--max-seq-len", "8192"]),
        ("llamacpp", ["--ctx-size=4096"], ["--ctx-size", "16384", "--parallel", "2"]),
        ("llamacpp", ["--ctx_size", "4096", "-np", "1"], ["--ctx_size", "16384", "-np", "2"]),
        ("llamacpp", ["-c", "4096", "--parallel=1"], ["-c", "16384", "--parallel", "2"]),
    ],
)
def test_context_rewrites_the_context_flag_in_place(
    engine: str, args: list[str], want: list[str]
) -> None:
    """A context of 8192 tokens for 2 slots is written into the flags already there."""
    assert registry.get(engine).with_context(args, 8192, 2) == want


@pytest.mark.parametrize(
    ("engine", "args", "want"),
    [
        (
            "vllm",
            ("--max-model-len", "8192", "--tensor_parallel_size", "2"),
            ("--max-model-len", "8192", "--tensor_parallel_size", "4"),
        ),
        ("vllm", ("--max-model-len=8192", "-tp=2"), ("--max-model-len=8192", "-tp=4")),
        (
            "sglang",
            ("--context-length", "8192", "--tensor-parallel-size", "2"),
            ("--context-length", "8192", "--tensor-parallel-size", "4"),
        ),
        (
            "sglang",
            ("--context-length", "8192", "--tensor-parallel-size=2"),
            ("--context-length", "8192", "--tensor-parallel-size=4"),
        ),
    ],
)
def test_set_gpus_keeps_one_tensor_parallel_flag(
    engine: str, args: tuple[str, ...], want: tuple[str, ...]
) -> None:
    """PlanGPUs to 4 cards on a profile at tp 2 leaves one tp flag, set to 4 (issue 7's bugs:
    `--tensor-parallel-size 2 --tp-size 4` and a doubled `--tensor_parallel_size`)."""
    profile = Profile("p", engine, args, gpu_class="H100-80GB", gpus_per_node=2, tp=2)
    model = Model(name="m", source="hf://x/y", context_length=8192, profiles=(profile,))
    change = plan_gpus(model, LLAMA_31_8B, gpus=4, profile="", inventory=NODES)
    (p,) = change.updated
    assert p.args == want
    assert (p.gpus_per_node, p.tp) == (4, 4)
    # The planner reads the rewritten flag back as the replica's tensor parallel size.
    assert registry.get(engine).tensor_parallel(p.args, 0) == (4, 1)


def test_set_context_keeps_one_context_flag() -> None:
    """SizeContext on a vLLM profile spelled `--max_model_len=` rewrites that flag only."""
    profile = Profile("p", "vllm", ("--max_model_len=4096",), gpu_class="H100-80GB")
    model = Model(name="m", source="hf://x/y", context_length=4096, profiles=(profile,))
    change = size_context(model, LLAMA_31_8B, tokens=8192, slots=0, inventory=NODES)
    assert change.updated[0].args == ("--max_model_len=8192",)


def test_registry_finds_names_and_aliases_and_refuses_others() -> None:
    """Engines are found by name or alias in any case; an unknown name is refused by name."""
    assert registry.get(" LLaMA.cpp ").name == "llamacpp"
    assert registry.get("trtllm-serve").name == "trtllm"
    assert {"vllm", "sglang", "trtllm", "llamacpp", "tei"} <= set(registry.names())
    assert registry.find("tgi") is None
    with pytest.raises(UnknownEngine) as caught:
        registry.get("tgi")
    assert caught.value.engine == "tgi" and "vllm" in caught.value.message


@pytest.mark.parametrize(
    ("engine", "args", "tokens", "slots"),
    [
        ("vllm", ("--max_model_len", "6144"), 6144, 1),
        ("sglang", ("--context-length=2048",), 2048, 1),
        ("llamacpp", ("--ctx_size", "16384", "-np", "4"), 4096, 4),
        ("llamacpp", ("-c", "16384"), 16384, 1),
        ("tei", ("--max-batch-tokens", "9"), 0, 1),
    ],
)
def test_engines_read_back_the_context_they_write(
    engine: str, args: tuple[str, ...], tokens: int, slots: int
) -> None:
    """Each engine reads a profile's context and slots in the spellings it writes."""
    found = registry.get(engine)
    assert (found.context_tokens(args), found.slots(args)) == (tokens, slots)
