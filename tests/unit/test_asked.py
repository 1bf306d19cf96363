"""A SetContext or SetGPUs is a no-op by what its caller asked: the model's context, each
profile's args and cards, never what the planner would fill in."""

from __future__ import annotations

import pytest

from fleet_svc.domain.asked import ContextAsk, GPUsAsk, context_asked, gpus_asked
from llmgw.model import Model, Profile

VLLM = Profile(name="gpu", engine="vllm", gpu_class="H100-80GB", gpus_per_node=1)
LLAMA = Profile(
    name="gguf",
    engine="llamacpp",
    args=("--ctx-size", "16384", "--parallel", "2"),
    gpu_class="L4",
    gpus_per_node=1,
)


def model(*profiles: Profile, context: int = 8192) -> Model:
    """A model serving `context` tokens with `profiles`."""
    return Model(name="m", source="hf://org/m", context_length=context, profiles=profiles)


@pytest.mark.parametrize(
    ("m", "tokens", "slots", "asked"),
    [
        (model(VLLM), 8192, 0, False),  # no context flag: the model's context is what runs
        (model(VLLM), 4096, 0, True),
        (model(Profile(name="g", engine="vllm", args=("--max-model-len", "4096"))), 8192, 0, True),
        (model(LLAMA), 8192, 0, False),  # 16384 cells over 2 slots
        (model(LLAMA), 8192, 2, False),
        (model(LLAMA), 8192, 4, True),
        (model(Profile(name="x", engine="nosuch")), 8192, 0, True),
    ],
)
def test_context_asked(m: Model, tokens: int, slots: int, asked: bool) -> None:
    """Only a context or slot count the model's profiles do not run with is a change."""
    assert context_asked(m, ContextAsk(tokens, slots)) is asked


@pytest.mark.parametrize(
    ("m", "gpus", "profile", "asked"),
    [
        (model(VLLM), 1, "", False),  # no tp flag: vLLM's default of 1 is what runs
        (model(VLLM), 2, "", True),
        # Two cards but no tp flag: vLLM would run tp 1, so the flag is a change.
        (
            model(Profile(name="g", engine="vllm", gpu_class="H100-80GB", gpus_per_node=2)),
            2,
            "",
            True,
        ),
        (
            model(
                Profile(
                    name="g",
                    engine="vllm",
                    args=("--tensor-parallel-size", "2"),
                    gpu_class="H100-80GB",
                    gpus_per_node=2,
                )
            ),
            2,
            "",
            False,
        ),
        (model(LLAMA), 1, "gguf", False),
        (model(VLLM), 1, "other", True),  # no such profile: the planner says so
        (
            model(
                Profile(name="g", engine="vllm", gpu_class="H100-80GB", nodes=2, gpus_per_node=1)
            ),
            1,
            "",
            True,
        ),
    ],
)
def test_gpus_asked(m: Model, gpus: int, profile: str, asked: bool) -> None:
    """Only a card count (or the parallel sizes its args run) the profile does not have is a
    change."""
    assert gpus_asked(m, GPUsAsk(gpus, profile)) is asked


BATCHED = Profile(
    name="gpu",
    engine="vllm",
    args=("--max-num-seqs", "16"),
    gpu_class="H100-80GB",
    gpus_per_node=1,
)
TRTLLM = Profile(
    name="trt",
    engine="trtllm",
    args=("--max_batch_size=8",),
    gpu_class="H100-80GB",
    gpus_per_node=1,
)


@pytest.mark.parametrize(
    ("m", "sequences", "asked"),
    [
        (model(BATCHED), 0, False),  # no batch asked: the flag stays as it is
        (model(BATCHED), 16, False),
        (model(BATCHED), 32, True),
        (model(VLLM), 16, True),  # no --max-num-seqs yet: the planner writes one
        (model(TRTLLM), 8, False),  # --flag=value read as the engine reads it
        (model(TRTLLM), 4, True),
        (model(LLAMA), 2, False),  # llama.cpp's batch is its slots (--parallel 2)
        (model(LLAMA), 4, True),
    ],
)
def test_a_batch_is_asked_only_where_a_profile_does_not_run_it(
    m: Model, sequences: int, asked: bool
) -> None:
    """A SetContext or SetGPUs asking for `sequences` concurrent requests is a change only
    where a profile's batch flag (llama.cpp: its slots) says another number."""
    assert context_asked(m, ContextAsk(m.context_length, 0, sequences)) is asked
    cards = 1
    assert gpus_asked(m, GPUsAsk(cards, "", sequences)) is asked
