"""A context sizing compiled once per model, shape and inventory answers every context exactly
as the full sizing does: the same answer, byte for byte, or no answer (then the full sizing
refuses or notes)."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from llmgw.cardclass import MIB
from llmgw.common.v1 import common_pb2
from llmgw.engines.llamacpp import LLAMACPP_VERSION
from llmgw.model import Inventory, Model, Node, Profile
from llmgw.planner.v1 import planner_pb2
from llmgw.shape import Layer, LayerKind, ModelShape
from planner_svc.domain import errors
from planner_svc.domain.context import size_context
from planner_svc.domain.context_plan import ContextPlan, compile_context
from planner_svc.rpc import convert
from planner_svc.rpc.fresh import FreshPlans
from planner_svc.rpc.servicer import PlannerServicer
from tests.support.shapes import LLAMA_31_8B, LLAMA_31_70B, QWEN25_7B, llama_8b_model

H100 = Inventory(
    nodes=(Node("n1", "H100-80GB", gpus=8, free_gpus=8, gpu_memory_bytes=81559 * MIB),)
)
H100_REPORTING = Inventory(
    nodes=(
        Node(
            "n1",
            "H100-80GB",
            gpus=8,
            free_gpus=8,
            gpu_memory_bytes=81559 * MIB,
            engine_versions=(("sglang", "0.4.6"), ("vllm", "0.10.1")),
        ),
    )
)

_SLIDING = Layer(LayerKind.SLIDING, kv_heads=8, head_dim_k=128, head_dim_v=128, window_tokens=4096)
_FULL = Layer(LayerKind.FULL, kv_heads=8, head_dim_k=128, head_dim_v=128)
SLIDING_SHAPE = ModelShape(
    architecture="gemma3",
    layers=(_SLIDING, _SLIDING, _SLIDING, _SLIDING, _SLIDING, _FULL) * 6,
    attention_heads=16,
    kv_heads=8,
    trained_context=131_072,
    weights_bytes=24_000_000_000,
)


def _model(*profiles: Profile, max_output: int = 0) -> Model:
    return Model(name="m", context_length=8192, max_output=max_output, profiles=profiles)


def _vllm(version: str = "", *extra: str, gpus: int = 1, name: str = "gpu") -> Profile:
    return Profile(
        name,
        "vllm",
        ("--max-model-len", "8192", *extra),
        gpu_class="H100-80GB",
        gpus_per_node=gpus,
        engine_version=version,
    )


CASES = [
    ("vllm, no version", LLAMA_31_8B, _model(_vllm()), H100),
    ("vllm 0.6.3 (V0)", LLAMA_31_8B, _model(_vllm("0.6.3")), H100),
    ("vllm 0.8.5", LLAMA_31_8B, _model(_vllm("0.8.5")), H100),
    ("vllm 0.11.0, tp 4", LLAMA_31_70B, _model(_vllm("0.11.0", gpus=4)), H100),
    ("vllm, no chunked prefill", QWEN25_7B, _model(_vllm("", "--no-enable-chunked-prefill")), H100),
    (
        "vllm, pp 2, fp8 cache",
        LLAMA_31_70B,
        _model(_vllm("", "-pp", "2", "--kv-cache-dtype", "fp8", gpus=4)),
        H100,
    ),
    (
        "vllm, joined flag",
        LLAMA_31_8B,
        _model(
            Profile(
                "gpu", "vllm", ("--max-model-len=8192",), gpu_class="H100-80GB", gpus_per_node=1
            )
        ),
        H100,
    ),
    ("vllm, version the nodes run", LLAMA_31_8B, _model(_vllm()), H100_REPORTING),
    ("vllm, sliding layers", SLIDING_SHAPE, _model(_vllm("0.10.1")), H100),
    (
        "sglang",
        LLAMA_31_8B,
        _model(
            Profile(
                "sg", "sglang", ("--context-length=8192",), gpu_class="H100-80GB", gpus_per_node=1
            )
        ),
        H100_REPORTING,
    ),
    (
        "trtllm, tp 4",
        LLAMA_31_70B,
        _model(
            Profile(
                "trt", "trtllm", ("--max_seq_len", "8192"), gpu_class="H100-80GB", gpus_per_node=4
            )
        ),
        H100,
    ),
    (
        "two profiles, max_output",
        QWEN25_7B,
        _model(_vllm(), _vllm("0.9.2", gpus=2, name="two"), max_output=1000),
        H100,
    ),
]

CONTEXTS = [
    256,
    257,
    1000,
    4095,
    4096,
    4097,
    8192,
    8193,
    12_345,
    16_384,
    30_000,
    32_768,
    32_769,
    50_001,
    100_000,
    131_072,
    131_073,
    1 << 24,
    (1 << 24) + 1,
]


def _full_answer(
    model: Model, shape: ModelShape, inventory: Inventory, tokens: int
) -> bytes | None:
    """The answer the full sizing gives (serialized), None when it refuses."""
    try:
        change = size_context(model, shape, tokens=tokens, slots=0, inventory=inventory)
    except (errors.PlannerError, errors.EngineError):
        return None
    return convert.size_answer(change, "", LLAMACPP_VERSION).SerializeToString(deterministic=True)


@pytest.mark.parametrize(("case", "shape", "model", "inventory"), CASES, ids=[c[0] for c in CASES])
def test_a_planned_context_is_answered_as_the_full_sizing_answers_it(
    case: str, shape: ModelShape, model: Model, inventory: Inventory
) -> None:
    """Every context the plan answers gets the full sizing's answer, byte for byte, and every
    context it leaves (refused, or fitting only within the margin) is the full sizing's."""
    plans = FreshPlans(LLAMACPP_VERSION)
    key = ("k", case)
    assert (
        plans.answer(key, model, shape, inventory, tokens=256, slots=0, sequences=0, note="")
        is None
    )
    answered = 0
    for tokens in CONTEXTS:
        planned = plans.answer(
            key, model, shape, inventory, tokens=tokens, slots=0, sequences=0, note=""
        )
        full = _full_answer(model, shape, inventory, tokens)
        if planned is None:
            continue
        answer, change = planned
        assert full is not None, f"{case}: the plan answered {tokens}, which is refused"
        assert answer.SerializeToString(deterministic=True) == full, f"{case}: {tokens} tokens"
        assert change == size_context(model, shape, tokens=tokens, slots=0, inventory=inventory)
        answered += 1
    assert answered >= 5, f"{case}: the plan answered only {answered} contexts"


