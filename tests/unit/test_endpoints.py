"""What an endpoint tells a gateway (context, slots, dialect, weight), and why one leaves."""

from __future__ import annotations

import pytest

from fleet_svc.domain.endpoints import (
    CARD_WEIGHT,
    CPU_WEIGHT,
    EndpointReason,
    endpoint_of,
    removal_reason,
    routable,
)
from fleet_svc.domain.nodes import NodePhase
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.replicas import ReplicaState, RunSpec
from llmgw.model import Model

P = ReplicaPhase
N = NodePhase
R = EndpointReason


def replica(
    engine: str = "vllm",
    args: tuple[str, ...] = (),
    phase: ReplicaPhase = P.READY,
    gpus: tuple[int, ...] = (0,),
    address: str = "10.0.0.1:8000",
) -> ReplicaState:
    """A replica of model m, profile p, revision 3 on node n1."""
    return ReplicaState(
        id="r-1",
        model="m",
        profile="p",
        revision=3,
        spec=RunSpec(engine=engine, args=args),
        phase=phase,
        node="n1",
        gpus=gpus,
        address=address,
        since_s=1_700_000_000.0,
    )


MODEL = Model(name="m", context_length=32768, max_output=4096)


@pytest.mark.parametrize(
    ("engine", "args", "gpus", "want"),
    [
        # (context tokens, slots, dialect, cards, weight)
        ("vllm", ("--max-model-len", "16384", "-tp", "2"), (0, 1), (16384, 1, "openai", 2, 200)),
        ("sglang", ("--context-length=8192",), (3,), (8192, 1, "openai", 1, 100)),
        ("llamacpp", ("-c", "16384", "-np", "4"), (0,), (4096, 4, "llamacpp", 1, 100)),
        ("llama.cpp", ("--ctx-size", "8192"), (), (8192, 1, "llamacpp", 0, CPU_WEIGHT)),
        ("tei", (), (0,), (32768, 1, "tei", 1, CARD_WEIGHT)),
        ("vllm", (), (0,), (32768, 1, "openai", 1, 100)),
        ("my-engine", ("--whatever", "1"), (0,), (32768, 1, "", 1, 100)),
    ],
)
def test_endpoint_reads_context_and_slots_through_its_engine(
    engine: str, args: tuple[str, ...], gpus: tuple[int, ...], want: tuple[object, ...]
) -> None:
    """The context and slots come from the replica's own arguments as its engine reads them
    (llama.cpp's --ctx-size shared by --parallel slots), the model's context where they say
    none; the dialect from the engine; the weight from the cards."""
    e = endpoint_of(replica(engine, args, gpus=gpus), model=MODEL, gpu_class="H100-80GB")
    assert (e.context_tokens, e.slots, e.api_dialect, e.cards, e.weight) == want
    assert e.max_output == 4096 and e.revision == 3 and e.ready_since_s == 1_700_000_000.0
    assert e.gpu_class == ("H100-80GB" if gpus else "")


def test_endpoint_without_its_revision_says_no_max_output() -> None:
    """A revision the catalog no longer holds leaves max_output 0 and the args' context."""
    e = endpoint_of(replica(args=("--max-model-len", "4096")), model=None, gpu_class="")
    assert (e.context_tokens, e.max_output) == (4096, 0)


@pytest.mark.parametrize(
    ("phase", "node", "address", "want"),
    [
        (P.READY, N.READY, "a:1", True),
        (P.READY, N.NOT_READY, "a:1", False),
        (P.READY, N.LOST, "a:1", False),
        (P.READY, None, "a:1", False),
        (P.READY, N.READY, "", False),
        (P.STARTING, N.READY, "a:1", False),
        (P.DRAINING, N.READY, "a:1", False),
        (P.CRASHED, N.READY, "a:1", False),
    ],
)
def test_routable_needs_a_ready_replica_with_an_address_on_a_ready_node(
    phase: ReplicaPhase, node: NodePhase | None, address: str, want: bool
) -> None:
    """Only READY replicas with an address on a READY node are routed to."""
    assert routable(replica(phase=phase, address=address), node) is want


@pytest.mark.parametrize(
    ("phase", "node", "wanted", "want"),
    [
        (P.DRAINING, N.READY, True, R.DRAINING),
        (P.STOPPING, N.READY, True, R.DRAINING),
        (P.DRAINING, N.READY, False, R.DELETED),
        (P.CRASHED, N.READY, True, R.FAILED),
        (P.FAILED, N.READY, False, R.FAILED),
        (P.READY, N.NOT_READY, True, R.NODE_NOT_READY),
        (P.READY, None, True, R.NODE_NOT_READY),
        (P.LOST, N.LOST, True, R.NODE_LOST),
        (P.READY, N.LOST, True, R.NODE_LOST),
        (None, N.READY, False, R.DELETED),
        (None, N.READY, True, R.DRAINING),
    ],
)
def test_removal_reason(
    phase: ReplicaPhase | None, node: NodePhase | None, wanted: bool, want: EndpointReason
) -> None:
    """Each way out of routing has its own reason: a lost node over a crash, a crash over a
    quiet node, a deleted model over a drain."""
    r = None if phase is None else replica(phase=phase)
    assert removal_reason(r, node, wanted=wanted) is want
