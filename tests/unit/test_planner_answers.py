"""A SizeContext answer as the planner builds it (the profile as it stands converted once and
copied, sub-messages written in place) against the same answer built field by field."""

from __future__ import annotations

from dataclasses import replace

from llmgw.cardclass import MIB
from llmgw.common.v1 import common_pb2
from llmgw.engines.llamacpp import LLAMACPP_VERSION
from llmgw.model import Inventory, Model, Node, Profile
from llmgw.planner.v1 import planner_pb2
from llmgw.rpc.common import scalars_to_proto
from planner_svc.domain.context import ContextChange, ProfileChange, ProfileNeed, size_context
from planner_svc.rpc import convert
from tests.support.shapes import LLAMA_31_8B

H100 = Inventory(
    nodes=(Node("n1", "H100-80GB", gpus=8, free_gpus=8, gpu_memory_bytes=81559 * MIB),)
)


def models() -> list[Model]:
    """Two models of GPU and CPU profiles (vLLM with no version and a named one, llama.cpp)."""
    gpu = Profile("gpu", "vllm", ("--max-model-len", "8192"), gpu_class="H100-80GB")
    old = Profile(
        "old", "vllm", ("--max-model-len", "4096"), gpu_class="H100-80GB", engine_version="0.7.2"
    )
    cpu = Profile("cpu", "llamacpp", ("--ctx-size", "8192"), cpu_only=True)
    return [
        Model(name="a", context_length=8192, profiles=(gpu, cpu)),
        Model(name="b", context_length=4096, max_output=1000, profiles=(old, gpu)),
    ]


def memory_by_hand(need: ProfileNeed, profile: str) -> common_pb2.Memory | None:
    """A need as a new message, nothing kept."""
    if need.card is not None:
        return convert._card_memory(need.card, need.weights_known, profile)
    return convert._ram_memory(need)


def profile_change_by_hand(c: ProfileChange) -> common_pb2.ProfileChange:
    """One profile's change, every field set on a new message."""
    msg = common_pb2.ProfileChange(
        profile=c.profile,
        engine=c.engine,
        before=c.before,
        after=c.after,
        args=list(c.args),
        args_before=list(c.args_before),
    )
    after, before = memory_by_hand(c.need, c.profile), memory_by_hand(c.need_before, c.profile)
    if after is not None:
        msg.memory.CopyFrom(after)
    if before is not None:
        msg.memory_before.CopyFrom(before)
    return msg


def answer_by_hand(c: ContextChange) -> planner_pb2.SizeContextResponse:
    """The answer built from new messages field by field."""
    profiles = [profile_change_by_hand(p) for p in c.profiles]
    verdict, note = convert.plan_verdict(profiles, "")
    change = common_pb2.ContextChange(
        model=c.model,
        before=c.before,
        after=c.after,
        max_output=c.max_output,
        trained=c.trained,
        note=c.note,
        profiles=profiles,
        verdict=verdict,
        verdict_note=note,
    )
    batches = [
        planner_pb2.BatchFit(
            profile=b.profile,
            engine=b.engine,
            sequences=b.sequences,
            tokens=b.tokens,
            fits=b.fits,
            contexts_held=b.contexts_held,
            flag=b.flag,
        )
        for b in c.batches
    ]
    return planner_pb2.SizeContextResponse(
        change=change,
        profiles=[common_pb2.Profile(**scalars_to_proto(p)) for p in c.updated],
        llamacpp_version=LLAMACPP_VERSION,
        batches=batches,
    )


def test_answers_equal_answers_built_field_by_field() -> None:
    """Over contexts asked in turn of two models (so kept profiles as they stand are reused,
    and interleaved), with and without a batch asked, the planner's answer is the message
    built field by field, byte for byte."""
    shape = replace(LLAMA_31_8B, trained_context=0)
    seen = 0
    for tokens in (4096, 16384, 2048, 16384, 40_000, 100_000, 4096):
        for model in models():
            for sequences in (0, 8):
                change = size_context(
                    model, shape, tokens=tokens, slots=0, inventory=H100, sequences=sequences
                )
                built = convert.size_answer(change, "", LLAMACPP_VERSION)
                expected = answer_by_hand(change)
                assert built == expected, (model.name, tokens, sequences)
                assert built.SerializeToString(deterministic=True) == expected.SerializeToString(
                    deterministic=True
                )
                seen += len(built.batches)
    assert seen > 0  # the batches were answered too