def test_a_plan_answers_every_context_of_a_dense_model_exactly() -> None:
    """A sweep of contexts (every 61st up to the trained one) of one cached shape: the plan's
    change is the full sizing's each time."""
    model = _model(_vllm())
    plan = compile_context(model, LLAMA_31_8B, H100, slots=0)
    assert plan is not None
    for tokens in range(256, 131_073, 61):
        change = plan.change(tokens)
        assert change == size_context(model, LLAMA_31_8B, tokens=tokens, slots=0, inventory=H100)


@pytest.mark.parametrize(
    ("model", "shape", "sequences"),
    [
        (_model(Profile("cpu", "llamacpp", ("--ctx-size", "8192"), cpu_only=True)), LLAMA_31_8B, 0),
        (
            _model(Profile("l", "llamacpp", ("--ctx-size", "8192"), gpu_class="H100-80GB")),
            LLAMA_31_8B,
            0,
        ),
        (_model(_vllm()), None, 0),
        (_model(_vllm()), LLAMA_31_8B, 4),
        (
            _model(Profile("gpu", "vllm", ("--max-model-len", "8192"), gpu_class="X-1")),
            LLAMA_31_8B,
            0,
        ),
    ],
    ids=["cpu profile", "llama.cpp", "no shape", "a batch asked", "card of unknown size"],
)
def test_no_plan_is_made_where_the_full_sizing_must_answer(
    model: Model, shape: ModelShape | None, sequences: int
) -> None:
    """CPU and llama.cpp profiles, an unread shape, a batch and an unknown card get no plan."""
    assert compile_context(model, shape, H100, slots=0, sequences=sequences) is None


def test_a_plan_declines_what_does_not_fit() -> None:
    """A context whose cards do not hold it is left to the full sizing, which refuses it."""
    model = _model(_vllm("0.11.0"))
    plan = compile_context(model, LLAMA_31_70B, H100, slots=0)
    assert plan is not None
    assert plan.change(8192) is None
    with pytest.raises(errors.CardsTooSmall):
        size_context(model, LLAMA_31_70B, tokens=8192, slots=0, inventory=H100)


def test_plans_are_kept_bounded_and_compiled_on_a_second_sight() -> None:
    """A key seen once costs only a look-up; the least recently used keys go past the bound."""
    plans = FreshPlans(LLAMACPP_VERSION, limit=2)
    model = _model(_vllm())
    for i in range(3):
        assert (
            plans.answer(i, model, LLAMA_31_8B, H100, tokens=1000, slots=0, sequences=0, note="")
            is None
        )
    assert len(plans) == 2
    assert (
        plans.answer(2, model, LLAMA_31_8B, H100, tokens=1000, slots=0, sequences=0, note="")
        is not None
    )
    assert (
        plans.answer(None, model, LLAMA_31_8B, H100, tokens=1000, slots=0, sequences=0, note="")
        is None
    )


class _Context:
    """The little of a servicer context the SizeContext path reads."""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


class _NoResolver:
    """A resolver that is never asked (the shape comes inline)."""

    async def resolve(self, source: str, files: object = (), *, caller: object = "") -> ModelShape:
        raise AssertionError("an inline shape is not resolved")


async def test_the_servicer_answers_fresh_contexts_from_plans_as_without_them() -> None:
    """Fresh contexts of a model asked before come from its plan, byte-equal to a servicer
    that sizes every context the full way, and each still writes its `context_sized` line."""
    inventory = common_pb2.Inventory(
        nodes=[
            common_pb2.InventoryNode(
                name="n1", gpu_class="H100-80GB", gpus=8, free_gpus=8, gpu_memory_bytes=81559 * MIB
            )
        ]
    )
    request = planner_pb2.SizeContextRequest(model=llama_8b_model(), inventory=inventory)
    planned = PlannerServicer(_NoResolver())
    full = PlannerServicer(_NoResolver())
    full._fresh = FreshPlans(LLAMACPP_VERSION, limit=0)  # keeps nothing: every context sized
    with capture_logs() as logs:
        for tokens in (4096, 5000, 12_345, 40_000, 100_000, 131_072):
            request.tokens = tokens
            a = await planned.SizeContext(request, _Context())  # type: ignore[arg-type]
            b = await full.SizeContext(request, _Context())  # type: ignore[arg-type]
            assert a.SerializeToString(deterministic=True) == b.SerializeToString(
                deterministic=True
            )
    sized = [e["after"] for e in logs if e["event"] == "context_sized"]
    assert sized.count(100_000) == 2 and len(sized) == 12
    assert len(planned._fresh) == 1
    assert isinstance(next(iter(planned._fresh._kept.values()))[0], ContextPlan)
